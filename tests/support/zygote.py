"""Fresh client processes without paying torch's import in each: a torch-loaded parent forks them.

The suite's client tests run each job in a new interpreter, and a job that imports torch spends
about 1.5 s of CPU on that import before it does anything kerneld does (2.3-2.5 s on a busy
machine, bench/SUITE.md): most of the suite's CPU, and two cores bound its wall time. Jobs on a
GPU node are often forked from a process that imported torch (DataLoader workers, a launcher that
forks ranks), and kerneld_client is tested there too (test_daemon's forked children). So a job
whose script imports torch before anything else (`torch_first`) is forked from a zygote: a
`python -c` of this interpreter, started with the worker's environment, that imported torch and
nothing of kerneld's, and forks one child per job. The child takes the job's environment,
working directory, stdio and `__main__` before it runs the script, and ends as an interpreter
ends (atexit, non-daemon threads joined, exit status from SystemExit or a traceback's 1), so a
test sees what a fresh `python -c` would have printed and returned. A script that does anything
before importing torch, or interpreter options, gets a fresh interpreter as before.

One zygote per pytest process, interpreter and start-up environment (the variables read while an
interpreter starts: PYTHONPATH, ..., and KERNELD_HOOK_KERNELS, which kerneld-client's start-up
hook reads then), started on first use and stopped at exit.
Its children are its own, so it reaps them and sends each one's wait status to whoever asked.
"""

from __future__ import annotations

import ast
import atexit
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Variables read when an interpreter starts or torch is imported, i.e. what a zygote's children
#: inherit from it rather than from their own environment: a job whose values differ from the
#: zygote's gets another zygote. Among them KERNELD_HOOK_KERNELS: kerneld_client_hook.pth reads
#: it while the interpreter starts and, when on, puts the finder that waits for `import kernels`
#: on sys.meta_path (integrations/_autohook.py); the hook reads nothing else before that import.
#: Everything else (KERNELD_*, HF_*, HOME, XDG_*, ...) the child takes from the job's environment
#: before any of its code runs.
FRESH_ENV = "KERNELD_TEST_FRESH_JOBS"
_STARTUP_PREFIXES = ("PYTHON", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA_", "LD_", "PYTORCH_")
_STARTUP_NAMES = ("KERNELD_HOOK_KERNELS",)

_SERVER = r"""
import sys
import torch  # the one import every child inherits
import array, json, os, selectors, signal, socket, types

def _serve(path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    waiting = {}  # pid -> the connection that asked for it
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in sel.select():
            if key.data == "accept":
                conn, _ = listener.accept()
                sel.register(conn, selectors.EVENT_READ, "request")
            elif key.data == "child":
                wake_r.recv(4096)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    conn = waiting.pop(pid, None)
                    if conn is not None:
                        try:  # the asker may be gone (it timed out and killed the child)
                            conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                        except OSError:
                            pass
                        conn.close()
            else:
                conn = key.fileobj
                sel.unregister(conn)
                fds = array.array("i")
                data, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
                for level, kind, payload in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                if not data or len(fds) != 3:
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                chunks = [data]
                while not data.endswith(b"\n"):
                    data = conn.recv(1 << 20)
                    if not data:
                        break
                    chunks.append(data)
                job = json.loads(b"".join(chunks))
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    wake_r.close()
                    wake_w.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    conn.close()
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                        os.close(fd)
                    return job
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                except OSError:
                    pass
                waiting[pid] = conn

def _child(job):
    argv = job["argv"]
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    sys.dont_write_bytecode = bool(job["env"].get("PYTHONDONTWRITEBYTECODE"))
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    import runpy
    if argv[0] == "-c":  # sys.path[0] stays "" (the working directory), as for `python -c`
        sys.argv[:] = ["-c", *argv[2:]]
        run = lambda: exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        sys.argv[:] = ["-m", *argv[2:]]
        sys.path[0] = os.getcwd()
        run = lambda: runpy._run_module_as_main(argv[1])
    else:
        sys.argv[:] = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
        run = lambda: runpy.run_path(argv[0], run_name="__main__")
    status = 0
    try:
        run()
    except SystemExit as exc:
        status = exc.code
    except BaseException as exc:
        tb = exc.__traceback__
        for _ in range(2):  # from the script's frame on: not this function's, not `run`'s
            if tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        status = 1
    # An interpreter's end as Py_FinalizeEx begins it: non-daemon threads joined, atexit
    # callbacks, stdio flushed; then out, without tearing torch's modules down one by one
    # (0.4-0.7 s that no job observes).
    import atexit, threading
    threading._shutdown()
    atexit._run_exitfuncs()
    if status is not None and not isinstance(status, int):
        print(status, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status or 0)

_job = _serve(sys.argv[1])
del _serve
_child(_job)
"""


def torch_first(source: str) -> bool:
    """Whether the script's first statement that is not a standard-library import imports
    torch: then a child forked after `import torch` runs it as a fresh interpreter would (the
    standard-library modules it imported before have no say in how torch loads)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        if isinstance(stmt, ast.Import):
            names = [alias.name for alias in stmt.names]
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            names = [stmt.module]
        else:
            return False
        tops = {name.split(".", 1)[0] for name in names}
        if "torch" in tops:
            return True
        if not tops <= sys.stdlib_module_names:
            return False
    return False


def _source(argv: Sequence[str], cwd: Path) -> str | None:
    """The script `python *argv` runs: `-c` code, a `-m` module's file, or a path's."""
    if argv[0] == "-c":
        return argv[1]
    if argv[0] == "-m":
        spec = importlib.util.find_spec(argv[1])
        origin = spec.origin if spec is not None else None
    else:
        origin = str(cwd / argv[0])
    try:
        return Path(origin).read_text(encoding="utf-8") if origin else None
    except OSError:
        return None


def forkable(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> bool:
    """Whether `python *argv` may run in a zygote's child: the script imports torch first, this
    interpreter has no user site (a venv: HOME does not move sys.path), and the suite was not
    told to start every job fresh (KERNELD_TEST_FRESH_JOBS=1)."""
    import site

    if os.environ.get(FRESH_ENV, "").strip() not in ("", "0") or not argv:
        return False
    if site.ENABLE_USER_SITE or not hasattr(socket, "send_fds"):
        return False
    if argv[0].startswith("-") and (argv[0] not in ("-c", "-m") or len(argv) < 2):
        return False  # interpreter options: a fresh interpreter honours them
    source = _source(argv, cwd)
    return source is not None and torch_first(source)


def _startup_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (k, v) for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES
        )
    )


class Zygote:
    """A running zygote of one interpreter: `run` forks it into one job."""

    def __init__(self, python: str, env: Mapping[str, str], folder: Path) -> None:
        self.socket_path = str(folder / "zygote.sock")
        self.proc = subprocess.Popen(
            [python, "-c", _SERVER, self.socket_path],
            env=dict(env),
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the zygote of {python} did not start (exit {self.proc.wait()})")

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Fork one child that runs as `python *argv` would; its output and exit status."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        job = {"argv": list(argv), "env": dict(env), "cwd": str(cwd)}
        try:
            conn.connect(self.socket_path)
            socket.send_fds(conn, [json.dumps(job).encode() + b"\n"], [null, out_w, err_w])
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        replies = conn.makefile("rb")
        pid = json.loads(replies.readline())["pid"]
        outputs: dict[int, bytes] = {}
        readers = [
            threading.Thread(target=_drain, args=(fd, outputs), daemon=True)
            for fd in (out_r, err_r)
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + timeout
        conn.settimeout(max(timeout, 0.001))
        try:
            status = json.loads(replies.readline())["status"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(["<zygote>", *argv], timeout) from None
        finally:
            replies.close()
            conn.close()
        for reader in readers:
            reader.join(max(deadline - time.monotonic(), 1.0))
        return subprocess.CompletedProcess(
            ["<zygote>", *argv],
            os.waitstatus_to_exitcode(status),
            outputs.get(out_r, b"").decode(errors="replace"),
            outputs.get(err_r, b"").decode(errors="replace"),
        )

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(Path(self.socket_path).parent, ignore_errors=True)


def _drain(fd: int, outputs: dict[int, bytes]) -> None:
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    outputs[fd] = b"".join(chunks)


_zygotes: dict[tuple[str, tuple[tuple[str, str], ...]], Zygote] = {}
_lock = threading.Lock()


def run_python(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float,
    python: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python *argv` (this interpreter unless `python`), its output captured as text, as
    `subprocess.run(..., capture_output=True, text=True, timeout=timeout)` gives it: in a child
    of that interpreter's zygote for `env`'s start-up variables where the job is `forkable`
    (the zygote started on first use, with a private folder for its socket), else fresh."""
    exe = str(python or sys.executable)
    if not forkable(argv, env, cwd):
        return subprocess.run(
            [exe, *argv],
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    key = (exe, _startup_env(env))
    with _lock:
        zygote = _zygotes.get(key)
        if zygote is None or zygote.proc.poll() is not None:
            folder = Path(tempfile.mkdtemp(prefix="kd-zygote-"))
            zygote = _zygotes[key] = Zygote(exe, env, folder)
    return zygote.run(argv, env, cwd, timeout)


@atexit.register
def _stop_all() -> None:
    for zygote in _zygotes.values():
        zygote.stop()
