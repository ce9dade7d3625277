"""The docs name only things that exist: commands and flags, metrics, files and sections.

- every `kerneld ...` / `kerneldctl ...` command line in a code block of the top-level Markdown
  files (README, SECURITY, RELIABILITY), docs/*.md and fuzz/*.md parses with the real argument
  parsers (an unknown command or flag, or a missing argument, fails here, even in blocks that
  cannot run on a test machine);
- every `kerneld_*` metric name in the docs is one the daemon exports;
- every relative link points at a file that exists, and `#anchors` into Markdown files at a
  heading that exists.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.ctl.main import build_parser as ctl_parser
from kerneld.server.main import build_parser as daemon_parser
from scripts.reference.metrics import metric_names

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(
    str(p.relative_to(ROOT))
    for pattern in ("*.md", "docs/*.md", "fuzz/*.md")
    for p in ROOT.glob(pattern)
)
SHELL = {"sh", "bash", "shell", "console"}


def _blocks(doc: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, language, lines) of each fenced block, indentation removed."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)", lines[i])
        if not m:
            i += 1
            continue
        indent, start, body = m.group(1), i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :])
            i += 1
        yield start, m.group(2), body
        i += 1


def _commands(body: list[str]) -> Iterator[str]:
    """Shell command lines of a block: heredoc bodies skipped, `$(...)` and `;`/`&&`/`|`
    pieces separated, comments and redirections dropped."""
    heredoc: str | None = None
    for raw in body:
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        if m := re.search(r"<<-?'?(\w+)'?", raw):
            heredoc = m.group(1)
        line = raw.split(" #", 1)[0] if not raw.lstrip().startswith("#") else ""
        pieces = re.findall(r"\$\(([^)]*)\)", line)
        line = re.sub(r"\$\([^)]*\)", "SUBST", line)
        line = re.sub(r"\s\d?>>?&?\s*\S+|\s<(?!<)\s*\S+", "", line)  # redirections
        for piece in [*re.split(r";|&&|\|\|?", line), *pieces]:
            command = re.sub(r"^\s*(?:\w+=\S*\s+)*", "", piece).strip()  # VAR=value prefixes
            if command:
                yield command


def _cli_lines() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for line, language, body in _blocks(doc):
            if language not in SHELL:
                continue
            for command in _commands(body):
                if re.match(r"^kerneld(ctl)?\s", command + " "):
                    found.append((f"{doc}:{line}", command))
    return found


CLI_LINES = _cli_lines()


def test_docs_show_cli_commands() -> None:
    assert len(CLI_LINES) > 20, CLI_LINES


@pytest.mark.parametrize(("where", "command"), CLI_LINES, ids=[w for w, _ in CLI_LINES])
def test_cli_line_parses(where: str, command: str) -> None:
    words = shlex.split(command)
    parser = ctl_parser() if words[0] == "kerneldctl" else daemon_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(words[1:])
    except SystemExit as exc:
        assert exc.code == 0, f"{where}: `{command}` does not parse:\n{err.getvalue()}"
        return
    if words[0] == "kerneldctl":
        assert getattr(args, "handler", None), f"{where}: `{command}` names no command"


def test_metric_names_in_docs_exist() -> None:
    exported = set(metric_names())
    base_names = {n.removesuffix("_total") for n in exported}
    mentioned: dict[str, str] = {}
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for name in re.findall(r"\bkerneld_[a-z0-9_]*[a-z0-9]\b", text):
            if not name.startswith(("kerneld_client", "kerneld_pb2")):
                mentioned.setdefault(name, doc)
    assert mentioned, "the docs mention no metric"
    unknown = {n: d for n, d in mentioned.items() if n not in exported | base_names}
    assert not unknown, f"metrics the daemon does not export: {unknown}"
    ops = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = [n for n in exported if n not in ops]
    assert not missing, f"exported but not documented in docs/operations.md: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _links() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if not re.match(r"^[a-z]+:", target) and (doc, target) not in out:
                out.append((doc, target))
    return out


@pytest.mark.parametrize(("doc", "target"), _links(), ids=[f"{d}->{t}" for d, t in _links()])
def test_relative_link_resolves(doc: str, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (ROOT / doc).parent / path if path else ROOT / doc
    assert file.exists(), f"{doc}: link to missing {target}"
    if anchor and file.suffix == ".md":
        headings = re.findall(r"^#+\s+(.*)$", file.read_text(encoding="utf-8"), re.MULTILINE)
        assert anchor in {_slug(h) for h in headings}, f"{doc}: no section #{anchor} in {path}"
