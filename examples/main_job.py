"""The main job (`make run`): kerneld doing its job on this machine, start to finish.

1. build the example kernels (C++ CPU ops + noarch variants; cached by source hash) and publish
   them as a static kerneld mirror;
2. check whether kerneld's default upstream, the Hugging Face Hub, answers from here, and serve
   the example mirror over HTTP on loopback instead (this script counts every request it gets);
3. start the real `kerneld` in user mode (store, sockets and caches in a temporary directory);
4. `kerneldctl prefetch` one kernel, as an administrator would;
5. run `examples/train.py` (kernelize a small model, train a few SGD steps) in a fresh process;
   it also uses a kernel that was not prefetched, which the daemon fetches on demand;
6. run it again in a second process: the warm path (timed, and the mirror sees no request);
7. run `examples/attention.py`: the attention example kernel (flash-attn's interface) through
   `kerneld_client.get_kernel`, fetched on demand, against PyTorch's
   `scaled_dot_product_attention` (the largest difference printed);
8. `kerneldctl status`;
9. stop the daemon (SIGTERM) and run the script a third time: every layer falls back to PyTorch,
   training runs anyway, with the same losses.

Every figure printed is measured in this run. The script checks its own claims and exits 1 if one
does not hold; the daemon is stopped on every path out (no stray process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAIN = Path("examples") / "train.py"
ATTENTION = Path("examples") / "attention.py"
PREFETCHED = "kerneld-examples/activation:1"
INDENT = "   "


class DemoError(RuntimeError):
    """A step failed; the message says which and carries the tool's output."""


# ---------------------------------------------------------------------------- upstreams


def probe_hub(timeout: float = 2.0) -> tuple[bool, str]:
    """Does kerneld's default upstream answer from here? (One HEAD request, bounded in time.)"""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    outcome: dict[str, str] = {}

    def attempt() -> None:
        try:
            request = urllib.request.Request(endpoint, method="HEAD")
            with urllib.request.urlopen(request, timeout=timeout) as response:
                outcome["ok"] = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:  # it answered, even if with an error status
            outcome["ok"] = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            outcome["error"] = str(reason) or type(reason).__name__

    thread = threading.Thread(target=attempt, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)  # name resolution has no timeout of its own
    host = endpoint.split("//", 1)[-1].rstrip("/")
    if "ok" in outcome:
        return True, f"{host} answered ({outcome['ok']})"
    return False, f"{host}: {outcome.get('error', f'no answer within {timeout:g} s')}"


class _CountingHandler(SimpleHTTPRequestHandler):
    """Static files, plus a request counter; silent (the demo prints its own lines)."""

    counter: list[int]
    lock: threading.Lock

    def send_head(self) -> Any:
        with self.lock:
            self.counter[0] += 1
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MirrorServer:
    """Serves a mirror directory on 127.0.0.1 (a `mirror-http` upstream) and counts requests:
    the honest answer to "did this step touch the upstream?"."""

    def __init__(self, root: Path) -> None:
        counter = [0]
        handler = type(
            "MirrorHandler",
            (_CountingHandler,),
            {"counter": counter, "lock": threading.Lock()},
        )

        def make(*args: Any) -> SimpleHTTPRequestHandler:
            made: SimpleHTTPRequestHandler = handler(*args, directory=str(root))
            return made

        self._counter = counter
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), make)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"

    @property
    def requests(self) -> int:
        return self._counter[0]

    def __enter__(self) -> MirrorServer:
        threading.Thread(target=self._server.serve_forever, name="mirror", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


# ---------------------------------------------------------------------------- processes


def _tool(name: str, module: str) -> list[str]:
    """The installed console script beside this interpreter (the real binary), else `-m`."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


def child_env(demo: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """This environment minus anything that would steer kerneld elsewhere; caches in `demo`."""
    drop = ("KERNELD_", "HF_", "NOTIFY_SOCKET", "WATCHDOG_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    no_proxy = ",".join(filter(None, [env.get("no_proxy", ""), "127.0.0.1", "localhost"]))
    env.update(
        PYTHONUNBUFFERED="1",
        XDG_CACHE_HOME=str(demo / "cache"),
        XDG_CONFIG_HOME=str(demo / "config"),
        HF_HOME=str(demo / "hf-home"),
        no_proxy=no_proxy,
        NO_PROXY=no_proxy,
    )
    env.update(extra)
    return env


def wait_ready(proc: subprocess.Popen[bytes], socket: Path, log: Path, timeout: float) -> None:
    """Readiness as a supervisor probes it: the gRPC health service says SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoError(f"kerneld exited with {proc.returncode}:\n{_tail(log)}")
        if socket.exists():
            with grpc.insecure_channel(f"unix:{socket}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                try:
                    reply = stub.Check(
                        health_pb2.HealthCheckRequest(service="kerneld.v1.Kernels"), timeout=1.0
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
        time.sleep(0.03)
    raise DemoError(f"kerneld not ready within {timeout:g} s:\n{_tail(log)}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Ran:
    """One finished command: its output and how long it took."""

    out: str
    seconds: float
    requests: int


def run(
    cmd: Sequence[str], env: Mapping[str, str], server: MirrorServer, timeout: float = 300
) -> Ran:
    before = server.requests
    t = time.perf_counter()
    done = subprocess.run(
        list(cmd),
        cwd=ROOT,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        raise DemoError(f"`{' '.join(cmd)}` exited with {done.returncode}:\n{done.stdout}")
    return Ran(done.stdout.rstrip("\n"), seconds, server.requests - before)


@contextmanager
def kerneld(
    cmd: Sequence[str], env: Mapping[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon as a subprocess; whatever happens, it is gone when the block ends."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd), cwd=ROOT, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


# ---------------------------------------------------------------------------- output


def show(text: str, *, skip: int = 0) -> None:
    for line in text.splitlines()[skip:]:
        print(INDENT + line)


def show_training(ran: Ran) -> None:
    """train.py's own output; of its fallback warnings (one per layer name) the first only."""
    warnings = [line for line in ran.out.splitlines() if line.startswith("WARNING ")]
    rest = [line for line in ran.out.splitlines() if not line.startswith("WARNING ")]
    if warnings:
        print(INDENT + warnings[0])
        if len(warnings) > 1:
            print(INDENT + f"(+{len(warnings) - 1} more such warnings, one per layer name)")
    show("\n".join(rest))


def read_summary(path: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return summary


# ---------------------------------------------------------------------------- the job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the demo directory")
    parser.add_argument("--steps", type=int, default=20, help="SGD steps per training run")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()

    from examples.kernels.build import build_examples
    from examples.mirror import build_example_mirror

    print("kerneld: one daemon per host fetches, verifies and caches PyTorch kernels;")
    print("training processes ask it where their build is and import it, or fall back to PyTorch.")
    built = build_examples()
    how = "cached" if built.cache_hit else f"compiled in {built.cold_build_seconds:.0f} s"
    mirror = build_example_mirror(built=built)
    print(
        f"1. example kernels built ({how}) for {built.arch_variant}; "
        f"published as a mirror of {len(mirror.repos)} repos"
    )

    reachable, detail = probe_hub()
    state = "answers" if reachable else "unreachable"
    print(f"2. Hugging Face Hub (kerneld's default upstream): {state} ({detail})")

    # Unix socket paths are limited to 107 bytes: keep the directory short.
    demo = Path(tempfile.mkdtemp(prefix="kerneld-demo-", dir="/tmp"))
    try:
        with MirrorServer(mirror.root) as server:
            why = "the example kernels are not on the Hub: " if reachable else ""
            print(
                f"{INDENT}-> {why}the daemon's upstream is the example mirror, served on "
                f"{server.url} by this script, which counts every request"
            )
            return _job(args, demo, server, t0)
    except DemoError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"(demo directory kept: {demo})")
        else:
            shutil.rmtree(demo, ignore_errors=True)


def _job(args: argparse.Namespace, demo: Path, server: MirrorServer, t0: float) -> int:
    store, user_socket, admin_socket = demo / "store", demo / "kerneld.sock", demo / "admin.sock"
    config = demo / "kerneld.toml"
    config.write_text(
        "# kerneld configuration of the demo (user mode; paths are set on the command line)\n"
        "[[upstream]]\n"
        'name = "examples-mirror"\n'
        'kind = "mirror-http"\n'
        f'url = "{server.url}"\n\n'
        "[prefetch]\n"
        "on_start = false  # the demo prefetches with kerneldctl, as an admin would\n\n"
        "[trust]\n"
        "# The site's own kernels: a mirror-only daemon cannot ask the Hub who publishes\n"
        "# trusted kernels, so the admin vouches for the examples' organisation.\n"
        'allow = ["kerneld-examples/*"]\n',
        encoding="utf-8",
    )
    env = child_env(
        demo, {"KERNELD_SOCKET": str(user_socket), "KERNELD_ADMIN_SOCKET": str(admin_socket)}
    )
    cmd = [
        *_tool("kerneld", "kerneld.server.main"),
        "--user",
        "--config",
        str(config),
        "--store",
        str(store),
        "--socket",
        str(user_socket),
        "--admin-socket",
        str(admin_socket),
    ]
    ctl = _tool("kerneldctl", "kerneld.ctl.main")
    train = [sys.executable, str(TRAIN), "--steps", str(args.steps)]
    summaries = [demo / f"train-{i}.json" for i in (1, 2, 3)]
    attention_summary = demo / "attention.json"
    log = demo / "kerneld.log"

    with kerneld(cmd, env, log) as proc:
        t = time.perf_counter()
        wait_ready(proc, user_socket, log, timeout=60)
        print(
            f"3. kerneld --user: ready in {time.perf_counter() - t:.2f} s "
            f"(pid {proc.pid}; store, sockets and config in {demo}/)"
        )

        ran = run([*ctl, "prefetch", PREFETCHED], env, server)
        print(f"4. $ kerneldctl prefetch {PREFETCHED}    ({_figures(ran)})")
        show(ran.out)

        first = run([*train, "--summary", str(summaries[0])], env, server)
        print(f"5. $ python {TRAIN}    (1st process; relu2 not prefetched: the daemon fetches it)")
        show_training(first)
        print(f"{INDENT}-> {_figures(first)}")

        warm = run([*train, "--summary", str(summaries[1])], env, server)
        print(f"6. $ python {TRAIN}    (2nd process: warm)")
        show_training(warm)
        print(f"{INDENT}-> {_figures(warm)}")

        attention = run(
            [sys.executable, str(ATTENTION), "--summary", str(attention_summary)], env, server
        )
        print(f"7. $ python {ATTENTION}    (not prefetched; {_figures(attention)})")
        show(attention.out)

        status = run([*ctl, "status"], env, server)
        print("8. $ kerneldctl status")
        show(status.out)

        code = stop(proc)
        print(
            f"9. daemon stopped (SIGTERM, exit code {code}; its socket and advert are gone); "
            f"$ python {TRAIN}"
        )
    fallback = run([*train, "--summary", str(summaries[2])], env, server)
    show_training(fallback)

    s1, s2, s3 = (read_summary(p) for p in summaries)
    attended = read_summary(attention_summary)
    drift = max(abs(a - b) for a, b in zip(s2["losses"], s3["losses"], strict=True))
    print(
        f"{INDENT}-> {_figures(fallback)}; losses match the kernel run's "
        f"(max difference {drift:.1e})"
    )

    checks = {
        "the first run kernelized layers": s1["kernelized"] > 0,
        "the warm run kernelized every layer": s2["kernelized"] == s2["layers"] > 0,
        "the warm run made no upstream request": warm.requests == 0,
        "the warm run loaded from the published index (no RPC)": all(
            k["source"] == "index" for k in s2["kernels"]
        ),
        "the attention kernel came from kerneld and matches sdpa": attended["source"]
        in ("index", "daemon")
        and max(attended["diffs"].values()) <= 1e-5,
        "the daemon stopped cleanly": code == 0,
        "the run without the daemon fell back to PyTorch": s3["kernelized"] == 0
        and set(s3["fallback_causes"]) == {"daemon-unavailable"},
        "training gave the same losses with and without kernels": drift < 1e-4,
    }
    failed = [name for name, ok in checks.items() if not ok]
    total = time.perf_counter() - t0
    if failed:
        print(f"FAILED after {total:.1f} s: " + "; ".join(f"not: {name}" for name in failed))
        return 1
    print(
        f"OK in {total:.1f} s: kernels in {s2['kernels_s'] * 1000:.1f} ms on a warm start "
        f"({s1['kernels_s'] * 1000:.1f} ms with an on-demand fetch) and 0 upstream requests; "
        "training unaffected without the daemon"
    )
    return 0


def _figures(ran: Ran) -> str:
    plural = "" if ran.requests == 1 else "s"
    return f"{ran.seconds:.2f} s wall, {ran.requests} upstream request{plural}"


if __name__ == "__main__":
    sys.exit(main())
