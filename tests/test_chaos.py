"""The chaos/soak harness (issue 10, `chaos/`) in its short CI configuration.

Eight client processes load kernels for 45 s while the daemon is killed and restarted, the test
Hub injects faults, and kerneldctl prefetches, collects (under a small cap), pins and denies.
The harness proves its invariants itself (store verifies clean, only published bytes imported,
nothing deleted under a holder, every load served or fell back within its deadline, denies and
pins honoured, clean supervision); this test also checks that the run really exercised each kind
of chaos, so a harness that silently did nothing cannot pass. About a minute on two cores.
`test_invariants_catch_what_they_claim_to` feeds the checks recorded violations of each kind.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from chaos.harness import ChaosConfig, run

CI_CONFIG = ChaosConfig(
    duration=45,
    clients=8,
    kill_every=15,
    gc_every=2,
    admin_every=1.0,
    fault_rate=0.2,
    fault_period=4,
    seed=7,
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chaos_short_run(tmp_path: Path) -> None:
    result = run(replace(CI_CONFIG, workdir=tmp_path / "chaos"), say=print)
    print(result.markdown)
    failed = {inv.name: inv.evidence for inv in result.invariants if not inv.ok}
    assert not failed, f"chaos invariants failed (workdir {result.workdir}): {failed}"
    assert result.ok

    fig = result.figures
    assert fig["outcomes"].get("served", 0) > 0, fig["outcomes"]
    assert fig["restarts_survived"] >= 1, fig["restarts"]
    evictions = fig["gc_removed_by_reason"].get("evicted", 0) + fig["gc_evictions_logged"]
    assert evictions >= 1, (fig["gc_removed_by_reason"], fig["gc_tree_deletions_logged"])
    assert sum(fig["faults_injected"].values()) >= 1
    faulty = sum(
        n for status, n in fig["hub_statuses"].items() if status in ("429", "500", "502", "503")
    )
    assert faulty >= 1, fig["hub_statuses"]
    assert fig["fallbacks"] >= 1, fig["errors_by_kind"]
    # Pins and denies are checked only when a GC run or a load falls inside their window.
    timed = ("pins honoured by GC", "denies honoured")
    unchecked = [i.name for i in result.invariants if i.checked == 0 and i.name not in timed]
    assert not unchecked, unchecked


def _run_data(records, *, admin=None, logs="", verify=(0, {})):
    from collections import Counter

    from chaos.catalog import Catalog, Choice
    from chaos.checks import RunData
    from chaos.daemon import AdminLog

    cat = Catalog(root="", choices=[Choice("o/k", "scale", 1.0, version=1, commit="c" * 40)])
    cat.expected[Catalog.key("o/k", "c" * 40, "torch-universal")] = {"__init__.py": "1" * 64}
    return RunData(
        records=records,
        cat=cat,
        admin=admin or AdminLog(),
        restarts=[],
        supervisor_problems=[],
        verify_online=verify,
        verify_offline=(0, {}),
        final_stop_code=0,
        hub_errors=[],
        hub_requests=Counter(),
        hub_statuses=Counter(),
        faults_injected=Counter(),
        phase_seconds={},
        file_bytes=Counter(),
        daemon_logs=logs,
        deadline_s=60.0,
        config={"duration": 1, "clients": 1},
        wall_s=1.0,
    )


def _served(**over):
    digest = "d" * 64
    rec = {
        "client": 0,
        "op": 0,
        "repo": "o/k",
        "label": "o/k:1",
        "kind": "scale",
        "policy": "torch",
        "commit_wanted": "c" * 40,
        "outcome": "served",
        "source": "index",
        "commit": "c" * 40,
        "variant": "torch-universal",
        "path": f"/s/v1/trees/{digest}",
        "digest": f"sha256:{digest}",
        "files": {"__init__.py": "1" * 64},
        "files_after": {"__init__.py": "1" * 64},
        "compute_error": None,
        "latency": 0.1,
        "t_start": 10.0,
        "t_end": 10.1,
    }
    rec.update(over)
    return rec


def test_invariants_catch_what_they_claim_to() -> None:
    """The checks themselves, on recorded evidence: a clean record passes, each kind of
    violation fails the invariant that names it (the harness can fail, not only pass)."""
    from chaos.checks import invariants
    from chaos.daemon import AdminLog, AdminOp, Window

    def failing(data) -> set[str]:
        return {inv.name for inv in invariants(data) if not inv.ok}

    assert failing(_run_data([_served()])) == set()
    cases = {
        "imported only the publisher's bytes": [_served(files={"__init__.py": "2" * 64})],
        "no tree deleted or changed under a client holding it": [_served(files_after=None)],
        "every load served or fell back within 60s": [
            _served(latency=61.0),
            {**_served(), "outcome": "hang"},
        ],
        "right kernel, right results, right verdicts": [
            _served(compute_error="scale: max|err| 1"),
            _served(commit="e" * 40),
            _served(outcome="fallback", error="KernelNotFound", files=None, files_after=None),
        ],
    }
    for name, records in cases.items():
        for rec in records:
            assert name in failing(_run_data([rec])), (name, rec)

    denied = AdminLog(denies=[Window("o/k", "*", start=9.0, end=11.0)])
    assert "denies honoured" in failing(_run_data([_served()], admin=denied))
    pinned = AdminLog(
        pins=[Window("o/k", "c" * 40, start=1.0, end=20.0)],
        ops=[AdminOp("gc", [], 5.0, 6.0, 0, {"removed": [{"repo_id": "o/k", "commit": "c" * 40}]})],
    )
    assert "pins honoured by GC" in failing(_run_data([_served()], admin=pinned))
    logs = "2026-01-01T00:00:00.000Z ERROR kerneld.server: internal error repo=o/k: boom\n"
    assert "the daemon logged no internal error" in failing(_run_data([_served()], logs=logs))
    bad_verify = _run_data([_served()], verify=(1, {"problems": ["corrupt blob"]}))
    assert "store verifies clean (kerneldctl verify, online and offline)" in failing(bad_verify)


def test_fallbacks_are_attributed_to_the_phase_they_started_in_and_explained() -> None:
    """RELIABILITY.md's per-phase table: a load counts in the fault phase in force when it
    started, and each fallback gets the cause the report names."""
    from chaos.checks import by_phase, fallback_cause

    def fell_back(t: float, error: str, message: str = "", kind: str = "scale") -> dict:
        return _served(
            t_start=t, outcome="fallback", error=error, message=message, kind=kind, files=None
        )

    data = _run_data(
        [
            _served(t_start=5.0),  # before the first phase: calm
            fell_back(11.0, "DaemonUnavailable"),
            fell_back(12.0, "KernelUnavailable", "resource exhausted: 5 bytes (size cap)"),
            _served(t_start=21.0),
            fell_back(22.0, "KernelNotFound", kind="absent"),
        ]
    )
    data.phase_timeline = [(10.0, "outage"), (20.0, "flaky")]
    phases = by_phase(data)
    assert phases["calm"] == {"loads": 1, "fallbacks": 0, "causes": {}, "share": 0.0}
    assert phases["outage"]["fallbacks"] == 2 and phases["outage"]["share"] == 1.0
    assert phases["outage"]["causes"] == {"daemon down (killer)": 1, "store cap": 1}
    assert phases["flaky"]["causes"] == {"absent kernel (asked on purpose)": 1}
    assert fallback_cause({"error": "KernelNotFound", "kind": "scale"}) == "not found"
