"""The daemon publishes, per commit, the variant each platform its clients showed loads
(`picks`), so warm loads look their fingerprint up instead of ranking variants."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneld_client.variants import fingerprint
from kerneld_client.wire import facts_from_proto
from tests.daemon import fakehosts
from tests.daemon.rpc import TIMEOUT, facts, resolve_req
from tests.fixtures_daemon import ACT, C1, MULTI
from tests.support.daemon import DaemonProcess, wait_until


def _picks(d: DaemonProcess, repo: str, commit: str) -> dict[str, Any]:
    org, name = repo.split("/")
    path = d.store_root / "index" / "v1" / org / f"{name}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    picks: dict[str, Any] = doc.get("commits", {}).get(commit, {}).get("picks", {})
    return picks


def test_every_platform_a_client_showed_gets_its_pick_and_keeps_it_across_a_restart(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], hardware_root=fakehosts.cpu_only(tmp_path / "h"))
    t213, t212 = facts((2, 13)), facts((2, 12))
    fp213, fp212 = (fingerprint(facts_from_proto(p).to_dict()) for p in (t213, t212))
    with d.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(MULTI, 1, platform=t213), timeout=TIMEOUT).kernel
        wait_until(lambda: fp213 in _picks(d, MULTI, C1), d)
        # The pick is the variant the RPC answered: the client's own rules, ranked by the daemon.
        assert _picks(d, MULTI, C1)[fp213] == hit.variant == "torch213-cxx11-cpu-x86_64-linux"
        # A second platform: every repo's document gets its pick too, not only the one it asked.
        kernels.Resolve(resolve_req(ACT, 1, platform=t212), timeout=TIMEOUT)
        wait_until(lambda: fp212 in _picks(d, MULTI, C1), d)
    picks = _picks(d, MULTI, C1)
    assert picks[fp212] == "torch212-cxx11-cpu-x86_64-linux"  # not fetched yet: still its pick
    # ACT's commit has no torch 2.12 build: the daemon ranked over what the upstream lists.
    assert _picks(d, ACT, C1)[fp212] == "torch-universal"
    d.restart()
    assert _picks(d, MULTI, C1) == picks
