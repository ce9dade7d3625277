"""docs/operations.md "Mirrors and air-gapped sites", run word for word under a real systemd.

Two containers (`tests/systemd/container.py`), each a fresh host that gets the documented
install (tests/systemd/test_install.py's block, verbatim):

- the export host (this machine's network): its upstream is a loopback mirror of the example
  kernels (the Hub stands in for nothing here); the docs' step 1 block runs verbatim as root:
  key, prefetch, signed `kernels.tar`, `site-1.pub`;
- the import host: `private_network=True`, a network namespace with only a loopback device (no
  route out). The two files are carried across, and the docs' step 2 block runs verbatim:
  `upstream = []`, the key, restart, import, status. The test only shortens `[resolve]
  ref_ttl` to 2 s first, so that "past ref_ttl" comes within the test.

Then, on the import host: `kerneldctl status` says import-only; a `kerneld-users` member's job
loads the kernel cold (asking the daemon) and warm (the published index), with no `[trust]`
edit; past ref_ttl the job still loads warm; the kernel's own counters of the namespace
(`/proc/net/snmp`: Tcp ActiveOpens, Ip OutRequests/OutNoRoutes, Udp OutDatagrams) did not move
from before the block to the end (0 connection attempts, not merely 0 successful ones), and
the daemon logged no warning since the block started (`journalctl _SYSTEMD_UNIT=kerneld.service -p
warning`) and systemd never restarted it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from examples.main_job import MirrorServer
from examples.mirror import build_example_mirror
from kerneld.ctl.cmd_status import IMPORT_ONLY_LINE
from tests.support.daemon import REPO_ROOT
from tests.systemd.container import Container, ContainerUnavailable, unavailable_reason
from tests.systemd.test_install import (
    KERNEL,
    OPERATIONS,
    USERS,
    fresh_host,
    install_block,
    job,
    ok,
    wheelhouse,
)
from tests.systemd.wheelhouse import BASE_PYTHON

pytestmark = [pytest.mark.systemd, pytest.mark.slow, pytest.mark.timeout(900)]

REF_TTL_S = 2
#: The counters of /proc/net/snmp that any attempt to reach another host moves.
COUNTERS = (("Ip", "OutRequests"), ("Ip", "OutNoRoutes"), ("Tcp", "ActiveOpens"))
COUNTERS += (("Udp", "OutDatagrams"),)


def airgap_blocks() -> list[str]:
    """The shell blocks of the Mirrors section, un-indented (they sit in a numbered list)."""
    text = OPERATIONS.read_text(encoding="utf-8")
    section = text.split("\n## Mirrors and air-gapped sites\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^( *)```sh\n(.*?)^ *```", section, re.DOTALL | re.MULTILINE)
    return [
        "\n".join(line[len(indent) :] for line in body.splitlines()) + "\n"
        for indent, body in blocks
    ]


def block_with(needle: str) -> str:
    found = [b for b in airgap_blocks() if needle in b]
    assert len(found) == 1, f"expected one block with {needle!r} in docs/operations.md: {found}"
    return found[0]


def snmp(c: Container) -> dict[tuple[str, str], int]:
    """The container's network namespace's IP/TCP/UDP counters (nsenter --all enters it)."""
    lines = ok(c.run(["cat", "/proc/net/snmp"]), "/proc/net/snmp").out.splitlines()
    out: dict[tuple[str, str], int] = {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        proto, _, keys = names.partition(":")
        for key, value in zip(keys.split(), values.partition(":")[2].split(), strict=False):
            out[(proto, key)] = int(value)
    return {k: out[k] for k in COUNTERS}


def run_block(c: Container, block: str, cwd: str, env: dict[str, str], what: str) -> str:
    trace = "PS4='+ [${EPOCHREALTIME}] '"
    script = f"{trace}\nmkdir -p {cwd}\ncd {cwd}\n{block}"
    done = c.run(["bash", "-e", "-x", "-o", "pipefail", "-s"], stdin=script, env=env, timeout=300)
    return ok(done, what).out


def installed_host(base: Path, name: str, pip_env: dict[str, str], **kw: bool) -> Container:
    c = Container(base, name, **kw)
    try:
        c.mount()
    except ContainerUnavailable as exc:
        c.close()
        pytest.skip(str(exc))
    fresh_host(c)
    c.boot()
    for user in USERS:  # the users the install block's `usermod` lines name
        if c.run(["id", user]).rc != 0:
            ok(c.run(["useradd", "--create-home", user]), f"useradd {user}")
    script = f"cd {shlex.quote(str(REPO_ROOT))}\n{install_block()}"
    install = c.run(["bash", "-e", "-o", "pipefail", "-s"], stdin=script, env=pip_env, timeout=300)
    ok(install, f"{name}: the install block of docs/operations.md")
    return c


@pytest.fixture
def pip_env() -> dict[str, str]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    version = subprocess.run([BASE_PYTHON, "-c", probe], capture_output=True, text=True, check=True)
    return {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse(version.stdout.strip())),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


@pytest.fixture
def export_host(tmp_path: Path, pip_env: dict[str, str]) -> Iterator[Container]:
    with installed_host(tmp_path / "export", f"kdx-{os.getpid()}", pip_env) as c:
        yield c


def test_documented_air_gapped_site_under_systemd(
    tmp_path: Path,
    export_host: Container,
    pip_env: dict[str, str],
    built_examples: BuiltExamples,
) -> None:
    # -- the export host: a loopback mirror as its upstream, then the docs' step 1 verbatim ----
    a = export_host
    with MirrorServer(build_example_mirror(built=built_examples).root) as examples:
        (a.root / "etc" / "kerneld" / "kerneld.toml").write_text(
            "# written by tests/systemd/test_airgap.py: the export host's upstream\n"
            f'[[upstream]]\nname = "examples"\nkind = "mirror-http"\nurl = "{examples.url}"\n\n'
            "[prefetch]\non_start = false\n\n"
            '[trust]\nallow = ["kerneld-examples/*"]  # the exporting site trusts its kernels\n'
        )
        ok(a.run(["systemctl", "restart", "kerneld"]), "export host: restart")
        step1 = block_with("kerneldctl key public site-1 > site-1.pub")
        run_block(a, step1, "/root/site", {}, "step 1")
    carried = {
        n: (a.root / "root" / "site" / n).read_bytes() for n in ("kernels.tar", "site-1.pub")
    }
    a.close()

    # -- the import host: no route out; the docs' step 2 verbatim ----------------------------
    with installed_host(
        tmp_path / "import", f"kdi-{os.getpid()}", pip_env, private_network=True
    ) as b:
        routes = ok(b.run(["cat", "/proc/net/route"]), "routes").out.splitlines()[1:]
        assert [r for r in routes if not r.startswith("lo")] == [], routes  # no route out
        site = b.root / "root" / "site"
        site.mkdir(parents=True)
        for name, data in carried.items():
            (site / name).write_bytes(data)
        config = b.root / "etc" / "kerneld" / "kerneld.toml"
        shipped = config.read_text()
        assert 'ref_ttl = "5m"' in shipped
        config.write_text(shipped.replace('ref_ttl = "5m"', f'ref_ttl = "{REF_TTL_S}s"'))
        ok(b.run(["systemctl", "stop", "kerneld"]), "stop the installed daemon")
        since = ok(b.run(["date", "+%s"]), "date").out.strip()
        before = snmp(b)

        out = run_block(b, block_with("upstream = []"), "/root/site", {}, "step 2")
        assert IMPORT_ONLY_LINE in out, out
        assert "upstream hub" not in out, out
        assert "publisher of kerneld-examples/activation: trusted at the exporting site" in out

        # No [trust] allow edit: the bundle's verdict vouches. The import published the index,
        # so the first job already loads warm; one that re-checks its ref asks the daemon.
        [warm] = job(b, "alice")
        assert (warm.repo_id, warm.source) == (KERNEL, "index"), warm
        time.sleep(3 * REF_TTL_S)  # past ref_ttl: nothing is re-checked, nothing warns
        [asked] = job(b, "alice", {"KERNELD_REF_MAX_AGE": "1"})
        assert (asked.source, asked.variant) == ("daemon", warm.variant), asked
        [later] = job(b, "alice")
        assert (later.source, later.variant) == ("index", warm.variant), later
        status = ok(b.run(["kerneldctl", "status"]), "status").out
        assert IMPORT_ONLY_LINE in status and "UNREACHABLE" not in status, status

        after = snmp(b)
        assert after == before, f"connection attempts from the import host: {before} -> {after}"
        # The daemon's own lines (`-u` would add PID 1's about the unit: on some hosts' cgroup
        # set-ups nspawn's systemd logs "Failed to kill control group" at every stop, which is
        # the host's, not kerneld's); that it never failed or restarted is systemd's to say.
        warnings = b.run(
            ["journalctl", "--no-pager", "-o", "cat", "_SYSTEMD_UNIT=kerneld.service",
             "-p", "warning", "--since", f"@{since}"]
        )  # fmt: skip
        assert ok(warnings, "journalctl").out.strip() in ("", "-- No entries --"), warnings.out
        shown = ok(b.run(["systemctl", "show", "kerneld", "-p", "NRestarts,Result"]), "show")
        assert sorted(shown.out.split()) == ["NRestarts=0", "Result=success"], shown.out
