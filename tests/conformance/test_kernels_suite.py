"""`kernels` 0.17.2's own test suite, plain and through kerneld's start-up hook.

One Hub test server serves the stand-in repos (standins.py); one real daemon, unprivileged, has
that server as its upstream. The suite runs in fresh processes: as plain `kernels` (the
baseline), with KERNELD_HOOK_KERNELS=1 (every Hub load goes through the daemon), and, for the
files about the public API, with kerneld's own API under the `kernels` names ("api": the
`api_as_kernels` plugin). A test that passes on the baseline must pass in the other two,
unless the "Conformance" table of docs/kernels-compatibility.md lists it with its reason.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.support import client_env
from tests.conformance.standins import TRUSTED_ORGS, build_standins
from tests.conformance.suite import KERNELS_VERSION, fetch_suite, run_suite
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kernels-compatibility.md"
#: Below this many passing baseline tests the harness itself is broken (stand-ins not served,
#: the suite not collected), whatever the comparison says.
MIN_BASELINE_PASSED = 400
#: The suite's files about the public API (layers, functions, loading), run with kerneld's API.
API_FILES = [
    "tests/test_basic.py",
    "tests/test_func.py",
    "tests/test_layer.py",
    "tests/test_layer_cpu.py",
    "tests/test_loaded_kernels.py",
]


def allowed_differences(configuration: str) -> dict[str, str]:
    """test id -> reason, from the documented table (`| test | configuration | reason |`)."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Conformance\n", 1)[1].split("\n## ", 1)[0]
    body = section.split("| test | configuration | reason |", 1)[1]
    allowed: dict[str, str] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] == configuration:
            allowed[cells[0].strip("`")] = cells[2]
    return allowed


def check(configuration: str, baseline: dict[str, str], outcomes: dict[str, str]) -> None:
    """Every test passing on the baseline passes in `configuration`, or is listed."""
    allowed = allowed_differences(configuration)
    passed = [t for t, outcome in baseline.items() if outcome == "passed"]
    regressions = {t: outcomes.get(t, "missing") for t in passed if outcomes.get(t) != "passed"}
    unexplained = {t: o for t, o in regressions.items() if t not in allowed}
    assert not unexplained, (
        f"kernels {KERNELS_VERSION} tests that pass plainly but not in the {configuration} "
        f"configuration (fix, or list in {PAGE.name} with the reason): {unexplained}"
    )
    stale = sorted(set(allowed) - set(regressions))
    assert not stale, f"listed as differing in the {configuration} configuration, but pass: {stale}"


def refused_before_import(hub: HubServer, daemon: DaemonProcess, tmp: Path) -> None:
    """Through the hook, a kernel whose Python dependency is not installed is refused before
    kerneld imports it, as kernels refuses it: a ValueError (kerneld's DependencyMissing), no
    fallback download, and the kernel's code never ran (it imports a module that does not
    exist)."""
    tmp.mkdir()
    env = client_env(
        None,
        tmp,
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp / "hf-home"),
        KERNELD_HOOK_KERNELS="1",
        KERNELD_SOCKET=str(daemon.user_socket),
    )
    code = (
        "import kernels\n"
        "try:\n"
        "    kernels.get_kernel('kernels-test/python-invalid-dep', revision='main')\n"
        "except Exception as exc:\n"
        "    print('ValueError' if isinstance(exc, ValueError) else type(exc).__name__, exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.startswith("ValueError ") and "kepler-22b" in proc.stdout, proc
    assert "KernelFallbackWarning" not in proc.stderr, proc.stderr
    assert not (tmp / "hf-home" / "hub").exists(), "kernels' own resolver downloaded it"


def per_file(outcomes: dict[str, str]) -> dict[str, Counter[str]]:
    table: dict[str, Counter[str]] = {}
    for test_id, outcome in outcomes.items():
        table.setdefault(test_id.split("::")[0], Counter())[outcome] += 1
    return table


@pytest.fixture(scope="module")
def suite() -> Path:
    return fetch_suite()


@pytest.fixture(scope="module")
def standin_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("standin-hub")
    build_standins(root)
    with HubServer(root, trusted_orgs=dict.fromkeys(TRUSTED_ORGS, True)) as server:
        yield server


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_kernels_suite_passes_through_the_hook(
    suite: Path,
    standin_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    daemon = make_daemon(hub_endpoint=standin_hub.url)
    runs: dict[str, dict[str, str]] = {}
    for name, hook in (("baseline", "0"), ("hook", "1")):
        (tmp_path / name).mkdir()
        env = client_env(
            None,
            tmp_path / name,
            HF_ENDPOINT=standin_hub.url,
            HF_HOME=str(tmp_path / name / "hf-home"),
            KERNELD_HOOK_KERNELS=hook,
            KERNELD_SOCKET=str(daemon.user_socket),
        )
        runs[name] = run_suite(suite, env, tmp_path / f"{name}.xml")

    baseline, hooked = runs["baseline"], runs["hook"]
    passed = [t for t, outcome in baseline.items() if outcome == "passed"]
    assert len(passed) >= MIN_BASELINE_PASSED, per_file(baseline)
    # The hook route really went through the daemon: what the suite loaded is in its store.
    published = daemon.store_root / "index" / "v1" / "kernels-test" / "versions.json"
    assert published.is_file(), "the hooked suite never asked the daemon"

    print(
        "\n".join(
            f"{path}: baseline {dict(counts)}, hook {dict(per_file(hooked).get(path, {}))}"
            for path, counts in sorted(per_file(baseline).items())
        )
    )
    check("hook", baseline, hooked)
    refused_before_import(standin_hub, daemon, tmp_path / "refused")

    # kerneld's own API under the `kernels` names, on the files about the public API.
    (tmp_path / "api").mkdir()
    env = client_env(
        None,
        tmp_path / "api",
        HF_ENDPOINT=standin_hub.url,
        HF_HOME=str(tmp_path / "api" / "hf-home"),
        KERNELD_HOOK_KERNELS="0",
        KERNELD_SOCKET=str(daemon.user_socket),
        PYTHONPATH=str(Path(__file__).parent),
    )
    api = run_suite(
        suite, env, tmp_path / "api.xml", paths=API_FILES, args=["-p", "api_as_kernels"]
    )
    print("\n".join(f"{path}: api {dict(per_file(api).get(path, {}))}" for path in API_FILES))
    check("api", {t: o for t, o in baseline.items() if t.split("::")[0] in API_FILES}, api)
