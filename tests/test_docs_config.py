"""The configuration reference (docs/configuration.md) and the metrics table (docs/operations.md)
are what scripts/gen_reference.py generates from the code, and the generator finds knobs in
the code by itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from kerneld.config import KNOWN_KEYS
from scripts.reference.environment import environment

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_reference.py"
CONFIG_DOC = ROOT / "docs" / "configuration.md"
OPS_DOC = ROOT / "docs" / "operations.md"


def _check(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_committed_reference_is_current_and_complete() -> None:
    done = _check()
    assert done.returncode == 0, (
        done.stdout + done.stderr + "\nrun: .venv/bin/python scripts/gen_reference.py"
    )


def test_check_fails_on_drift(tmp_path: Path) -> None:
    doc, ops = tmp_path / "configuration.md", tmp_path / "operations.md"
    shutil.copy(CONFIG_DOC, doc)
    shutil.copy(OPS_DOC, ops)
    text = doc.read_text(encoding="utf-8")
    assert "| `threads` | `16` |" in text
    doc.write_text(text.replace("| `threads` | `16` |", "| `threads` | `8` |"), encoding="utf-8")
    done = _check("--doc", str(doc), "--ops-doc", str(ops))
    assert done.returncode == 1
    assert "out of date" in done.stdout and "`threads` | `16`" in done.stdout


def test_every_config_key_has_a_row() -> None:
    text = CONFIG_DOC.read_text(encoding="utf-8")
    for section, keys in KNOWN_KEYS.items():
        heading = (
            "### Top level"
            if not section
            else f"### `[[{section}]]`"
            if section == "upstream"
            else f"### `[{section}]`"
        )
        assert heading in text, heading
        part = text.split(heading, 1)[1].split("\n### ", 1)[0]
        for key in keys - (set(KNOWN_KEYS) if not section else set()):
            assert f"| `{key}` |" in part, f"{heading}: no row for {key}"


def test_environment_knobs_are_found_in_code(tmp_path: Path) -> None:
    """A new variable is picked up with the description its code gives, wherever it is read."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "knobs.py").write_text(
        "import os\n\n"
        "#: Seconds to wait for the frobnicator (default 5).\n"
        'ENV_FROB = "KERNELD_FROB"\n\n\n'
        "def colour() -> str:\n"
        '    """The colour of the output; $KERNELD_COLOUR overrides the terminal default."""\n'
        '    return os.environ.get("KERNELD_COLOUR", "")\n\n\n'
        "def mystery() -> str:\n"
        '    return os.environ["KERNELD_MYSTERY"]\n'
    )
    (pkg / "use.py").write_text(
        "import os\n\nfrom pkg.knobs import ENV_FROB\n\nVALUE = os.getenv(ENV_FROB)\n"
    )
    found = {v.name: v for v in environment((pkg,))}
    assert set(found) == {"KERNELD_FROB", "KERNELD_COLOUR", "KERNELD_MYSTERY"}
    assert found["KERNELD_FROB"].description == "Seconds to wait for the frobnicator (default 5)."
    assert found["KERNELD_FROB"].modules == {"pkg.knobs", "pkg.use"}
    assert "overrides the terminal default" in found["KERNELD_COLOUR"].description
    assert found["KERNELD_MYSTERY"].description == ""  # the real run reports it undocumented


def test_real_knobs_are_all_described() -> None:
    variables = environment()
    names = {v.name for v in variables}
    assert {"KERNELD_SOCKET", "KERNELD_STORE", "KERNELD_FALLBACK", "KERNELD_REQUIRE"} <= names
    assert all(v.description for v in variables), [v.name for v in variables if not v.description]
