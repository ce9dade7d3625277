"""The `kernels` test suite of each release: fetched from the package registry, run in a
subprocess of the release's clean venv, read back.

The suite ships in the `kernels` sdist (`kernels/tests/`). It is fetched at test time, checked
against the sha256 pinned here, and unpacked into a cache folder; it is never copied into this
repository. (`pip download --no-binary` would build the sdist with its maturin backend, which
needs Rust, so the file is taken from the registry's simple index directly.) The package itself
is installed from its wheel (`--only-binary=kernels`), into a venv that holds only what pip
resolves for it, pytest and the suite's own test dependencies (suite_venvs).
"""

from __future__ import annotations

import hashlib
import html.parser
import io
import os
import re
import shutil
import tarfile
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.hubapi.venvs import CLIENT_REQUIREMENT, make_venv
from tests.support.testcache import cache_dir
from tests.support.watchdog import run_until_stalled

DEFAULT_INDEX = "https://pypi.org/simple"
#: What every release's suite needs to run: pytest and its per-test timeout.
RUNNER = ("pytest", "pytest-timeout")


@dataclass(frozen=True)
class SuiteRelease:
    """One `kernels` release whose own suite is run: where its tests come from, what they need
    to run beside `kernels` itself, and what of them is left out or ported to this CPU host."""

    version: str
    sdist_sha256: str
    #: Third-party modules the suite's files import that `kernels` does not require.
    test_requirements: tuple[str, ...] = ()
    #: Test files left out of every run, with the reason.
    ignored: Mapping[str, str] = field(default_factory=dict)
    #: The suite's files about the public API, also run in the "api" configuration.
    api_files: tuple[str, ...] = ()

    @property
    def sdist(self) -> str:
        return f"kernels-{self.version}.tar.gz"


_DOCTEST = {
    "tests/test_doctest.py": "needs `mktestdocs`, a development tool of kernels' own repository "
    "(its docstring examples), not a dependency of kernels or kerneld",
}
_API_FILES = (
    "tests/test_basic.py",
    "tests/test_func.py",
    "tests/test_layer.py",
    "tests/test_layer_cpu.py",
    "tests/test_loaded_kernels.py",
)

RELEASES: dict[str, SuiteRelease] = {
    "0.17.2": SuiteRelease(
        "0.17.2",
        "42e4a5758d333c6b82abfc72daf37c690fd66591b8d9d8fc509e14fceff74d72",
        ignored=_DOCTEST,
        api_files=_API_FILES,
    ),
    "0.19.1": SuiteRelease(
        "0.19.1",
        "86950bdaead9890c68e9e87aed507167590f46e55994d08e9061db9150b2c173",
        # httpx: test_cli_describe_api.py and test_trust_remote_code.py build responses with it;
        # sigstore (kernels' own `sigstore` extra): test_verify.py and test_validate.py import
        # kernels' signature checks, which need it.
        test_requirements=("httpx", "sigstore>=4,<5"),
        ignored=_DOCTEST,
        api_files=_API_FILES,
    ),
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


def _download(release: SuiteRelease) -> bytes:
    """The sdist's bytes from the registry's simple index, checked against its pinned sha256."""
    sdist = release.sdist
    page_url = f"{_index_url()}/kernels/"
    try:
        with urllib.request.urlopen(page_url, timeout=60) as resp:
            parser = _Links()
            parser.feed(resp.read().decode("utf-8", errors="replace"))
        href = next(h for h in parser.links if h.split("#")[0].endswith("/" + sdist))
        url = urllib.parse.urljoin(page_url, href.split("#")[0])
        with urllib.request.urlopen(url, timeout=120) as resp:
            data = resp.read()
    except StopIteration:
        raise RuntimeError(f"{page_url} lists no {sdist}") from None
    except OSError as exc:
        raise RuntimeError(
            f"cannot fetch {sdist} from the package registry ({page_url}): {exc}; the "
            "conformance tests need it (set PIP_INDEX_URL to a reachable index)"
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != release.sdist_sha256:
        raise RuntimeError(
            f"{sdist} from {url} has sha256 {digest}, expected {release.sdist_sha256}"
        )
    return data


def fetch_suite(release: SuiteRelease, cache: Path | None = None) -> Path:
    """A folder holding the release's suite as `tests/` and its `pytest.ini` (fetched once,
    then cached in the suite's cache outside the clone, tests/support/testcache.py)."""
    cache = cache or cache_dir("conformance")
    sdist = release.sdist
    target = cache / f"kernels-{release.version}-suite"
    if (target / "pytest.ini").is_file():
        port_to_cpu(target)
        return target
    data = _download(release)
    staging = cache / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    prefix = f"kernels-{release.version}/kernels/"
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
        raise RuntimeError(f"{sdist} holds no kernels/pytest.ini: not the layout expected")
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
    """Write the ported copies (PORTED) next to the suite's own files (only when they differ:
    the suite is shared by the clones on the machine, tests/support/testcache.py)."""
    for target, source in PORTED.items():
        text = (suite / source).read_text(encoding="utf-8")
        text = text.replace("@pytest.mark.cuda_only\n", "")
        text = re.sub(r"([\"'])cuda\1", r"\1cpu\1", text)
        out = suite / target
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            tmp = out.with_name(f".{out.name}.{os.getpid()}")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(out)


def suite_venvs(release: SuiteRelease, root: Path) -> dict[str, Path]:
    """The release's two venvs, built side by side (reused when already built): `plain`
    holds `kernels` from its wheel, what pip resolves for it, RUNNER and the suite's test
    requirements; `kerneld` holds the same and kerneld-client (with its start-up hook), for the
    hook and api configurations. Name -> python."""
    requirements = [
        f"kernels=={release.version}",
        "--only-binary=kernels",
        *RUNNER,
        *release.test_requirements,
    ]
    wanted = {
        "plain": (f"suite-kernels-{release.version}", requirements),
        "kerneld": (
            f"suite-kernels-{release.version}+kerneld",
            [*requirements, CLIENT_REQUIREMENT],
        ),
    }
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        futures = {
            key: pool.submit(make_venv, root, reqs, name=name)
            for key, (name, reqs) in wanted.items()
        }
        return {key: future.result() for key, future in futures.items()}


def run_suite(
    release: SuiteRelease,
    python: Path,
    suite: Path,
    env: Mapping[str, str],
    report: Path,
    *,
    paths: Sequence[str] = ("tests",),
    args: Sequence[str] = (),
) -> dict[str, str]:
    """Run the suite (or the files in `paths`) with the venv's `python` and `env`; test id
    (`tests/test_x.py::name[param]`) -> passed, failed, error or skipped, from pytest's junit
    report."""
    ignores = [f"--ignore={path}" for path in release.ignored]
    cmd = [
        str(python),
        "-m",
        "pytest",
        *paths,
        "-q",
        "-p",
        "no:cacheprovider",
        "--timeout=120",
        f"--junitxml={report}",
        # Its own temp root: pytest keeps only the newest three under the shared default, and
        # the runs here would remove the folders of the test that runs them.
        f"--basetemp={report.with_suffix('.tmp')}",
        "-o",
        "junit_family=xunit2",
        *ignores,
        *args,
        # Outcomes come from the report, which keeps each failure's message without a
        # traceback: rendering ~180 of them (the hook's listed differences) was half the hook
        # run's time (0.19.1: 36 s -> 20 s, bench/SUITE.md).
        "--tb=no",
    ]
    # no wall-clock limit: its pace is the machine's; killed only when hung (issue 55)
    proc = run_until_stalled(
        cmd, stall_s=300, what=f"the kernels suite in {suite}", cwd=suite, env=dict(env)
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
