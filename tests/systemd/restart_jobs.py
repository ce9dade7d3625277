"""Jobs for tests/systemd/test_store_ops.py's restarts under load, run in the container as a
kerneld-users member by the route's own python (no import of this repository).

    python restart_jobs.py '{"route": "native"|"endpoint", "repo": ..., "go": FILE,
                             "at": [seconds, ...], "work": DIR}'

Imports torch (and, for the endpoint route, `kernels`) once, then forks one job per `at` offset;
each job, a fresh process, imports what its load will use (so its load is the request, not
seconds of imports on a busy machine) and says it is ready; then "ready" is printed. The jobs
wait for the go file (it holds a CLOCK_MONOTONIC time, the clock of systemd's
`...TimestampMonotonic`: one kernel, no time namespace) and start their load `at` seconds
after it: the kernel loaded the route's way, one op checked against PyTorch, and when the load
began and ended (monotonic seconds), what it loaded, or its exception:

- native: `kerneld_client.get_kernel` with the environment the test gives (`KERNELD_REQUIRE=1`:
  a fallback to PyTorch is an error; `KERNELD_REF_MAX_AGE=0`: the daemon is asked every time);
- endpoint: an unmodified `kernels.get_kernel` through `HF_ENDPOINT` (the daemon's Hub API),
  with an empty HF cache of its own, so every job downloads from the endpoint.

One JSON line per job on stdout, then "done".
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

ARGS = json.loads(sys.argv[1])
ROUTE = ARGS["route"]

import torch  # noqa: E402

if ROUTE == "endpoint":
    import kernels  # noqa: F401
else:
    import kerneld_client  # noqa: F401


def load(index: int) -> dict[str, object]:
    """One job's load, in the forked child."""
    x = torch.randn(4, 16)
    expect = torch.nn.functional.silu(x[:, :8]) * x[:, 8:]
    if ROUTE == "endpoint":
        os.environ["HF_HOME"] = os.path.join(ARGS["work"], f"hf-{os.getpid()}-{index}")
        from kernels import get_kernel

        act = get_kernel(ARGS["repo"], version=1)
        loaded: list[list[str]] = [[ARGS["repo"], "endpoint"]]
    else:
        from kerneld_client import get_kernel as kd_get_kernel
        from kerneld_client import loaded_kernels

        act = kd_get_kernel(ARGS["repo"], version=1)
        loaded = [[k.repo_id, k.source] for k in loaded_kernels()]
    ok = bool(torch.allclose(act.silu_and_mul_alloc(x), expect, atol=1e-5))
    return {"ok": ok, "loaded": loaded}


def prepare() -> None:
    """Import what the load uses (the client's RPC path, gRPC), after the fork."""
    if ROUTE == "native":
        for name in (
            "grpc",
            "kerneld_client._rpc",
            "kerneld_client.loader",
            "kerneld_client.loading",
        ):
            importlib.import_module(name)


def child(index: int, at: float, ready: int, write: int) -> None:
    prepare()
    os.write(ready, b".")
    os.close(ready)
    while not os.path.exists(ARGS["go"]):
        time.sleep(0.005)
    with open(ARGS["go"]) as f:
        start = float(f.read()) + at
    time.sleep(max(0.0, start - time.monotonic()))
    out: dict[str, object] = {"route": ROUTE, "index": index, "began": time.monotonic()}
    try:
        out.update(load(index))
    except BaseException as exc:  # what the job sees: its type and text
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:1000])
    out["ended"] = time.monotonic()
    os.write(write, (json.dumps(out) + "\n").encode())
    os._exit(0)


def main() -> None:
    ready_read, ready_write = os.pipe()
    read, write = os.pipe()
    pids = []
    for index, at in enumerate(ARGS["at"]):
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                os.close(ready_read)
                child(index, at, ready_write, write)
            finally:
                os._exit(1)  # never back into the parent's loop
        pids.append(pid)
    os.close(write)
    os.close(ready_write)
    with os.fdopen(ready_read, "rb") as readiness:  # one byte per job, then EOF
        count = len(readiness.read())
    print("ready" if count == len(pids) else f"only {count} of {len(pids)} ready", flush=True)
    with os.fdopen(read) as lines:
        for line in lines:
            sys.stdout.write(line)
    for pid in pids:
        os.waitpid(pid, 0)
    print("done", flush=True)


main()
