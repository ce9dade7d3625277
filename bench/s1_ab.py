"""Scenario 1, A/B: this checkout's warm path against another commit's, in the same run.

A goal table says whether the warm path meets its target; it cannot say that it got slower since
the last landed commit, and on a shared machine two runs minutes apart differ by more than a
regression does. So `--ab COMMIT` takes that commit's client (`git archive` of `client/`, its
bytecode compiled) and runs it as extra loaders beside this checkout's, in the same fresh-process
rounds against the same daemon and store: each round takes both, and the table reports the
paired differences. Only the client differs; the daemon and its published index are this
checkout's (the index format is versioned, `index/v1`).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

from bench.common import fmt_stat, median, ratios, table

ROOT = Path(__file__).resolve().parents[1]


def checkout_client(commit: str, dest: Path) -> tuple[str, Path]:
    """(short commit, folder to put on PYTHONPATH): `commit`'s `client/` tree with bytecode."""
    short = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{commit}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", short, "client"],
        check=True,
        capture_output=True,
    ).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest)  # this repository's own archive of one of its commits
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(dest / "client" / "kerneld_client")],
        check=True,
    )
    return short, dest / "client"


def env_with(env: dict[str, str], client: Path) -> dict[str, str]:
    """`env` with `client` ahead of the editable install (PYTHONPATH precedes site-packages)."""
    rest = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": str(client) + (":" + rest if rest else "")}


def report(
    short: str,
    calls: dict[str, list[float]],
    totals: dict[str, list[float]],
    pairs: list[tuple[str, str, str]],
) -> list[str]:
    """Rows of (what, this checkout's loader, the other commit's loader): this - that, paired."""
    rows = []
    for what, this, that in pairs:
        for kind, data in (("call", calls), ("import + call", totals)):
            diffs = [a - b for a, b in zip(data[this], data[that], strict=True)]
            rows.append(
                (
                    f"{what}, {kind}",
                    fmt_stat(data[this], 2),
                    fmt_stat(data[that], 2),
                    fmt_stat(diffs, 2, " ms"),
                    fmt_stat(ratios(data[this], data[that]), 2, "x"),
                )
            )
    verdict = max(
        median([a - b for a, b in zip(totals[t], totals[o], strict=True)]) for _, t, o in pairs
    )
    return [
        "",
        f"**A/B against {short}** (`--ab`): the same rounds, this checkout's client and "
        f"{short}'s side by side; median (min-max) of the paired differences.",
        "",
        *table(
            ["path", "this ms", f"{short} ms", "this - that (paired)", "this / that"],
            rows,
        ),
        "",
        f"Largest median difference in import + call: {verdict:+.2f} ms.",
    ]
