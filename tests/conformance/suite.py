"""The `kernels` test suite: fetched from the package registry, run in a subprocess, read back.

The suite ships in the `kernels` sdist (`kernels/tests/`). It is fetched at test time, checked
against the sha256 pinned here, and unpacked into a cache folder; it is never copied into this
repository. (`pip download --no-binary` would build the sdist's metadata with its maturin
backend, so the file is taken from the registry's simple index directly.)
"""

from __future__ import annotations

import hashlib
import html.parser
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

KERNELS_VERSION = "0.17.2"
SDIST = f"kernels-{KERNELS_VERSION}.tar.gz"
SDIST_SHA256 = "42e4a5758d333c6b82abfc72daf37c690fd66591b8d9d8fc509e14fceff74d72"
DEFAULT_INDEX = "https://pypi.org/simple"
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "conformance"

#: Test files left out of every run, with the reason.
IGNORED = {
    "tests/test_doctest.py": "needs `mktestdocs`, which is not a dependency of kernels or kerneld",
}


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def _index_url() -> str:
    return (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def _download() -> bytes:
    """The sdist's bytes from the registry's simple index, checked against SDIST_SHA256."""
    page_url = f"{_index_url()}/kernels/"
    try:
        with urllib.request.urlopen(page_url, timeout=60) as resp:
            parser = _Links()
            parser.feed(resp.read().decode("utf-8", errors="replace"))
        href = next(h for h in parser.links if h.split("#")[0].endswith("/" + SDIST))
        url = urllib.parse.urljoin(page_url, href.split("#")[0])
        with urllib.request.urlopen(url, timeout=120) as resp:
            data = resp.read()
    except StopIteration:
        raise RuntimeError(f"{page_url} lists no {SDIST}") from None
    except OSError as exc:
        raise RuntimeError(
            f"cannot fetch {SDIST} from the package registry ({page_url}): {exc}; the "
            "conformance tests need it (set PIP_INDEX_URL to a reachable index)"
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{SDIST} from {url} has sha256 {digest}, expected {SDIST_SHA256}")
    return data


def fetch_suite(cache: Path = CACHE) -> Path:
    """A folder holding the suite as `tests/` and its `pytest.ini` (fetched once, then cached)."""
    target = cache / f"kernels-{KERNELS_VERSION}-suite"
    if (target / "pytest.ini").is_file():
        port_to_cpu(target)
        return target
    data = _download()
    staging = cache / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    prefix = f"kernels-{KERNELS_VERSION}/kernels/"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name.removeprefix(prefix)
            if rel == member.name or not (rel.startswith("tests/") or rel == "pytest.ini"):
                continue
            if not member.isfile() or ".." in Path(rel).parts:
                continue
            out = staging / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            out.write_bytes(source.read())
    if not (staging / "pytest.ini").is_file():
        raise RuntimeError(f"{SDIST} holds no kernels/pytest.ini: not the layout expected")
    try:
        staging.rename(target)
    except OSError:  # another process got there first
        shutil.rmtree(staging, ignore_errors=True)
    port_to_cpu(target)
    return target


#: The CUDA-only layer tests, ported to this CPU machine: `tests/test_layer.py` with its
#: `cuda_only` marks dropped and the device `"cuda"` read as `"cpu"` (the stand-in layers are
#: pure PyTorch). Tests about CUDA itself (capabilities, ROCm) fail on the baseline there, so
#: they stay outside the comparison.
PORTED = {"tests/test_layer_cpu.py": "tests/test_layer.py"}


def port_to_cpu(suite: Path) -> None:
    """Write the ported copies (PORTED) next to the suite's own files."""
    for target, source in PORTED.items():
        text = (suite / source).read_text(encoding="utf-8")
        text = text.replace("@pytest.mark.cuda_only\n", "")
        text = re.sub(r"([\"'])cuda\1", r"\1cpu\1", text)
        (suite / target).write_text(text, encoding="utf-8")


def run_suite(
    suite: Path,
    env: Mapping[str, str],
    report: Path,
    *,
    paths: Sequence[str] = ("tests",),
    args: Sequence[str] = (),
) -> dict[str, str]:
    """Run the suite (or the files in `paths`) with `env`; test id
    (`tests/test_x.py::name[param]`) -> passed, failed, error or skipped, from pytest's junit
    report."""
    ignores = [f"--ignore={path}" for path in IGNORED]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        "-q",
        "-p",
        "no:cacheprovider",
        "--timeout=120",
        f"--junitxml={report}",
        "-o",
        "junit_family=xunit2",
        *ignores,
        *args,
    ]
    proc = subprocess.run(
        cmd, cwd=suite, env=dict(env), capture_output=True, text=True, timeout=900, check=False
    )
    if not report.is_file():
        raise RuntimeError(
            f"the suite did not run (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
        )
    return parse_report(report)


def parse_report(report: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname is `tests.test_x` or `tests.test_x.TestClass` (the suite is one folder deep)
        parts = case.get("classname", "").split(".")
        test_id = "::".join([f"{'/'.join(parts[:2])}.py", *parts[2:], case.get("name", "")])
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                break
        outcomes[test_id] = outcome
    return outcomes
