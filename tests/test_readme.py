"""The commands the docs tell people to run actually run.

README.md and docs/operations.md mark each shell or Python code block: `<!-- runnable -->` right
above the fence means this test runs it; `<!-- not runnable: why -->` says why not (the two
`make` commands that run the tests themselves, daemons that run until stopped, steps that need
root, systemd, a web server or a model download). An unmarked shell or Python block fails the
test, so no new command escapes the check.

Runnable blocks run in document order, in one working directory per document (later blocks use
files earlier ones wrote: `pyproject.toml`, `kernels.lock`, `kernels.tar`), with the virtual
environment's `kerneld`/`kerneldctl` first on PATH, HOME in a temporary directory, and a real
`kerneld` (user mode) whose upstream is the example kernels' mirror: the same setup as
`make run`. Shell blocks run under `bash -euo pipefail`, so any failing command fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from examples.mirror import build_example_mirror
from tests.support.daemon import DaemonProcess, clean_env

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/operations.md")
RUNNABLE = "<!-- runnable -->"
NOT_RUNNABLE = re.compile(r"^<!-- not runnable: \S.* -->$")
CHECKED_LANGUAGES = {"sh", "bash", "shell", "python"}
BLOCK_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    document: str
    line: int  # 1-based line of the opening fence
    language: str
    marker: str  # the comment line above the fence ("" if none)
    code: str

    @property
    def runnable(self) -> bool:
        return self.marker == RUNNABLE

    def __str__(self) -> str:
        return f"{self.document}:{self.line} ({self.language})"


def code_blocks(document: str) -> Iterator[Block]:
    """Fenced blocks of `document` (indented ones too), with the marker line above each."""
    lines = (ROOT / document).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)", lines[i])
        if not m:
            i += 1
            continue
        indent, language, start = m.group(1), m.group(2), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        above = lines[start - 1].strip() if start > 0 else ""
        marker = above if above.startswith("<!--") else ""
        yield Block(document, start + 1, language, marker, "\n".join(body) + "\n")
        i += 1


def test_every_command_block_is_marked() -> None:
    unmarked = [
        str(b)
        for doc in DOCUMENTS
        for b in code_blocks(doc)
        if b.language in CHECKED_LANGUAGES
        and not (b.marker == RUNNABLE or NOT_RUNNABLE.match(b.marker))
    ]
    assert not unmarked, f"mark these `{RUNNABLE}` or `<!-- not runnable: why -->`: {unmarked}"
    for doc in DOCUMENTS:
        assert any(b.runnable for b in code_blocks(doc)), f"{doc} has no runnable block"


def _home_env(home: Path) -> dict[str, str]:
    """One user's home: `kerneld --user` and that user's commands share it (signing keys)."""
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }


@pytest.fixture(scope="module")
def docs_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme-home")


@pytest.fixture(scope="module")
def docs_daemon(
    built_examples: BuiltExamples, docs_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    mirror = build_example_mirror(built=built_examples)
    workdir = tmp_path_factory.mktemp("readme-daemon")
    with DaemonProcess(
        workdir,
        mirror_dirs=[mirror.root],
        config={"prefetch": {"on_start": False}, "log": {"level": "info"}},
        args=["--user"],
        env=_home_env(docs_home),
    ) as daemon:
        yield daemon


def _environment(daemon: DaemonProcess, home: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return clean_env(
        {
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            **_home_env(home),
            "KERNELD_SOCKET": str(daemon.user_socket),
            "KERNELD_ADMIN_SOCKET": str(daemon.admin_socket),
        }
    )


def _run(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.language == "python":
        script = cwd / f"block-{block.line}.py"
        script.write_text(block.code, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    done = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block} exited with {done.returncode}:\n{block.code}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}\n--- daemon\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_runnable_blocks_run(
    document: str, docs_daemon: DaemonProcess, docs_home: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = _environment(docs_daemon, docs_home)
    blocks = [b for b in code_blocks(document) if b.runnable]
    assert blocks
    for block in blocks:
        try:
            _run(block, work, env)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{docs_daemon.logs()[-3000:]}") from None
