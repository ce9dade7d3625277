"""The warm path's size budget (issue 56): what a warm `get_kernel` makes a fresh process import.

Import time is the warm path's largest cost and it grows one module at a time, each too small for
a timed bench to notice on a noisy machine. This test counts instead: the `kerneld_client`
modules a warm load leaves in `sys.modules` and their source lines, against a budget. Both are
deterministic, so a change that adds an import to the warm path fails here, not months later in
a bench table. Lower the budget when the path gets slimmer; raise it only with a bench run that
shows the cost (bench/RESULTS.md, scenario 1). The cold load, on the RPC path, must build the
messages of a Resolve only (`resolve_pb2`), not the whole API's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.client.support import ACTIVATION, IN_CHILD, OPS_CHECK, client_env, run_client
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

#: kerneld_client modules (packages count as their __init__) a warm load may import ...
MAX_MODULES = 5
#: ... and their source lines in all. 28 modules / 4,981 lines before the warm fast path (issue
#: 56); with it, 5 / 1,634 (the package, `_warm`, `_warm_trust`, `_loads`, `vocabulary`), the
#: budget that plus a small margin: its A/B against 114d82e is in bench/RESULTS.md, scenario 1.
#: Then 1,680 lines, 6 more for the miss's coalesced turn (`_coalesce.warm_turn`, issue 56:
#: lines that run on a miss only; a warm hit reads them from the same cached bytecode) and 15
#: in `_loads` for what `dataclasses` reads on LoadedKernel (issue 53: one small descriptor
#: class; the dataclass it answers from is built in `repo_info`, off the warm path).
#: Then 1,677: the machine and device names moved from `vocabulary` to `device_names` (55
#: lines, 3.7 KB of bytecode the warm path never ran), 31 lines of `_pure` (no pathlib in the
#: store root's check). Merging `_warm_trust` into `_warm` would save a module's own import
#: (~0.1 ms of CPU, 181 function calls: bench/warm_counts.py) but passes the 600-line limit.
#: Then 1,690: `_warm_trust.read_file` (13 lines) reads /etc/passwd and metadata.json in 9
#: fewer system calls than `open().read()` (the first warm call: 119 instead of 128).
MAX_LINES = 1_695

SCRIPT = (
    "import json, sys\n"
    + OPS_CHECK
    + IN_CHILD
    + f"""
import kerneld_client
m = kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
check_activation(m, 1)
mods = {{}}
for name, mod in sorted(sys.modules.items()):
    if name == "kerneld_client" or name.startswith("kerneld_client."):
        path = getattr(mod, "__file__", None)
        if path:
            with open(path, encoding="utf-8") as f:
                mods[name] = sum(1 for _ in f)
stubs = sorted(m for m in sys.modules if m.startswith("kerneld_client.proto."))
print(json.dumps({{"source": kerneld_client.loaded_kernels()[0].source,
                  "grpc": "grpc" in sys.modules, "modules": mods, "stubs": stubs}}))
"""
)


def test_a_warm_load_stays_within_its_import_budget(
    make_daemon: Callable[..., DaemonProcess], example_server: HubServer, tmp_path: Path
) -> None:
    example_server.reset()
    daemon = make_daemon(hub_endpoint=example_server.url)
    env = client_env(None, tmp_path, KERNELD_SOCKET=str(daemon.user_socket))
    cold = run_client(SCRIPT, env)  # the daemon fetches and publishes the pick
    # The RPC path builds the messages of a Resolve only (resolve.proto), not the whole API's.
    assert cold["grpc"] is True, "not the RPC path"
    assert cold["stubs"] == ["kerneld_client.proto.resolve_pb2"], cold["stubs"]

    warm = run_client(SCRIPT, env)
    assert warm["source"] == "index" and warm["grpc"] is False, "not the warm path"
    modules: dict[str, int] = warm["modules"]
    lines = sum(modules.values())
    listing = "\n".join(f"  {n:>5}  {m}" for m, n in sorted(modules.items(), key=lambda i: -i[1]))
    assert len(modules) <= MAX_MODULES and lines <= MAX_LINES, (
        f"the warm path imports {len(modules)} kerneld_client modules, {lines} lines "
        f"(budget: {MAX_MODULES} modules, {MAX_LINES} lines):\n{listing}\n"
        "keep new imports off the warm path (import them where they are used), or measure the "
        "cost (python -m bench.run --only s1) and raise the budget with the figures"
    )
