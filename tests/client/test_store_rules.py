"""What the warm path refuses or treats as a miss: untrusted paths, denies, devices the build does
not support, a better variant not cached yet, a tree GC is removing; and kernel-depends order.

In the test process: a refused kernel is never imported, so nothing is left behind; the kernels
that do load here are small synthetic pure-Python ones with ids unique to their test.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.store import Store
from kerneld_client import (
    DaemonUnavailable,
    KernelDenied,
    KernelError,
    NoCompatibleVariant,
    UntrustedPath,
    _config,
    _path_trust,
    _rpc,
    _warm_trust,
    get_kernel,
    get_kernel_dep,
    has_kernel,
    loaded_kernels,
    locations,
)
from kerneld_client.loading import call, loaded
from kerneld_client.platform import platform_facts, set_platform_facts
from kerneld_client.variants import Backend, BackendType, PlatformFacts
from tests.client.support import (
    ACTIVATION,
    Populated,
    client_env,
    publish_synthetic,
    run_client,
    synthetic_metadata,
)
from tests.support.hubserver import HubServer

pytestmark = pytest.mark.filterwarnings("ignore::kerneld_client.KernelFallbackWarning")
COMMIT = "c" * 40
ORG = "kerneld-tests"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Client settings for a store at tmp_path/store; no daemon. Yields the store root."""
    for key in [k for k in os.environ if k.startswith("KERNELD_")]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNELD_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("KERNELD_SOCKET", str(tmp_path / "run" / "kerneld.sock"))
    monkeypatch.setenv("KERNELD_BYTECODE_CACHE", "off")
    _reset()
    platform_facts()
    yield tmp_path / "store"
    set_platform_facts(None)
    _reset()


def _reset() -> None:
    _rpc.reset_backoff()
    call._memo.clear()
    _config._warned.clear()


def _activation_tree(store: Path, commit: str) -> tuple[Path, dict]:
    org, name = ACTIVATION.split("/")
    doc = json.loads((store / "index" / "v1" / org / f"{name}.json").read_text())
    variants = doc["commits"][commit]["variants"]
    best = next(v for n, v in variants.items() if n.startswith("torch2"))
    return store / best["tree"], doc


def _not_imported(store: Path, commit: str) -> None:
    """No module of this process comes from the refused tree. (Its id may well be in
    sys.modules: another test file on this worker may have loaded the same build from elsewhere.)
    """
    tree, _ = _activation_tree(store, commit)
    root = os.path.realpath(tree) + os.sep
    loaded = [
        name
        for name, module in list(sys.modules.items())
        if os.path.realpath(getattr(module, "__file__", None) or os.devnull).startswith(root)
    ]
    assert not loaded, f"a refused kernel was imported: {loaded}"


@pytest.fixture
def store_copy(fresh_store: Populated, env: Path) -> Populated:
    shutil.move(fresh_store.root, env)
    return Populated(env, fresh_store.commits)


# ------------------------------------------------------------------------------- trust


@pytest.mark.parametrize("target", ["tree", "file"])
def test_writable_tree_is_refused(store_copy: Populated, target: str) -> None:
    commit = store_copy.commits[(ACTIVATION, "v1")]
    tree, _ = _activation_tree(store_copy.root, commit)
    (tree if target == "tree" else tree / "_ops.py").chmod(0o777 if target == "tree" else 0o664)
    with pytest.raises(UntrustedPath, match="writable by group or others"):
        get_kernel(ACTIVATION, version=1, policy="error")
    _not_imported(store_copy.root, commit)


def test_foreign_owner_is_refused(store_copy: Populated) -> None:
    commit = store_copy.commits[(ACTIVATION, "v1")]
    tree, _ = _activation_tree(store_copy.root, commit)
    os.chown(tree / "__init__.py", 65534, 65534)
    with pytest.raises(UntrustedPath, match="owned by uid 65534"):
        get_kernel(ACTIVATION, version=1, policy="error")
    _not_imported(store_copy.root, commit)


def test_symlink_out_of_the_store_is_refused(store_copy: Populated, tmp_path: Path) -> None:
    commit = store_copy.commits[(ACTIVATION, "v1")]
    tree, _ = _activation_tree(store_copy.root, commit)
    outside = tmp_path / "evil"
    outside.mkdir()
    shutil.copy(tree / "_ops.py", outside / "_ops.py")
    (tree / "_ops.py").unlink()
    (tree / "_ops.py").symlink_to(outside / "_ops.py")
    with pytest.raises(UntrustedPath, match="symlink out of the tree"):
        get_kernel(ACTIVATION, version=1, policy="error")
    _not_imported(store_copy.root, commit)


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_a_tree_swapped_for_a_symlink_is_refused(
    store_copy: Populated, tmp_path: Path, where: str
) -> None:
    """kerneld never links a tree: a tree folder replaced by a symlink to the very same files,
    moved elsewhere in the store or out of it, is refused (the warm path does not resolve the
    tree's path; its walk down from the root finds the link)."""
    commit = store_copy.commits[(ACTIVATION, "v1")]
    tree, _ = _activation_tree(store_copy.root, commit)
    moved = store_copy.root / "v1" / "moved" if where == "inside" else tmp_path / "moved"
    shutil.move(tree, moved)
    tree.symlink_to(moved, target_is_directory=True)
    with pytest.raises(UntrustedPath, match="is not a directory"):
        get_kernel(ACTIVATION, version=1, policy="error")
    _not_imported(store_copy.root, commit)


@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_index_path_outside_the_root_is_refused(
    store_copy: Populated, tmp_path: Path, how: str
) -> None:
    """A (tampered) index entry pointing outside the store: refused even though the folder is a
    perfect copy of the real tree."""
    commit = store_copy.commits[(ACTIVATION, "v1")]
    tree, doc = _activation_tree(store_copy.root, commit)
    copy = tmp_path / "elsewhere"
    shutil.copytree(tree, copy)
    for v in doc["commits"][commit]["variants"].values():
        v["tree"] = "../elsewhere" if how == "relative" else str(copy)
    org, name = ACTIVATION.split("/")
    path = store_copy.root / "index" / "v1" / org / f"{name}.json"
    path.write_text(json.dumps(doc))
    path.chmod(0o644)
    with pytest.raises(UntrustedPath, match="outside the store root"):
        get_kernel(ACTIVATION, version=1, policy="error")
    _not_imported(store_copy.root, commit)


def test_index_writable_by_others_is_refused(store_copy: Populated) -> None:
    org, name = ACTIVATION.split("/")
    (store_copy.root / "index" / "v1" / org / f"{name}.json").chmod(0o666)
    with pytest.raises(UntrustedPath, match="published index"):
        get_kernel(ACTIVATION, version=1, policy="error")


def test_world_writable_store_root_is_refused(store_copy: Populated) -> None:
    store_copy.root.chmod(0o777)
    with pytest.raises(UntrustedPath, match="store root"):
        get_kernel(ACTIVATION, version=1, policy="error")
    # Under the default policy an untrusted store is just another reason to fall back.
    assert get_kernel(ACTIVATION, version=1, fallback="torch") == "torch"


# ------------------------------------------------------------------------------- denies and misses


def test_denies_in_the_index_are_honoured(
    store_copy: Populated, example_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(store_copy.root) as store:
        store.names.deny(ACTIVATION, "v2", reason="broken build")
    with pytest.raises(KernelDenied, match="broken build"):
        get_kernel(ACTIVATION, version=2, policy="error")
    assert has_kernel(ACTIVATION, version=2) is False
    assert has_kernel(ACTIVATION, version=1) is True
    with Store.open(store_copy.root) as store:
        store.names.deny(ACTIVATION, reason="all of it")
    # Not even the `hub` fallback may fetch a denied kernel, by any spelling of its id (the Hub
    # resolves them all to it): the caller's fallback is returned.
    monkeypatch.setenv("HF_ENDPOINT", example_server.url)
    example_server.reset_counts()
    for repo in (ACTIVATION, ACTIVATION.upper()):
        assert get_kernel(repo, version=1, policy="hub", fallback="torch") == "torch"
        with pytest.raises(KernelDenied, match="all of it"):  # not a failed download
            get_kernel(repo, version=1, policy="hub")
    assert example_server.total() == 0
    with pytest.raises(KernelDenied, match="all of it"):
        get_kernel(ACTIVATION, version=1, policy="error")


def test_tree_being_collected_is_a_miss(store_copy: Populated) -> None:
    """GC unlinks the lock file (holding LOCK_EX) before removing a tree: the client then asks
    the daemon instead of importing a tree that is going away."""
    commit = store_copy.commits[(ACTIVATION, "v1")]
    tree, _ = _activation_tree(store_copy.root, commit)
    (store_copy.root / "locks" / f"{tree.name}.lock").unlink()
    with pytest.raises(DaemonUnavailable):
        get_kernel(ACTIVATION, version=1, policy="error")
    _not_imported(store_copy.root, commit)


def _pure_kernel(kid: str, name: str, *, body: str = "", **meta: object) -> dict[str, bytes]:
    files = {
        "__init__.py": (f"KID = {kid!r}\n" + body).encode(),
        "_version.py": b"VERSION = 1\n",
    }
    backend = meta.pop("backend", {"type": "cpu"})
    files["metadata.json"] = synthetic_metadata(
        files,
        kid=kid,
        name=name,
        backend=backend,  # type: ignore[arg-type]
        **meta,  # type: ignore[arg-type]
    )
    return files


def test_the_store_root_is_checked_once_and_again_when_it_changes(
    env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full check of the store root (its real path, owner, mode and every directory above
    it) runs once per process and store: a job's next kernel, or a forked worker's, does not pay
    it again. A chmod of the root, or another KERNELD_STORE, is checked in full at the next
    load; what lies below the root is checked on every load regardless."""
    monkeypatch.setattr(loaded, "_root_memo", None)
    checked: list[Path] = []
    full_check = _path_trust.store_root

    def counting(path: Path) -> _path_trust.StoreRoot:
        checked.append(path)
        return full_check(path)

    monkeypatch.setattr(_path_trust, "store_root", counting)
    repos = {}
    for kid in ("_once_a", "_once_b", "_once_c", "_once_d"):
        repos[kid] = f"{ORG}/{kid.strip('_').replace('_', '-')}"
        files = _pure_kernel(kid, kid.strip("_"))
        publish_synthetic(env, repos[kid], COMMIT, {"torch-universal": files}, refs={"v1": COMMIT})
    assert get_kernel(repos["_once_a"], version=1, policy="error").KID == "_once_a"
    assert get_kernel(repos["_once_b"], version=1, policy="error").KID == "_once_b"
    assert len(checked) == 1

    env.chmod(0o777)  # the root itself changed: checked again, and refused
    with pytest.raises(UntrustedPath, match="store root"):
        get_kernel(repos["_once_c"], version=1, policy="error")
    env.chmod(0o755)
    assert get_kernel(repos["_once_c"], version=1, policy="error").KID == "_once_c"
    assert len(checked) == 3

    alias = tmp_path / "alias"  # another name for the same store: a new full check
    alias.symlink_to(env)
    monkeypatch.setenv("KERNELD_STORE", str(alias))
    assert get_kernel(repos["_once_d"], version=1, policy="error").KID == "_once_d"
    assert checked[-1] == alias and len(checked) == 4
    monkeypatch.chdir(tmp_path)  # a relative name is another store after a chdir
    monkeypatch.setenv("KERNELD_STORE", "alias")
    first = locations.store_identity()
    monkeypatch.chdir(env)
    assert locations.store_identity() != first
    assert "_once_a" in sys.modules and "_once_d" in sys.modules


def test_every_directory_above_the_store_and_the_advert_is_checked(
    env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directories above the store root and above the daemon's advert: one writable by
    others refuses the store, by the warm fast path (which looks at each directory once per
    check, the two chains sharing their top, and skips `realpath` where its walk met no link)
    as by the staged loader, unless it is sticky with entries of trusted owners (as /tmp is); a
    symlink on the way is resolved first."""
    shared = tmp_path / "shared"
    store, sock = shared / "store", shared / "run" / "kerneld.sock"
    repo = f"{ORG}/above"
    files = _pure_kernel("_above_a1", "above")
    publish_synthetic(store, repo, COMMIT, {"torch-universal": files}, refs={"v1": COMMIT})
    sock.parent.mkdir()
    (tmp_path / "link").symlink_to(shared, target_is_directory=True)
    doc = {
        "format": locations.ADVERT_FORMAT,
        "version": 1,
        "store_root": str(tmp_path / "link" / "store"),  # through the symlink
        "index_dir": str(store / "index"),
        "user_socket": str(sock),
        "admin_socket": str(sock.with_name("admin.sock")),
        "pid": os.getpid(),
        "daemon_version": "0",
    }
    locations.advert_path(sock).write_text(json.dumps(doc))
    monkeypatch.delenv("KERNELD_STORE")
    monkeypatch.setenv("KERNELD_SOCKET", str(sock))

    def fast() -> str | None:
        """The fast path's full check of the store root (no memo): its real path, or None."""
        monkeypatch.setattr(_warm_trust, "_root_memo", None)
        monkeypatch.setattr(loaded, "_root_memo", None)
        try:
            return _warm_trust.store_root()[0]
        except _warm_trust.Miss:
            return None

    assert fast() == str(store)
    for above in (shared, sock.parent):
        above.chmod(0o777)
        assert fast() is None, above
        with pytest.raises(KernelError):
            get_kernel(repo, version=1, policy="error")
        assert "_above_a1" not in sys.modules
        above.chmod(0o1777)  # sticky, and what lies below is this user's
        assert fast() == str(store), above
        above.chmod(0o755)
    assert get_kernel(repo, version=1, policy="error").KID == "_above_a1"


def test_the_store_identity_follows_the_daemons_advert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without KERNELD_STORE, the advert names the store: a daemon that writes a new one (a
    restart, another store), or a chmod or chown of it, changes the identity the check is
    memoised under; the same advert untouched keeps it. No advert: no identity (no memo)."""
    monkeypatch.delenv("KERNELD_STORE", raising=False)
    sock = tmp_path / "run" / "kerneld.sock"
    sock.parent.mkdir()
    monkeypatch.setenv("KERNELD_SOCKET", str(sock))
    advert = locations.advert_path(sock)
    assert locations.store_identity() is None and locations.named_store()[1] is None
    doc = {
        "format": locations.ADVERT_FORMAT,
        "version": 1,
        "store_root": str(tmp_path / "store"),
        "index_dir": str(tmp_path / "store" / "index"),
        "user_socket": str(sock),
        "admin_socket": str(sock.with_name("admin.sock")),
        "pid": os.getpid(),
        "daemon_version": "0",
    }
    advert.write_text(json.dumps(doc))
    first = locations.store_identity()
    # the full check's own read gives the same identity, so later loads find the memo
    assert locations.named_store() == (tmp_path / "store", first)
    assert first is not None and first == locations.store_identity()
    advert.chmod(0o600)
    chmodded = locations.store_identity()
    assert chmodded != first
    replacement = tmp_path / "run" / "new.json"
    replacement.write_text(json.dumps(doc))
    os.replace(replacement, advert)  # how the daemon writes it: a new inode
    assert locations.store_identity() not in (first, chmodded)


def test_better_variant_upstream_is_a_miss(env: Path) -> None:
    """Only torch-universal is cached, but the upstream also has torch-cpu (preferred on a CPU
    process): that is a miss (the daemon would fetch torch-cpu), not a load of the worse one."""
    repo = f"{ORG}/better"
    files = _pure_kernel("_better_u1", "better")
    publish_synthetic(
        env,
        repo,
        COMMIT,
        {"torch-universal": files},
        refs={"v1": COMMIT},
        upstream_variants=["torch-cpu", "torch-universal"],
    )
    with pytest.raises(DaemonUnavailable):
        get_kernel(repo, version=1, policy="error")
    assert "_better_u1" not in sys.modules
    with Store.open(env) as store:  # the upstream has nothing better after all
        store.names.set_upstream_variants(repo, COMMIT, ["torch-universal"])
    _reset()
    assert get_kernel(repo, version=1, policy="error").KID == "_better_u1"


# ------------------------------------------------------------------------------- devices


def _cuda_facts(capability: str) -> PlatformFacts:
    base = platform_facts()
    return PlatformFacts(
        cpu=base.cpu,
        os=base.os,
        torch_version=(2, 13),
        cxx11_abi=True,
        backend=Backend(BackendType.CUDA, (13, 0)),
        device_capabilities=(capability,),
    )


def _publish_cuda_kernel(store: Path, tmp_path: Path, kid: str) -> tuple[str, Path]:
    repo = f"{ORG}/{kid.strip('_').replace('_', '-')}"
    marker = tmp_path / f"{kid}.imported"
    body = f"open({str(marker)!r}, 'w').write('imported')\n"
    files = _pure_kernel(kid, "cudaonly", body=body, backend={"type": "cuda", "archs": ["8.0"]})
    publish_synthetic(
        store,
        repo,
        COMMIT,
        {"torch-cuda": files},
        refs={"v1": COMMIT},
        upstream_variants=["torch-cuda"],
    )
    return repo, marker


def test_capability_mismatch_is_refused_before_import(env: Path, tmp_path: Path) -> None:
    repo, marker = _publish_cuda_kernel(env, tmp_path, "_cudaonly_a1")
    set_platform_facts(_cuda_facts("9.0"))  # an sm_90 device; the build declares 8.0 only
    with pytest.raises(NoCompatibleVariant) as info:
        get_kernel(repo, version=1, policy="error")
    [reason] = info.value.reasons
    assert reason.variant == "torch-cuda" and not reason.accepted
    assert "CUDA capability 9.0 is not supported by the build's archs: 8.0" in reason.reason
    assert not marker.exists() and "_cudaonly_a1" not in sys.modules
    assert has_kernel(repo, version=1) is False
    assert has_kernel(repo, version=1, check_arch=False) is True
    set_platform_facts(_cuda_facts("8.6"))  # same major, newer minor: covered by "8.0"
    assert get_kernel(repo, version=1, policy="error").KID == "_cudaonly_a1"
    assert marker.read_text() == "imported"


def test_check_arch_false_loads_anyway(env: Path, tmp_path: Path) -> None:
    repo, marker = _publish_cuda_kernel(env, tmp_path, "_cudaonly_b1")
    set_platform_facts(_cuda_facts("9.0"))
    assert get_kernel(repo, version=1, policy="error", check_arch=False).KID == "_cudaonly_b1"
    assert marker.exists()


def test_capability_from_platform_json_in_a_fresh_process(env: Path, tmp_path: Path) -> None:
    repo, marker = _publish_cuda_kernel(env, tmp_path, "_cudaonly_c1")
    facts = {"torch_version": "2.13", "cxx11_abi": True, "backend": "cu130"}
    results = {}
    for cap in ("9.0", "8.9"):
        environ = client_env(
            env, tmp_path, KERNELD_PLATFORM_JSON=json.dumps({**facts, "device_capabilities": [cap]})
        )
        results[cap] = run_client(
            f"""
import json, sys
import kerneld_client
try:
    m = kerneld_client.get_kernel("{repo}", version=1, policy="error")
    out = {{"kid": m.KID}}
except kerneld_client.NoCompatibleVariant as exc:
    out = {{"error": str(exc)}}
out["torch"] = "torch" in sys.modules
print(json.dumps(out))
""",
            environ,
        )
        if cap == "9.0":
            assert not marker.exists()
    assert "not supported by the build's archs" in results["9.0"]["error"]
    assert results["8.9"]["kid"] == "_cudaonly_c1" and marker.exists()
    assert results["9.0"]["torch"] is False  # the facts were injected: torch never imported


# ------------------------------------------------------------------------------- kernel-depends


def test_kernel_depends_are_imported_first(env: Path) -> None:
    dep_repo, main_repo = f"{ORG}/dep-a", f"{ORG}/main-b"
    dep = _pure_kernel("_dep_a_d1", "dep-a", body="def twice(x):\n    return 2 * x\n")
    main_body = (
        "import sys\n"
        "assert '_dep_a_d1' in sys.modules, 'dependency not imported first'\n"
        "from kernels import get_kernel_dep\n"
        "DEP = get_kernel_dep('kerneld-tests/dep-a')\n"
        "import kerneld_client\n"
        "SAME = kerneld_client.get_kernel_dep('kerneld-tests/dep-a')\n"
        "try:\n"
        "    kerneld_client.get_kernel_dep('kerneld-tests/undeclared')\n"
        "except RuntimeError as exc:\n"
        "    UNDECLARED = str(exc)\n"
    )
    main = _pure_kernel(
        "_main_b_d1",
        "main-b",
        body=main_body,
        depends=[{"repo-id": dep_repo, "version": 1}],
    )
    publish_synthetic(
        env,
        dep_repo,
        COMMIT,
        {"torch-universal": dep},
        refs={"v1": COMMIT},
        upstream_variants=["torch-universal"],
    )
    commit_b = "d" * 40
    publish_synthetic(
        env,
        main_repo,
        commit_b,
        {"torch-universal": main},
        refs={"v3": commit_b},
        upstream_variants=["torch-universal"],
    )
    mod = get_kernel(main_repo, version=3, policy="error")
    assert mod.DEP.twice(21) == 42
    assert mod.SAME is mod.DEP  # kerneld's get_kernel_dep sees the same module as kernels'
    assert "'kerneld-tests/undeclared' not found" in mod.UNDECLARED
    assert "declares: kerneld-tests/dep-a" in mod.UNDECLARED
    with pytest.raises(RuntimeError, match="only works during kernel loading"):
        get_kernel_dep(dep_repo)
    order = [k.repo_id for k in loaded_kernels() if k.repo_id in (dep_repo, main_repo)]
    assert order == [dep_repo, main_repo]


def test_check_arch_applies_to_a_build_already_imported(env: Path, tmp_path: Path) -> None:
    """A build this process imported with check_arch=False is not handed to a later call that
    checks: the device check runs on every call, as in `kernels` (its arch check comes before
    its import cache). Found by the CUDA example's check_arch test (test_cuda_build.py)."""
    repo, _marker = _publish_cuda_kernel(env, tmp_path, "_cudaonly_d1")
    set_platform_facts(_cuda_facts("9.0"))
    assert get_kernel(repo, version=1, policy="error", check_arch=False).KID == "_cudaonly_d1"
    with pytest.raises(NoCompatibleVariant, match="not supported by the build's archs: 8.0"):
        get_kernel(repo, version=1, policy="error")
    with pytest.raises(NoCompatibleVariant, match="not supported by the build's archs: 8.0"):
        get_kernel(repo, revision="v1", policy="error")
    set_platform_facts(_cuda_facts("8.6"))
    assert get_kernel(repo, version=1, policy="error").KID == "_cudaonly_d1"
