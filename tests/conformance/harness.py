"""`kernels`' own test suites (0.17.2 and 0.19.1), plain, through kerneld's start-up hook, and
on kerneld's API under every public `kernels` name.

One Hub test server serves the stand-in repos (standins.py); one real daemon, unprivileged, has
that server as its upstream. Each release's suite runs in fresh processes of that release's
clean venvs (suite.suite_venvs: `kernels` from its wheel, what pip resolves for it, pytest and
the suite's own test requirements): as plain `kernels` (the baseline, a venv without anything
of kerneld's), with KERNELD_HOOK_KERNELS=1 (the hook binds `kernels`' public names to
kerneld_client; every Hub load goes through the daemon) and, for the files about the public API,
"api": the `api_as_kernels` plugin binds every public name wherever `kernels` holds it, the
hook off (the hook and api runs use the venv with kerneld-client). A test that passes on the
baseline must pass in the other two, unless that release's table in the "Conformance" section
of docs/kernels-compatibility.md lists it with its reason; a listed test that passes fails the
check too (a stale entry). The baseline's outcomes are kept per content (baseline.py): a later
run with the same release, venvs, stand-ins and Hub server reuses them.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tests import deps
from tests.client.support import client_env
from tests.conformance.baseline import baseline_path, cached_baseline
from tests.conformance.suite import RELEASES, SuiteRelease, run_suite
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kernels-compatibility.md"
HERE = Path(__file__).resolve().parent
#: Below this many passing baseline tests the harness itself is broken (stand-ins not served,
#: the suite not collected), whatever the comparison says.
MIN_BASELINE_PASSED = {"0.17.2": 450, "0.19.1": 1800}


def conformance_table(version: str) -> str:
    """The release's table: `### kernels <version>` in the page's "Conformance" section."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Conformance\n", 1)[1].split("\n## ", 1)[0]
    heading = f"\n### kernels {version}\n"
    assert heading in section, f"{PAGE.name} has no conformance table for kernels {version}"
    return section.split(heading, 1)[1].split("\n### ", 1)[0]


def allowed_differences(version: str, configuration: str) -> dict[str, str]:
    """test id -> reason, from the release's table (`| test | configuration | reason |`)."""
    body = conformance_table(version).split("| test | configuration | reason |", 1)[1]
    allowed: dict[str, str] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] == configuration:
            allowed[cells[0].strip("`")] = cells[2]
    return allowed


def differences(
    version: str, configuration: str, baseline: dict[str, str], outcomes: dict[str, str]
) -> list[str]:
    """What breaks the rule in `configuration` (empty: nothing): a test passing on the baseline
    that does not pass there and is not listed, or a listed test that passes (a stale entry).
    An entry `path::name[*]` stands for every parametrization of `path::name`."""
    allowed = allowed_differences(version, configuration)
    passed = [t for t, outcome in baseline.items() if outcome == "passed"]
    regressions = {t: outcomes.get(t, "missing") for t in passed if outcomes.get(t) != "passed"}

    def entry(test_id: str) -> str | None:
        if test_id in allowed:
            return test_id
        group = test_id.split("[", 1)[0] + "[*]"
        return group if "[" in test_id and group in allowed else None

    unexplained = {t: o for t, o in regressions.items() if entry(t) is None}
    used = {entry(t) for t in regressions}
    stale = sorted(set(allowed) - used)
    problems: list[str] = []
    if unexplained:
        problems.append(
            f"kernels {version} tests that pass plainly but not in the {configuration} "
            f"configuration (fix, or list in {PAGE.name} with the reason): {unexplained}"
        )
    if stale:
        problems.append(
            f"listed for kernels {version} as differing in the {configuration} configuration, "
            f"but pass: {stale}"
        )
    return problems


def refused_before_import(python: Path, hub: HubServer, daemon: DaemonProcess, tmp: Path) -> None:
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
        [str(python), "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.startswith("ValueError ") and "kepler-22b" in proc.stdout, proc
    assert "KernelFallbackWarning" not in proc.stderr, proc.stderr
    assert not (tmp / "hf-home" / "hub").exists(), "kernels' own resolver downloaded it"


def _passed(outcomes: Mapping[str, str]) -> int:
    return sum(1 for outcome in outcomes.values() if outcome == "passed")


def per_file(outcomes: dict[str, str]) -> dict[str, Counter[str]]:
    table: dict[str, Counter[str]] = {}
    for test_id, outcome in outcomes.items():
        table.setdefault(test_id.split("::")[0], Counter())[outcome] += 1
    return table


def _env(hub: HubServer, daemon: DaemonProcess, tmp: Path, **extra: str) -> dict[str, str]:
    tmp.mkdir()
    env = client_env(
        None,
        tmp,
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp / "hf-home"),
        KERNELD_SOCKET=str(daemon.user_socket),
        **extra,
    )
    env.pop("PYTHONPATH", None)  # nothing of the project's on the suite's path
    env.update({k: v for k, v in extra.items() if k == "PYTHONPATH"})
    return env


def run_conformance(
    version: str,
    standin_hub: HubServer,
    make_daemon: Callable[..., DaemonProcess],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Run release `version`'s suite in the three configurations and check them (the test
    files test_kernels_suite.py and test_kernels_suite_0191.py, one release each, so that
    pytest-xdist runs them side by side)."""
    release: SuiteRelease = RELEASES[version]
    suite, venvs = deps.conformance(version)
    daemon = make_daemon(hub_endpoint=standin_hub.url)

    started = time.monotonic()
    baseline, kept = cached_baseline(
        baseline_path(version, venvs["plain"], suite),
        lambda: run_suite(
            release,
            venvs["plain"],
            suite,
            _env(standin_hub, daemon, tmp_path / "baseline", KERNELD_HOOK_KERNELS="0"),
            tmp_path / "baseline.xml",
        ),
        lambda outcomes: _passed(outcomes) >= MIN_BASELINE_PASSED[version],
    )
    timings = {"baseline (kept)" if kept else "baseline": time.monotonic() - started}
    hooked = run_suite(
        release,
        venvs["kerneld"],
        suite,
        _env(standin_hub, daemon, tmp_path / "hook", KERNELD_HOOK_KERNELS="1"),
        tmp_path / "hook.xml",
    )
    timings["hook"] = time.monotonic() - started - sum(timings.values())
    assert _passed(baseline) >= MIN_BASELINE_PASSED[version], per_file(baseline)
    # The hook route really went through the daemon: what the suite loaded is in its store.
    published = daemon.store_root / "index" / "v1" / "kernels-test" / "versions.json"
    assert published.is_file(), "the hooked suite never asked the daemon"
    print(
        "\n".join(
            f"{version} {path}: baseline {dict(counts)}, "
            f"hook {dict(per_file(hooked).get(path, {}))}"
            for path, counts in sorted(per_file(baseline).items())
        )
    )
    problems = differences(version, "hook", baseline, hooked)
    refused_before_import(venvs["kerneld"], standin_hub, daemon, tmp_path / "refused")

    # kerneld's API under every public `kernels` name, on the files about the public API.
    binding = tmp_path / "api-binding.json"
    api = run_suite(
        release,
        venvs["kerneld"],
        suite,
        _env(
            standin_hub,
            daemon,
            tmp_path / "api",
            KERNELD_HOOK_KERNELS="0",
            PYTHONPATH=str(HERE),
            KERNELD_API_BINDING_REPORT=str(binding),
        ),
        tmp_path / "api.xml",
        paths=release.api_files,
        args=["-p", "api_as_kernels"],
    )
    timings["api"] = time.monotonic() - started - sum(timings.values())
    print(f"{version} seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    # Every public name the suite's files reach resolves to kerneld_client's object.
    reached = json.loads(binding.read_text(encoding="utf-8"))
    assert len(reached) >= 20, reached
    kernels_owned = {n: m for n, m in reached.items() if not m.startswith("kerneld_client")}
    assert not kernels_owned, f"public names still kernels' own on the api route: {kernels_owned}"
    print(
        "\n".join(
            f"{version} {path}: api {dict(per_file(api).get(path, {}))}"
            for path in release.api_files
        )
    )
    in_api_files = {t: o for t, o in baseline.items() if t.split("::")[0] in release.api_files}
    problems += differences(version, "api", in_api_files, api)
    assert not problems, "\n".join(problems)
