"""One job of `bench/endpoint_restart.py`: an unmodified `kernels` loading one kernel through
`HF_ENDPOINT`, run by the venv's python (only `kernels`, what pip resolved for it, and torch).

Imports first (torch and `kernels` take seconds on a busy machine, and the figure is about the
load, not the import), then waits for its start time if one is given (`go`: a file holding the
round's start, `at`: seconds after it), loads, checks one op against PyTorch and prints one JSON
line: whether it loaded, the exception's type and text as the job sees them, and when.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

ARGS = json.loads(sys.argv[1])
os.environ["HF_HOME"] = ARGS["hf_home"]
if ARGS.get("offline"):
    os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
from kernels import get_kernel  # noqa: E402

print("ready", flush=True)
if "go" in ARGS:
    while not os.path.exists(ARGS["go"]):
        time.sleep(0.005)
    with open(ARGS["go"]) as f:
        start = float(f.read()) + ARGS["at"]
    time.sleep(max(0.0, start - time.time()))
began = time.time()
out: dict[str, object] = {"began": began}
try:
    act = get_kernel(ARGS["repo"], version=1)
    x = torch.randn(4, 16)
    expect = torch.nn.functional.silu(x[:, :8]) * x[:, 8:]
    out["ok"] = bool(torch.allclose(act.silu_and_mul_alloc(x), expect, atol=1e-5))
except Exception as exc:  # what the job sees: its type and text
    out["ok"] = False
    out["error_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
    out["error"] = str(exc)
    chain = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(chain) < 4:
        chain.append(f"{type(cause).__qualname__}: {str(cause)[:200]}")
        cause = cause.__cause__ or cause.__context__
    out["causes"] = chain
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exc()
out["ended"] = time.time()
print(json.dumps(out), flush=True)
