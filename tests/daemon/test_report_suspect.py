"""ReportSuspect (issue 19, part 2): a job tells the daemon a tree looks damaged; the daemon
checks for itself and acts only on damage it confirms.

Real daemons on real unix sockets; trees are damaged the way a rotting disk does it (one bit
flipped in place, size, mode and mtime kept). Covered: an intact tree stays in service; a
damaged one is quarantined, fetched again from the test Hub, served again and its quarantine
entry dropped; what no upstream has stays quarantined and visible (`kerneldctl status`,
`kerneldctl verify`, GetAdminStatus); unknown digests, hostile requests and floods; a client
under KERNELD_VERIFY=1 reports by itself; the public `kerneld_client.report_suspect`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from kerneld.server.fronts.rpc import convert
from kerneld.server.fronts.rpc.suspect import REPORT_BURST
from kerneld_client.proto import kerneld_pb2 as pb
from tests.client.support import client_env, run_client
from tests.daemon.rpc import TIMEOUT, failure, http_get_unix, metric, resolve_req, tree_files
from tests.fixtures_daemon import ACT, C1
from tests.fixtures_hub import REPO, VARIANT, SyntheticHub
from tests.security.support import CPU_FACTS
from tests.security.test_client_verify import flip_byte
from tests.support.ctl import run_ctl
from tests.support.daemon import DaemonProcess, daemon_dir
from tests.support.hubserver import HubServer

V = pb.ReportSuspectResponse
CPU_VARIANT = "torch213-cxx11-cpu-x86_64-linux"
#: No background scrub: only the reports under test may find the damage.
NO_SCRUB = {"store": {"scrub_interval": 0}}


def report(kernels: object, digest: str, **fields: str) -> pb.ReportSuspectResponse:
    request = pb.ReportSuspectRequest(tree_digest=digest, **fields)
    answer: pb.ReportSuspectResponse = kernels.ReportSuspect(request, timeout=TIMEOUT)  # type: ignore[attr-defined]
    return answer


def audit_lines(d: DaemonProcess) -> list[str]:
    return [line for line in d.logs().splitlines() if "rpc=ReportSuspect" in line]


def quarantine(d: DaemonProcess) -> list[Path]:
    base = d.store_root / "v1" / "quarantine"
    return sorted(base.iterdir()) if base.is_dir() else []


def variants_of(answer: pb.ReportSuspectResponse) -> list[tuple[str, str, str]]:
    return [(v.repo_id, v.commit, v.variant) for v in answer.variants]


def test_an_intact_tree_is_checked_and_stays_in_service(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    metrics = daemon_dir("kd-m-") / "metrics.sock"
    d = make_daemon(
        mirror_dirs=[kernel_mirror], config={**NO_SCRUB, "metrics": {"socket": str(metrics)}}
    )
    with d.kernels() as kernels, d.admin() as admin:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
        answer = report(
            kernels,
            hit.tree_digest,
            repo_id=ACT,
            commit=hit.commit,
            variant=hit.variant,
            reason="wrong results on step 3",
        )
        assert answer.verdict == V.INTACT, answer
        assert answer.tree_digest == hit.tree_digest and "every file matches" in answer.detail
        assert not answer.refetch_scheduled and not answer.remembered
        assert not answer.quarantine_entries and answer.checked_at.seconds > 0
        assert variants_of(answer) == [(ACT, hit.commit, hit.variant)]
        # Within the window the tree is not hashed again: the same verdict, marked remembered.
        again = report(kernels, hit.tree_digest.removeprefix("sha256:"))
        assert again.verdict == V.INTACT and again.remembered
        # Reports of one tree at the same time: one check, the others wait and take its verdict.
        universal = kernels.Resolve(
            resolve_req(ACT, 1, variant="torch-universal"), timeout=TIMEOUT
        ).kernel
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda _: report(kernels, universal.tree_digest), range(5)))
        assert [a.verdict for a in answers] == [V.INTACT] * 5
        assert sorted(a.remembered for a in answers) == [False, True, True, True, True]
        # Nothing changed: not quarantined, served from the store as before.
        assert quarantine(d) == []
        same = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
        assert not same.fetched and same.path == hit.path
        status = admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
        assert (status.quarantine_entries, status.quarantine_bytes) == (0, 0)
        assert status.quarantine_max_bytes == 1 << 30
    lines = audit_lines(d)
    assert len(lines) == 7, lines
    first = lines[0]
    for part in (
        "caller=anonymous",
        f"repo={ACT}",
        f"commit={hit.commit}",
        f"variant={hit.variant}",
        f"tree={hit.tree_digest}",
        "reason='wrong results on step 3'",
        "result=intact",
    ):
        assert part in first, (part, first)
    assert "result=intact (remembered)" in lines[1], lines[1]
    text = http_get_unix(metrics)
    assert metric(text, "kerneld_suspect_reports_total", verdict="intact") == 7
    assert metric(text, "kerneld_suspect_reports_total", verdict="damaged") == 0
    assert metric(text, "kerneld_quarantine_entries") == 0
    assert metric(text, "kerneld_quarantine_max_bytes") == 1 << 30


def test_a_damaged_tree_is_quarantined_refetched_from_the_hub_and_served_again(
    make_daemon: Callable[..., DaemonProcess], hub_server: HubServer, synthetic_hub: SyntheticHub
) -> None:
    metrics = daemon_dir("kd-m-") / "metrics.sock"
    d = make_daemon(
        hub_endpoint=hub_server.url, config={**NO_SCRUB, "metrics": {"socket": str(metrics)}}
    )
    with d.kernels() as kernels, d.admin() as admin:
        hit = kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel
        tree = Path(hit.path)
        original = tree_files(tree)
        victim = sorted(p for p in original if p.endswith(".py"))[0]
        flip_byte(tree / victim)
        assert tree_files(tree)[victim] != original[victim]
        hub_server.reset_counts()

        answer = report(kernels, hit.tree_digest, repo_id=REPO, reason="CorruptTree: test")
        assert answer.verdict == V.DAMAGED, answer
        assert answer.refetch_scheduled and answer.quarantine_entries
        assert variants_of(answer) == [(REPO, hit.commit, VARIANT)]
        assert victim in answer.detail and "corrupt" in answer.detail
        # Re-fetched in the background (the answer did not wait for it), from the Hub.
        d.wait_for_log(f"report: tree {hit.tree_digest} healed: 1/1 variant(s) re-fetched", 30)
        assert hub_server.total() > 0, "the re-fetch did not come from the Hub"
        # Served again, intact, and the quarantined copy is dropped: nothing is left over.
        assert quarantine(d) == []
        again = kernels.Resolve(resolve_req(REPO, 1), timeout=TIMEOUT).kernel
        assert again.tree_digest == hit.tree_digest and tree_files(Path(again.path)) == original
        events = list(admin.Verify(pb.VerifyRequest(), timeout=TIMEOUT))
        assert [e.problem for e in events] == [pb.VerifyEvent.SUMMARY], events
        # The tree published again is a new tree: checked, not answered from memory.
        fresh = report(kernels, hit.tree_digest)
        assert fresh.verdict == V.INTACT and not fresh.remembered, fresh
    (damaged, intact) = audit_lines(d)
    assert "result=damaged" in damaged and "refetch=scheduled" in damaged, damaged
    assert f"repo={REPO}" in damaged and f"serves={REPO}@{hit.commit[:12]}/{VARIANT}" in damaged
    assert "result=intact" in intact
    logs = d.logs()
    assert f"scrub: re-fetched repo={REPO} commit={hit.commit} variant={VARIANT}" in logs
    assert "its quarantined copy is dropped" in logs
    text = http_get_unix(metrics)
    assert metric(text, "kerneld_suspect_reports_total", verdict="damaged") == 1
    assert metric(text, "kerneld_scrub_refetches_total", result="ok") == 1
    assert metric(text, "kerneld_quarantine_entries") == 0


def test_what_no_upstream_can_replace_stays_quarantined_and_visible(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    mirror = tmp_path / "mirror"
    shutil.copytree(kernel_mirror, mirror)
    d = make_daemon(
        mirror_dirs=[mirror], config={"store": {"scrub_interval": 0, "quarantine_max": "64KiB"}}
    )
    with d.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    shutil.rmtree(mirror)  # the only upstream is gone: an air-gapped host
    flip_byte(Path(hit.path) / "__init__.py")
    with d.kernels() as kernels, d.admin() as admin:
        answer = report(kernels, hit.tree_digest, reason="segfault in silu")
        assert answer.verdict == V.DAMAGED and answer.refetch_scheduled, answer
        d.wait_for_log(f"report: tree {hit.tree_digest} healed: 0/1 variant(s) re-fetched", 30)
        entries = quarantine(d)
        assert {e.name for e in entries} == set(answer.quarantine_entries) and entries
        assert "no upstream could replace it, kept" in d.logs()
        # Forensics: who reported it and why, beside what the daemon found.
        docs = [json.loads((e / "entry.json").read_text()) for e in entries]
        tree_doc = next(doc for doc in docs if doc["object"] == "tree")
        assert tree_doc["by"] == "report" and tree_doc["reported_by"] == "anonymous"
        assert tree_doc["report_reason"] == "segfault in silu"
        assert tree_doc["why"][0]["kind"] == "corrupt" and tree_doc["bytes"] > 0
        # Reported again within the window: the remembered verdict, nothing hashed or moved.
        again = report(kernels, hit.tree_digest)
        assert again.verdict == V.DAMAGED and again.remembered
        status = admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
        held = sum(doc["bytes"] for doc in docs)
        assert status.quarantine_entries == len(entries) and status.quarantine_bytes == held
        assert status.quarantine_max_bytes == 64 << 10

    env = {"KERNELD_ADMIN_SOCKET": str(d.admin_socket), "KERNELD_SOCKET": str(d.user_socket)}
    home = tmp_path / "home"
    human = run_ctl("status", home=home, env=env)
    assert human.rc == 0, human.stderr
    line = next(x for x in human.stdout.splitlines() if x.startswith("quarantine:"))
    plural = "entry" if len(entries) == 1 else "entries"
    assert line.startswith(f"quarantine: {len(entries)} {plural}, ") and " of 64.0 KiB " in line
    assert line.endswith("(kerneldctl verify lists them)"), line
    doc = run_ctl("status", "--json", home=home, env=env).json()
    assert doc["quarantine_entries"] == len(entries) and doc["quarantine_bytes"] == held

    listed = run_ctl("verify", "--json", home=home, env=env)
    assert listed.rc == 0, listed.stderr  # nothing damaged is in service any more
    rows = {q["name"]: q for q in listed.json()["quarantine"]}
    assert set(rows) == {e.name for e in entries}
    tree_row = next(q for q in rows.values() if q["object"] == "tree")
    assert tree_row["bytes"] == tree_doc["bytes"] and tree_row["by"] == "report"
    assert tree_row["reason"].startswith("corrupt: ") and "__init__.py" in tree_row["reason"]
    assert tree_row["variants"] == [{"repo_id": ACT, "commit": C1, "variant": CPU_VARIANT}]
    text = run_ctl("verify", home=home, env=env).stdout
    assert f"quarantine: {len(entries)} {plural}" in text
    tree_name = next(n for n, q in rows.items() if q["object"] == "tree")
    tree_line = next(x for x in text.splitlines() if tree_name in x)
    assert "by report" in tree_line and "corrupt: " in tree_line and f"{ACT}@1111111" in tree_line

    # The bound follows the config on reload.
    d.write_config({"store": {"quarantine_max": "1MiB"}})
    with d.admin() as admin:
        assert admin.ReloadConfig(pb.ReloadConfigRequest(), timeout=TIMEOUT).changed
        status = admin.GetAdminStatus(pb.GetStatusRequest(), timeout=TIMEOUT)
    assert status.quarantine_max_bytes == 1 << 20


def test_unknown_digests_hostile_requests_and_floods(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], config=NO_SCRUB)
    huge = "x" * (4_000_000 - 4096)
    with d.kernels() as kernels:
        unknown = report(kernels, "sha256:" + "ab" * 32)
        assert unknown.verdict == V.UNKNOWN_TREE, unknown
        assert "serves no tree with this digest" in unknown.detail
        assert not unknown.quarantine_entries and not unknown.variants

        ok = pb.ReportSuspectRequest(tree_digest="sha256:" + "cd" * 32)
        hostile: list[tuple[str, pb.ReportSuspectRequest]] = [
            ("tree_digest", pb.ReportSuspectRequest(tree_digest="sha256:xyz")),
            ("tree_digest", pb.ReportSuspectRequest(tree_digest="../../../etc/passwd")),
            ("tree_digest", pb.ReportSuspectRequest()),
            ("tree_digest", pb.ReportSuspectRequest(tree_digest="sha256:" + "AB" * 32)),
            ("tree_digest", pb.ReportSuspectRequest(tree_digest=huge)),
        ]
        for field, value in (
            ("reason", "r" * (convert.MAX_REASON + 1)),
            ("reason", "ok\nkerneld.daemon: forged log line"),
            ("repo_id", huge),
            ("commit", huge),
            ("variant", huge),
        ):
            request = pb.ReportSuspectRequest()
            request.CopyFrom(ok)
            setattr(request, field, value)
            hostile.append((field, request))
        for field, request in hostile:
            code, detail = failure(kernels.ReportSuspect, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (field, code, detail.message)
            assert detail.code == pb.ErrorCode.INVALID_ARGUMENT
            assert field in detail.message and len(detail.message) < 400, detail.message

        # Anonymous callers share one budget of REPORT_BURST (one spent above; refused
        # requests spend none); over it: RESOURCE_EXHAUSTED with the ErrorDetail and a hint.
        codes = []
        for i in range(REPORT_BURST + 2):
            try:
                report(kernels, f"sha256:{i:064x}")
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)  # type: ignore[attr-defined]
        assert codes[: REPORT_BURST - 1] == ["OK"] * (REPORT_BURST - 1), codes
        assert "RESOURCE_EXHAUSTED" in codes[REPORT_BURST - 1 :], codes
        code, detail = failure(kernels.ReportSuspect, ok)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert detail.code == pb.ErrorCode.RESOURCE_EXHAUSTED
        assert "too many ReportSuspect calls from anonymous callers" in detail.message
        assert "kerneldctl verify" in detail.hint

    # A caller with a token of its own is not in the anonymous bucket (this test's uid: root
    # and the daemon's uid are not limited at all, as for fetches).
    from kerneld_client import _rpc

    answer = _rpc.report_suspect(d.user_socket, "sha256:" + "ef" * 32, timeout=TIMEOUT)
    assert answer.verdict in ("unknown", "rate-limited"), answer
    if os.geteuid() == 0 or os.geteuid() == d.uid:
        assert answer.verdict == "unknown", answer

    logs = d.logs()
    assert "\nkerneld.daemon: forged" not in logs
    lines = audit_lines(d)
    # one line per report, refused ones included, each naming the outcome
    assert len(lines) == 1 + len(hostile) + len(codes) + 2, len(lines)
    assert sum("result=invalid" in x for x in lines) == len(hostile)
    assert sum("result=rate-limited" in x for x in lines) == codes.count("RESOURCE_EXHAUSTED") + 1
    assert max(len(x) for x in lines) < 2000


CLIENT = """
import json, torch, kerneld_client
try:
    mod = kerneld_client.get_kernel({repo!r}, version=1, policy="error")
    out = {{"name": mod.NAME}}
except kerneld_client.KernelError as exc:
    out = {{"error": type(exc).__name__, "message": str(exc)}}
print(json.dumps(out))
"""


def _client(d: DaemonProcess, tmp: Path, code: str, **env: str) -> dict[str, object]:
    environ = client_env(
        d.store_root,
        tmp,
        KERNELD_SOCKET=str(d.user_socket),
        KERNELD_PLATFORM_JSON=CPU_FACTS,
        **env,
    )
    return run_client(code, environ)


def test_a_client_under_kerneld_verify_reports_what_it_refuses(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], config=NO_SCRUB)
    with d.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    assert hit.variant == CPU_VARIANT
    code = CLIENT.format(repo=ACT)
    # An intact tree: verified, loaded, nothing reported.
    assert "name" in _client(d, tmp_path, code, KERNELD_VERIFY="1")
    assert audit_lines(d) == []

    init = Path(hit.path) / "__init__.py"
    original = init.read_bytes()
    flip_byte(init, offset=original.index(b"_act") + 1)
    started = time.monotonic()
    refused = _client(d, tmp_path, code, KERNELD_VERIFY="1")
    assert refused["error"] == "CorruptTree", refused
    assert time.monotonic() - started < 30
    stderr = str(refused["_stderr"])
    assert "to kerneld; its verdict: damaged" in stderr, stderr
    (line,) = audit_lines(d)
    for part in (
        f"uid={os.geteuid()}(",
        f"repo={ACT}",
        f"commit={C1}",
        f"variant={CPU_VARIANT}",
        f"tree={hit.tree_digest}",
        # what the client found, without the tree's path
        "CorruptTree (KERNELD_VERIFY): __init__.py do(es) not match",
        "result=damaged",
    ):
        assert part in line, (part, line)
    # The daemon healed it: the next job verifies and loads the kernel.
    d.wait_for_log(f"report: tree {hit.tree_digest} healed: 1/1", 30)
    healed = _client(d, tmp_path, code, KERNELD_VERIFY="1")
    assert healed.get("name") == original.split(b"'")[1].decode(), healed
    assert len(audit_lines(d)) == 1

    # Without the knob the loader does not re-hash, so it reports nothing.
    assert "name" in _client(d, tmp_path, code)
    assert len(audit_lines(d)) == 1


PUBLIC = """
import json, os, time, kerneld_client
out = {{}}
kernel = kerneld_client.get_kernel({repo!r}, version=1, policy="error")
answer = kerneld_client.report_suspect(kernel.__file__, reason="looks off")
out["verdict"], out["detail"] = answer.verdict, answer.detail
try:
    kerneld_client.report_suspect("/etc/passwd")
except ValueError as exc:
    out["bad"] = str(exc)
os.environ["KERNELD_SOCKET"] = {nowhere!r}  # no daemon: answered at once, nothing raised
started = time.monotonic()
answer = kerneld_client.report_suspect({digest!r})
out["down"], out["down_s"] = answer.verdict, time.monotonic() - started
print(json.dumps(out))
"""


def test_the_public_report_suspect(
    make_daemon: Callable[..., DaemonProcess], kernel_mirror: Path, tmp_path: Path
) -> None:
    d = make_daemon(mirror_dirs=[kernel_mirror], config=NO_SCRUB)
    with d.kernels() as kernels:
        hit = kernels.Resolve(resolve_req(ACT, 1), timeout=TIMEOUT).kernel
    code = PUBLIC.format(repo=ACT, nowhere=str(tmp_path / "nowhere.sock"), digest=hit.tree_digest)
    out = _client(d, tmp_path, code)
    assert out["verdict"] == "intact", out
    assert "is neither a tree digest" in str(out["bad"])
    assert out["down"] == "unavailable" and float(str(out["down_s"])) < 1.0, out
    (line,) = audit_lines(d)
    assert f"tree={hit.tree_digest}" in line and "reason='looks off'" in line, line


@pytest.mark.parametrize(
    ("given", "digest"),
    [
        ("sha256:" + "a" * 64, "sha256:" + "a" * 64),
        ("b" * 64, "sha256:" + "b" * 64),
        (f"/var/lib/kerneld/store/v1/trees/{'c' * 64}/sub/__init__.py", "sha256:" + "c" * 64),
        (Path(f"/s/v1/trees/{'d' * 64}"), "sha256:" + "d" * 64),
    ],
)
def test_tree_digest_of(given: str | Path, digest: str) -> None:
    from kerneld_client._report import tree_digest_of

    assert tree_digest_of(given) == digest


@pytest.mark.parametrize("given", ["sha256:xyz", "/etc/passwd", f"/x/{'a' * 64}/y", "A" * 64])
def test_tree_digest_of_refuses_what_names_no_tree(given: str) -> None:
    from kerneld_client._report import tree_digest_of

    with pytest.raises(ValueError, match="neither a tree digest"):
        tree_digest_of(given)
