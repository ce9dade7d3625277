"""Resolution and fetch over the real store, the Hub test server and mirrors (issue 4)."""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from kerneld.mirror.upstream import MirrorDirUpstream, MirrorHttpUpstream
from kerneld.pipeline.fetch import Fetcher
from kerneld.pipeline.resolve import (
    DependencyCycle,
    FetchNotAllowed,
    KernelSpec,
    NoVariantFits,
    Resolver,
)
from kerneld.store import DeniedError, IntegrityError, SizeMismatchError, Store
from kerneld.upstream.errors import RevisionNotFound, UpstreamProtocolError, UpstreamUnavailable
from kerneld.upstream.hub import HubUpstream
from kerneld.upstream.retry import RetryPolicy
from kerneld_client.variants import PlatformFacts
from tests.fixtures_hub import REPO, VARIANT, SyntheticHub
from tests.support.hubtraffic import Fault
from tests.support.mirrors import variant, write_mirror
from tests.support.nginx import Nginx, nginx_binary

CPU = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, timeout=5)


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "store", min_age_s=0)
    yield s
    s.close()


@pytest.fixture
def hub(hub_server) -> HubUpstream:
    return HubUpstream(endpoint=hub_server.url, token=False, policy=FAST)


def _tree_files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _expected(synthetic_hub: SyntheticHub, rev: str) -> dict[str, bytes]:
    prefix = f"build/{VARIANT}/"
    return {p[len(prefix) :]: d for p, d in synthetic_hub.variant_files(rev).items()}


@pytest.mark.parametrize(
    ("spec", "rev"),
    [
        (KernelSpec(REPO, version=1), "v1"),
        (KernelSpec(REPO, version=2), "v2"),
        (KernelSpec(REPO, revision="main"), "main"),
        (KernelSpec(REPO, revision="v1.0.0"), "v1.0.0"),
        (KernelSpec(REPO, revision="feature/x"), "feature/x"),
    ],
)
def test_resolve_fetches_verified_tree(store, hub, synthetic_hub, spec, rev) -> None:
    res = Resolver(store, [hub]).resolve(spec, CPU, lease_ttl_s=60)
    assert res.commit == synthetic_hub.commits[rev]
    assert res.variant == VARIANT
    assert res.fetched is not None and res.fetched.upstream == "hub"
    assert _tree_files(res.hit.path) == _expected(synthetic_hub, rev)
    assert res.hit.lease is not None
    assert not res.stale


def test_resolve_by_commit_and_lock(store, hub, synthetic_hub) -> None:
    commit = synthetic_hub.commits["v2"]
    resolver = Resolver(store, [hub])
    assert resolver.resolve(KernelSpec(REPO, revision=commit), CPU).commit == commit
    assert resolver.resolve(KernelSpec(REPO, locked_commit=commit), CPU).commit == commit


def test_cache_hit_does_no_upstream_io(store, hub, hub_server) -> None:
    resolver = Resolver(store, [hub])
    first = resolver.resolve(KernelSpec(REPO, version=1), CPU)
    hub_server.reset_counts()
    second = resolver.resolve(KernelSpec(REPO, version=1), CPU)
    assert hub_server.total() == 0
    assert second.fetched is None
    assert second.hit.path == first.hit.path


def test_cold_fetch_request_count(store, hub, hub_server, synthetic_hub) -> None:
    """One refs listing (a version is a branch: the listing gives its commit and the versions
    clients are told about), two tree listings, one GET per file, no HEADs."""
    Resolver(store, [hub]).resolve(KernelSpec(REPO, version=1), CPU)
    files = len(_expected(synthetic_hub, "v1"))
    counts = hub_server.counts
    assert counts["refs"] == 1 and counts["info"] == 0
    assert store.names.upstream_versions(REPO) == [1, 2]
    assert counts["tree"] == 2
    assert counts["resolve_get"] == files
    assert counts["resolve_head"] == 0
    assert hub_server.total() == 3 + files


def test_concurrent_cold_requests_download_each_file_once(store, hub, hub_server) -> None:
    hub_server.latency_s = 0.01  # widen the race window
    resolver = Resolver(store, [hub])
    results, errors = [], []

    def work() -> None:
        try:
            results.append(resolver.resolve(KernelSpec(REPO, version=2), CPU))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len({r.hit.path for r in results}) == 1
    gets = [p for p, n in hub_server.path_counts.items() if p.startswith("GET /kernels/")]
    assert gets and all(hub_server.path_counts[p] == 1 for p in gets)
    # The ref lookup and the two listings are shared too, not repeated per caller.
    assert hub_server.counts["refs"] == 1
    assert hub_server.counts["tree"] == 2


def test_outage_after_fetch_serves_stale(store, hub, hub_server, synthetic_hub) -> None:
    clock = [1000.0]
    resolver = Resolver(store, [hub], ref_ttl_s=10, clock=lambda: clock[0])
    resolver.resolve(KernelSpec(REPO, version=1), CPU)
    clock[0] += 11
    hub_server.inject(Fault("*", "error"))
    res = resolver.resolve(KernelSpec(REPO, version=1), CPU)
    assert res.stale
    assert res.commit == synthetic_hub.commits["v1"]


def test_outage_without_cache_is_unavailable(store, hub, hub_server) -> None:
    hub_server.inject(Fault("*", "error"))
    with pytest.raises(UpstreamUnavailable):
        Resolver(store, [hub]).resolve(KernelSpec(REPO, version=1), CPU)


def test_malformed_ref_answer_serves_stale(store, hub, hub_server, synthetic_hub) -> None:
    # Found by the chaos harness (chaos/): a corrupted revision answer (invalid JSON) ended
    # resolution in StopIteration, an internal error, instead of serving the known commit.
    clock = [1000.0]
    resolver = Resolver(store, [hub], ref_ttl_s=10, clock=lambda: clock[0])
    resolver.resolve(KernelSpec(REPO, version=1), CPU)
    clock[0] += 11
    hub_server.inject(Fault("/api/kernels/*", "corrupt"))
    res = resolver.resolve(KernelSpec(REPO, version=1), CPU)
    assert res.stale
    assert res.commit == synthetic_hub.commits["v1"]


def test_malformed_ref_answer_without_cache_is_not_a_verdict(store, hub, hub_server) -> None:
    hub_server.inject(Fault("/api/kernels/*", "corrupt"))
    with pytest.raises(UpstreamProtocolError):
        Resolver(store, [hub]).resolve(KernelSpec(REPO, version=1), CPU)
    assert store.names.get_negative(REPO, "v1") is None  # not remembered as "no such revision"


def test_a_missing_version_names_the_versions_that_exist(store, hub) -> None:
    # Issue 18: `kernels` 0.17.2 says "Version 2 not found, available versions: 1".
    with pytest.raises(RevisionNotFound) as exc:
        Resolver(store, [hub]).resolve(KernelSpec(REPO, version=9), CPU)
    assert str(exc.value) == f"{REPO}@v9: Version 9 not found, available versions: 1, 2"
    # Remembered (negative cache) with the same words.
    with pytest.raises(RevisionNotFound) as again:
        Resolver(store, [hub]).resolve(KernelSpec(REPO, version=9), CPU)
    assert "available versions: 1, 2" in str(again.value)


def test_a_malformed_answer_once_is_asked_again(store, hub, hub_server, synthetic_hub) -> None:
    # Issue 19: in the chaos run every corrupted API answer was a fallback; one bad body (a
    # proxy or the network mangled it) is asked again once, persistent garbage still fails
    # (the test above).
    fault = hub_server.inject(Fault("/api/kernels/*", "corrupt", times=1))
    res = Resolver(store, [hub]).resolve(KernelSpec(REPO, version=1), CPU)
    assert fault.fired == 1
    assert res.commit == synthetic_hub.commits["v1"] and not res.stale


#: Both ways a file's bytes reach the store: straight from the upstream (small files) and read
#: ahead in a thread (large ones; here every file, threshold 0): the same checks either way.
READ_AHEAD = pytest.mark.parametrize("read_ahead", [False, True], ids=["inline", "read-ahead"])


def _resolver(store, hub, read_ahead: bool) -> Resolver:
    fetcher = Fetcher(store, [hub], read_ahead_min_size=0) if read_ahead else None
    return Resolver(store, [hub], fetch=fetcher)


@READ_AHEAD
@pytest.mark.parametrize("kind", ["error", "rate_limit", "reset", "truncate"])
def test_transient_download_faults_are_retried(
    store, hub, hub_server, synthetic_hub, kind, read_ahead
):
    fault = hub_server.inject(Fault("*/resolve/*/data.bin", kind, times=1, retry_after=0))
    res = _resolver(store, hub, read_ahead).resolve(KernelSpec(REPO, version=1), CPU)
    assert fault.fired == 1
    assert _tree_files(res.hit.path) == _expected(synthetic_hub, "v1")


@READ_AHEAD
def test_corruption_once_is_retried(store, hub, hub_server, synthetic_hub, read_ahead) -> None:
    hub_server.inject(Fault("*/resolve/*/data.bin", "corrupt", times=1))
    res = _resolver(store, hub, read_ahead).resolve(KernelSpec(REPO, version=1), CPU)
    assert _tree_files(res.hit.path) == _expected(synthetic_hub, "v1")


@READ_AHEAD
@pytest.mark.parametrize("path", ["data.bin", "_ops.py"])  # LFS sha256 and git sha1 checks
def test_persistent_corruption_never_reaches_a_tree(store, hub, hub_server, path, read_ahead):
    hub_server.inject(Fault(f"*/resolve/*/{path}", "corrupt"))
    with pytest.raises(IntegrityError):
        _resolver(store, hub, read_ahead).resolve(KernelSpec(REPO, version=1), CPU)
    assert store.index.trees("live") == []
    assert store.repair.verify().clean


def test_missing_revision_is_negatively_cached(store, hub, hub_server) -> None:
    resolver = Resolver(store, [hub])
    with pytest.raises(RevisionNotFound):
        resolver.resolve(KernelSpec(REPO, version=42), CPU)
    hub_server.reset_counts()
    with pytest.raises(RevisionNotFound, match="cached"):
        resolver.resolve(KernelSpec(REPO, version=42), CPU)
    assert hub_server.total() == 0


def test_denied_is_refused_before_any_request(store, hub, hub_server) -> None:
    store.names.deny(REPO, reason="bad build")
    with pytest.raises(DeniedError, match="bad build"):
        Resolver(store, [hub]).resolve(KernelSpec(REPO, version=1), CPU)
    assert hub_server.total() == 0


def test_no_fetch_allowed(store, hub, hub_server) -> None:
    with pytest.raises(FetchNotAllowed):
        Resolver(store, [hub]).resolve(KernelSpec(REPO, version=1), CPU, allow_fetch=False)
    assert hub_server.total() == 0


# -- mirrors and the chain ----------------------------------------------------------------------

ACT = "org/act"
DEP = "org/dep"
C1, C2, C3 = "a" * 40, "b" * 40, "c" * 40


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    root = tmp_path / "mirror"
    write_mirror(
        root,
        {
            ACT: {
                C1: {
                    "torch-universal": variant("_act_u"),
                    "torch213-cxx11-cpu-x86_64-linux": variant("_act_cpu213"),
                    "torch213-cxx11-cu130-x86_64-linux": variant("_act_cu130"),
                },
                C2: {"torch213-cxx11-cu130-x86_64-linux": variant("_act_cu_only")},
                C3: {"torch-cpu": variant("_act_dep", depends=[{"repo-id": DEP, "version": 1}])},
            },
            DEP: {
                C1: {"torch-cpu": variant("_dep_cpu", depends=[{"repo-id": ACT, "revision": C3}])}
            },
        },
        branches={ACT: {"v1": C1, "v2": C2, "v3": C3}, DEP: {"v1": C1}},
    )
    return root


def test_mirror_picks_best_variant(store, mirror) -> None:
    res = Resolver(store, [MirrorDirUpstream(mirror, policy=FAST)]).resolve(
        KernelSpec(ACT, version=1), CPU
    )
    assert res.variant == "torch213-cxx11-cpu-x86_64-linux"
    assert (res.hit.path / "__init__.py").read_text() == "NAME = '_act_cpu213'\n"
    rejected = {d.variant: d.reason for d in res.decisions if not d.accepted}
    assert "torch213-cxx11-cu130-x86_64-linux" in rejected


def test_no_compatible_variant_lists_reasons(store, mirror) -> None:
    with pytest.raises(NoVariantFits) as info:
        Resolver(store, [MirrorDirUpstream(mirror, policy=FAST)]).resolve(
            KernelSpec(ACT, version=2), CPU
        )
    assert [d.variant for d in info.value.decisions] == ["torch213-cxx11-cu130-x86_64-linux"]
    assert "cu130" in str(info.value) or "CUDA" in str(info.value)


def test_dependency_cycle_is_detected(store, mirror) -> None:
    with pytest.raises(DependencyCycle, match="org/act -> org/dep -> org/act"):
        Resolver(store, [MirrorDirUpstream(mirror, policy=FAST)]).resolve(
            KernelSpec(ACT, version=3), CPU
        )


def test_dependencies_are_resolved_first(store, tmp_path: Path) -> None:
    root = tmp_path / "m2"
    write_mirror(
        root,
        {
            ACT: {C1: {"torch-cpu": variant("_top", depends=[{"repo-id": DEP, "version": 1}])}},
            DEP: {C1: {"torch-cpu": variant("_bottom")}},
        },
        branches={ACT: {"v1": C1}, DEP: {"v1": C1}},
    )
    res = Resolver(store, [MirrorDirUpstream(root, policy=FAST)]).resolve(
        KernelSpec(ACT, version=1), CPU
    )
    assert [d.spec.repo_id for d in res.dependencies] == [DEP]
    assert store.catalog.lookup(DEP, C1, "torch-cpu") is not None


def _synthetic_mirror(root: Path, synthetic_hub: SyntheticHub) -> None:
    write_mirror(
        root,
        {REPO: {synthetic_hub.commits["v1"]: {VARIANT: _expected(synthetic_hub, "v1")}}},
        branches={REPO: {"v1": synthetic_hub.commits["v1"]}},
    )


def test_mirror_ahead_of_hub_saves_hub_downloads(store, hub, hub_server, synthetic_hub, tmp_path):
    _synthetic_mirror(tmp_path / "m", synthetic_hub)
    chain = [MirrorDirUpstream(tmp_path / "m", name="site", policy=FAST), hub]
    res = Resolver(store, chain).resolve(KernelSpec(REPO, version=1), CPU)
    assert res.fetched is not None and res.fetched.upstream == "site"
    assert hub_server.total() == 0
    # v2 is not in the mirror: the chain falls through to the Hub.
    res2 = Resolver(store, chain).resolve(KernelSpec(REPO, version=2), CPU)
    assert res2.fetched is not None and res2.fetched.upstream == "hub"


def test_corrupt_mirror_falls_through_to_hub(store, hub, hub_server, synthetic_hub, tmp_path):
    _synthetic_mirror(tmp_path / "m", synthetic_hub)
    data = _expected(synthetic_hub, "v1")["data.bin"]
    blob = tmp_path / "m" / "blobs" / "sha256"
    sha = hashlib.sha256(data).hexdigest()
    target = blob / sha[:2] / sha
    target.chmod(0o644)
    target.write_bytes(b"X" + data[1:])
    chain = [MirrorDirUpstream(tmp_path / "m", name="site", policy=FAST), hub]
    res = Resolver(store, chain).resolve(KernelSpec(REPO, version=1), CPU)
    assert res.fetched is not None and res.fetched.upstream == "hub"
    assert _tree_files(res.hit.path) == _expected(synthetic_hub, "v1")


def test_http_mirror_through_nginx(store, hub, hub_server, synthetic_hub, tmp_path):
    if nginx_binary() is None:
        pytest.skip("nginx is not installed; scripts/bootstrap installs it")
    _synthetic_mirror(tmp_path / "m", synthetic_hub)
    with Nginx(tmp_path / "m", tmp_path / "nginx") as server:
        chain = [MirrorHttpUpstream(server.url, name="http-site", policy=FAST), hub]
        res = Resolver(store, chain).resolve(KernelSpec(REPO, version=1), CPU)
    assert res.fetched is not None and res.fetched.upstream == "http-site"
    assert hub_server.total() == 0
    assert _tree_files(res.hit.path) == _expected(synthetic_hub, "v1")


def test_a_fetcher_without_upstreams_is_import_only(store) -> None:
    """`upstream = []`: a miss is an outage that names the way kernels arrive, not a crash."""
    with pytest.raises(UpstreamUnavailable, match="import-only"):
        Fetcher(store, []).fetch_variant(REPO, "a" * 40, "torch-cpu")


def test_no_fetch_on_an_unlisted_commit_is_fetch_not_allowed(store, hub, hub_server, synthetic_hub):
    """A commit this host never listed is a miss the caller may not fill, not 'no variant'."""
    commit = synthetic_hub.commits["v2"]
    with pytest.raises(FetchNotAllowed, match="no variant of this commit"):
        Resolver(store, [hub]).resolve(KernelSpec(REPO, revision=commit), CPU, allow_fetch=False)
    assert hub_server.total() == 0


class _RendezvousUpstream(MirrorDirUpstream):
    """A real mirror whose downloads wait until `peers` of them are open at once: a fetcher
    that downloads one file at a time never gets past the first (the barrier times out)."""

    def __init__(self, root: Path, peers: int, fail: str | None = None) -> None:
        super().__init__(root, policy=FAST)
        self.barrier = threading.Barrier(peers, timeout=10)
        self.fail = fail
        self.opened: list[str] = []

    def open_file(self, repo_id, commit, variant, file, *, offset=0):
        self.opened.append(file.path)
        if file.path == self.fail:
            raise UpstreamUnavailable("injected", upstream=self.name, repo_id=repo_id)
        self.barrier.wait()
        return super().open_file(repo_id, commit, variant, file, offset=offset)


def test_variant_files_download_in_parallel(store, mirror) -> None:
    variant_name = "torch213-cxx11-cpu-x86_64-linux"
    up = _RendezvousUpstream(mirror, peers=2)
    files = up.list_files(ACT, C1, variant_name)
    assert len(files) >= 2
    events = []
    result = Fetcher(store, [up], parallel_files=2).fetch_variant(
        ACT, C1, variant_name, progress=events.append
    )
    assert result.files_downloaded == len(files)
    done = [e for e in events if e.kind == "file-done"]
    assert [e.files_done for e in done] == list(range(1, len(files) + 1))
    assert done[-1].bytes_done == sum(f.size for f in files)
    # The published tree holds exactly the mirror's files, whatever order downloads finished in.
    assert _tree_files(result.tree.path) == variant("_act_cpu213")  # what `mirror` wrote


def test_a_failed_file_fails_the_variant_and_publishes_nothing(store, mirror) -> None:
    variant_name = "torch213-cxx11-cpu-x86_64-linux"
    files = MirrorDirUpstream(mirror, policy=FAST).list_files(ACT, C1, variant_name)
    up = _RendezvousUpstream(mirror, peers=1, fail=files[0].path)
    with pytest.raises(UpstreamUnavailable):
        Fetcher(store, [up], parallel_files=4, attempts_per_file=1).fetch_variant(
            ACT, C1, variant_name
        )
    assert store.catalog.lookup(ACT, C1, variant_name) is None


class _Overlong(MirrorDirUpstream):
    """Sends a file's bytes and then more without end, past the size it listed (a broken or
    hostile server); records each stream it closed."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, policy=FAST)
        self.opened: list[str] = []
        self.closed: list[str] = []

    @contextmanager
    def _endless(self, repo_id, commit, variant, file, offset):
        self.opened.append(file.path)
        try:
            with super().open_file(repo_id, commit, variant, file, offset=offset) as chunks:

                def more():
                    yield from chunks
                    while True:
                        yield b"x" * 65536

                yield more()
        finally:
            self.closed.append(file.path)

    def open_file(self, repo_id, commit, variant, file, *, offset=0):
        return self._endless(repo_id, commit, variant, file, offset)


def test_a_body_past_its_size_stops_the_read_ahead_and_publishes_nothing(store, mirror) -> None:
    """The size cap holds with the reader in its own thread: the consumer refuses the byte past
    the listed size, and the reader, which would read forever, is stopped and its stream
    closed before the fetch returns."""
    variant_name = "torch213-cxx11-cpu-x86_64-linux"
    up = _Overlong(mirror)
    fetcher = Fetcher(store, [up], read_ahead_min_size=0, attempts_per_file=2, parallel_files=1)
    with pytest.raises(SizeMismatchError):
        fetcher.fetch_variant(ACT, C1, variant_name)
    assert up.opened and sorted(up.closed) == sorted(up.opened)
    assert not [t for t in threading.enumerate() if t.name == "kerneld-fetch-read"]
    assert store.catalog.lookup(ACT, C1, variant_name) is None
