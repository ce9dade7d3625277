"""`make run`'s main job runs end to end, and what it prints holds.

The demo checks its own claims and exits 1 when one fails; this test reads its output as a
newcomer would and checks the key claims again, independently: kernels were used, the warm start
made no upstream request and took no RPC, the attention kernel came through kerneld and matched
PyTorch's attention, the run without the daemon fell back and still trained, and the demo left no
daemon and no directory behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples

ROOT = Path(__file__).resolve().parent.parent


def _steps(stdout: str) -> dict[int, list[str]]:
    """Output lines grouped by the numbered step they belong to."""
    steps: dict[int, list[str]] = {}
    current = 0
    for line in stdout.splitlines():
        if m := re.match(r"^(\d+)\. ", line):
            current = int(m.group(1))
        steps.setdefault(current, []).append(line)
    return steps


def _kernelized(lines: list[str]) -> tuple[int, int]:
    for line in lines:
        if m := re.search(r"kernelized (\d+)/(\d+) layers", line):
            return int(m.group(1)), int(m.group(2))
    raise AssertionError(f"no kernelize line in {lines}")


def _requests(lines: list[str]) -> int:
    for line in lines:
        if m := re.search(r" s wall, (\d+) upstream requests?", line):
            return int(m.group(1))
    raise AssertionError(f"no upstream request count in {lines}")


@pytest.mark.slow
def test_main_job_runs(built_examples: BuiltExamples) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "examples.main_job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("OK in "), text
    assert len(lines) <= 48, f"the demo should stay short, printed {len(lines)} lines"
    steps = _steps(out.stdout)
    assert sorted(k for k in steps if k) == list(range(1, 10)), text

    # The Hub probe says what it found, and the upstream actually used is the counted mirror.
    assert re.search(r"Hugging Face Hub .*: (unreachable|answers)", "\n".join(steps[2]))
    assert _requests(steps[4]) > 0, "a prefetch into an empty store downloads"

    done, total = _kernelized(steps[5])
    assert 0 < done <= total, steps[5]
    assert _requests(steps[5]) > 0, "relu2 was not prefetched: the first run must fetch it"

    warm_done, warm_total = _kernelized(steps[6])
    assert warm_done == warm_total > 0, steps[6]
    assert _requests(steps[6]) == 0, steps[6]
    assert "asked the daemon" not in "\n".join(steps[6]), "the warm start must not need an RPC"

    attention = "\n".join(steps[7])
    assert "kerneld-examples/attention@" in attention, attention
    assert _requests(steps[7]) > 0, "the attention kernel was not prefetched: it is fetched"
    m = re.search(
        r"max difference: causal=False (\S+), causal=True (\S+), padded batch (\S+)$",
        attention,
        re.MULTILINE,
    )
    assert m is not None, attention
    assert all(float(d) <= 1e-5 for d in m.groups()), attention

    status = "\n".join(steps[8])
    assert re.search(r"^\s+kerneld \S+: ready$", status, re.MULTILINE), status
    assert re.search(r"upstream \S+ \(mirror-http http://127\.0\.0\.1:\d+/\): reachable", status)

    fallback = "\n".join(steps[9])
    assert "exit code 0" in steps[9][0], steps[9]
    assert _kernelized(steps[9])[0] == 0, fallback
    assert "keeps its PyTorch forward" in fallback, fallback
    assert "daemon-unavailable" in fallback, fallback
    assert "losses match" in fallback, fallback
    losses = [re.search(r"loss (\S+) -> (\S+)", "\n".join(steps[n])) for n in (5, 6, 9)]
    assert all(m is not None for m in losses), text
    assert len({m.groups() for m in losses if m is not None}) == 1, "same job, same losses"

    # Nothing left behind: the daemon is gone and its directory removed.
    m = re.search(r"\(pid (\d+); .* in (\S+)/\)", steps[3][0])
    assert m is not None, steps[3]
    pid, demo = int(m.group(1)), Path(m.group(2))
    assert not demo.exists()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:  # the pid may have been reused by now; it must not be a kerneld
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"kerneld" not in cmdline, cmdline
