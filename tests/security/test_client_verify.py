"""`KERNELD_VERIFY=1`: a tree whose bytes changed on disk is never imported, and the client
refuses paths an impostor on the socket hands it.

The trust checks every load does (inside the store, owner, modes, no symlink out) cannot see a
bit flipped in place by a failing disk, or a file rewritten by root with its mode restored;
these tests show that (the tampered kernel loads without the knob) and that the re-hash catches
each kind of change before a single byte of the kernel runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from kerneld.store import Store
from kerneld_client import CorruptTree, UntrustedPath, _config, _path_trust, _rpc, get_kernel
from kerneld_client.loading import call
from kerneld_client.platform import set_platform_facts
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto import kerneld_pb2_grpc as pb_grpc
from kerneld_client.tree_verify import verify_tree
from kerneld_client.variants import Backend, BackendType, PlatformFacts
from tests.client.support import publish_synthetic, synthetic_metadata

pytestmark = pytest.mark.filterwarnings("ignore::kerneld_client.KernelFallbackWarning")


def _trees(store: Path) -> list[tuple[Path, str]]:
    """(path, digest) of every live tree of a store, from its index."""
    with Store.open(store, read_only=True) as s:
        return [(s.layout.tree_path(t.digest), f"sha256:{t.digest}") for t in s.index.trees("live")]


def _writable(path: Path) -> tuple[int, int]:
    """Make the file and its folder writable for a moment; their old modes."""
    old = (path.parent.stat().st_mode & 0o7777, path.stat().st_mode & 0o7777)
    path.parent.chmod(0o755)
    path.chmod(0o644)
    return old


def _restore(path: Path, old: tuple[int, int], mtime_ns: int) -> None:
    os.utime(path, ns=(mtime_ns, mtime_ns))
    path.chmod(old[1])
    path.parent.chmod(old[0])


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Flip one bit in place, keeping size, mode and mtime: what a rotting disk does."""
    st = path.stat()
    old = _writable(path)
    with open(path, "r+b") as f:
        at = st.st_size // 2 if offset is None else offset
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    _restore(path, old, st.st_mtime_ns)


def test_every_published_tree_verifies_and_both_sides_agree(example_store: Path) -> None:
    """The client rebuilds the same manifest digest the store computed for every example
    variant (C++ `.so` copies at 0555, hard-linked sources at 0444), and checks
    metadata.json's digest as well. The cost is printed for the record."""
    trees = _trees(example_store)
    assert len(trees) >= 2
    for path, digest in trees:
        check = verify_tree(path, digest)
        assert check.tree_checked and check.metadata_checked
        assert check.files == sum(1 for p in path.rglob("*") if p.is_file())
        best = min(_timed(functools.partial(verify_tree, path, digest)) for _ in range(5))
        print(f"KERNELD_VERIFY {path.name[:12]}: {check.files} files {check.bytes} B {best:.3f} ms")


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _so_tree(store: Path) -> tuple[Path, str]:
    return next((p, d) for p, d in _trees(store) if any(p.glob("*.so")))


def _tamper(tree: Path, how: str) -> None:
    so = next(tree.glob("*.so"))
    ops = tree / "_ops.py"
    if how == "flip-so":
        flip_byte(so)
    elif how == "flip-metadata":
        flip_byte(tree / "metadata.json", offset=3)
    elif how == "mode":
        ops.chmod(0o555)  # still not writable: the trust checks accept it
    elif how == "extra-file":
        tree.chmod(0o755)
        (tree / "sitecustomize.py").write_text("import os\n")
        (tree / "sitecustomize.py").chmod(0o444)
        tree.chmod(0o555)
    elif how == "missing-file":
        tree.chmod(0o755)
        (tree / "layers.py").unlink()
        tree.chmod(0o555)
    elif how == "symlink":
        tree.chmod(0o755)
        data = ops.read_bytes()
        ops.unlink()
        (tree / "_ops_real.py").write_bytes(data)
        (tree / "_ops_real.py").chmod(0o444)
        ops.symlink_to("_ops_real.py")  # inside the tree: the trust checks accept it
        tree.chmod(0o555)
    elif how == "rewrite-same-size":
        st = ops.stat()
        old = _writable(ops)
        text = ops.read_bytes()
        ops.write_bytes(text.replace(b"torch", b"tOrch", 1))
        _restore(ops, old, st.st_mtime_ns)
    else:  # pragma: no cover
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "flip-so",
        "flip-metadata",
        "mode",
        "extra-file",
        "missing-file",
        "symlink",
        "rewrite-same-size",
    ],
)
def test_any_change_to_a_tree_is_caught(example_copy: Path, how: str) -> None:
    tree, digest = _so_tree(example_copy)
    verify_tree(tree, digest)
    _tamper(tree, how)
    # Invisible to the per-load trust checks (a symlink is refused by them already)...
    root = _path_trust.store_root(example_copy)
    if how == "symlink":
        with pytest.raises(UntrustedPath):
            _path_trust.check_tree(root, tree)
    else:
        _path_trust.check_tree(root, tree)
    # ...but not to the re-hash.
    with pytest.raises(CorruptTree) as info:
        verify_tree(tree, digest, repo_id="org/k", revision="v1", variant=tree.name[:8])
    message = str(info.value)
    assert "failed verification" in message and "org/k@v1" in message
    assert "kerneldctl verify --repair" in message  # says what to do
    if how in ("flip-so", "rewrite-same-size", "missing-file", "extra-file"):
        # metadata.json's digest names the file (a garbled metadata.json cannot name anything)
        named = {"flip-so": ".so", "rewrite-same-size": "_ops.py"}.get(how, "")
        assert "metadata.json's digest" in message and named in message


def test_a_folder_without_a_tree_digest_is_checked_against_its_metadata(
    example_copy: Path, tmp_path: Path
) -> None:
    """The `hub` fallback's cache has no tree digest: metadata.json's digest is the check there
    (and a folder with neither is reported as unverifiable, not as verified)."""
    tree, _digest = _so_tree(example_copy)
    check = verify_tree(tree, None)
    assert check.metadata_checked and not check.tree_checked
    flip_byte(next(tree.glob("*.so")))
    with pytest.raises(CorruptTree, match=r"\.so do\(es\) not match metadata\.json's digest"):
        verify_tree(tree, None)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "__init__.py").write_text("X = 1\n")
    (bare / "metadata.json").write_text('{"id": "_bare"}')
    check = verify_tree(bare, None)
    assert not check.metadata_checked and not check.tree_checked and check.files == 2


def test_a_tree_is_checked_against_the_digest_it_was_handed(example_store: Path) -> None:
    """An intact tree presented under another tree's digest is refused."""
    (a, _da), (_b, db) = _trees(example_store)[:2]
    with pytest.raises(CorruptTree, match="is not the tree"):
        verify_tree(a, db)


# ------------------------------------------------------------------------------- end to end


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Client settings for a store at tmp_path/store and a socket at tmp_path/s.sock."""
    for key in [k for k in os.environ if k.startswith("KERNELD_")]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNELD_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("KERNELD_SOCKET", str(_short_socket_path(tmp_path)))
    monkeypatch.setenv("KERNELD_BYTECODE_CACHE", "off")
    set_platform_facts(PlatformFacts(cpu="x86_64", os="linux", backend=Backend(BackendType.CPU)))
    _reset()
    yield tmp_path / "store"
    set_platform_facts(None)
    _reset()


def _short_socket_path(tmp_path: Path) -> Path:
    digest = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]
    return Path("/tmp") / f"kd-sec-{digest}.sock"


def _reset() -> None:
    _rpc.reset_backoff()
    call._memo.clear()
    _config._warned.clear()


def _kernel(kid: str) -> dict[str, bytes]:
    files = {"__init__.py": f"KID = {kid!r}\n".encode()}
    files["metadata.json"] = synthetic_metadata(
        files, kid=kid, name=kid.strip("_"), backend={"type": "cpu"}
    )
    return files


COMMIT = "e" * 40


def test_kerneld_verify_on_the_warm_path(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source rewritten in place (same size, mode, owner, mtime): imported as it is without
    the knob; with KERNELD_VERIFY=1 refused (CorruptTree, nothing imported), and the normal
    fallback policy applies."""
    repo = "kerneld-sec/warm"
    paths = publish_synthetic(
        env, repo, COMMIT, {"torch-universal": _kernel("_sec_warm_a1")}, refs={"v1": COMMIT}
    )
    init = paths["torch-universal"] / "__init__.py"
    st = init.stat()
    old = _writable(init)
    init.write_bytes(init.read_bytes().replace(b"a1", b"b2"))
    _restore(init, old, st.st_mtime_ns)

    monkeypatch.setenv("KERNELD_VERIFY", "1")
    with pytest.raises(CorruptTree, match=r"__init__\.py do\(es\) not match"):
        get_kernel(repo, version=1, policy="error")
    assert "_sec_warm_a1" not in sys.modules
    assert get_kernel(repo, version=1, fallback="torch") == "torch"
    monkeypatch.setenv("KERNELD_REQUIRE", "1")
    with pytest.raises(CorruptTree):
        get_kernel(repo, version=1, fallback="torch")
    # Without the knob the per-load checks pass and the rewritten code runs: what the knob is for.
    monkeypatch.delenv("KERNELD_VERIFY")
    monkeypatch.delenv("KERNELD_REQUIRE")
    _reset()
    assert get_kernel(repo, version=1, policy="error").KID == "_sec_warm_b2"


class _Impostor(pb_grpc.KernelsServicer):
    """Something else listening on the user socket, answering Resolve with a chosen path."""

    def __init__(self, path: str, digest: str) -> None:
        self.path = path
        self.digest = digest

    def Resolve(
        self, request: pb.ResolveRequest, context: grpc.ServicerContext
    ) -> pb.ResolveResponse:
        return pb.ResolveResponse(
            kernel=pb.ResolvedKernel(
                repo_id=request.kernel.repo_id,
                ref="v1",
                commit=COMMIT,
                variant="torch-universal",
                path=self.path,
                tree_digest=self.digest,
            )
        )


def _serve(servicer: _Impostor, path: Path) -> grpc.Server:
    path.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))  # the other RPCs: UNIMPLEMENTED
    pb_grpc.add_KernelsServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    with socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(path))
    return server


def test_an_impostor_on_the_socket_cannot_make_a_job_import_its_files(
    env: Path, tmp_path: Path
) -> None:
    """The socket's answer only names a tree: the client loads `v1/trees/<digest>` under its own
    store root, so a path outside the store, or a tree other than the one the answer's digest
    names, is refused before anything is opened."""
    a = publish_synthetic(env, "kerneld-sec/a", COMMIT, {"torch-universal": _kernel("_sec_imp_a")})[
        "torch-universal"
    ]
    b = publish_synthetic(env, "kerneld-sec/b", COMMIT, {"torch-universal": _kernel("_sec_imp_b")})[
        "torch-universal"
    ]
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "__init__.py").write_text("KID = 'evil'\n")
    (evil / "metadata.json").write_text(json.dumps({"id": "_sec_evil"}))
    sock = Path(os.environ["KERNELD_SOCKET"])

    server = _serve(_Impostor(str(evil), f"sha256:{a.name}"), sock)  # type: ignore[abstract]
    try:
        with pytest.raises(UntrustedPath, match="not the store path of tree"):
            get_kernel("kerneld-sec/ghost", version=1, policy="error")
        assert "_sec_evil" not in sys.modules
    finally:
        # Wait for the stop: a stopping gRPC server unlinks its unix socket's path, which the
        # next server is about to bind again.
        server.stop(0).wait()
    _reset()
    server = _serve(_Impostor(str(a), f"sha256:{b.name}"), sock)  # type: ignore[abstract]
    try:
        with pytest.raises(UntrustedPath, match="not the store path of tree"):
            get_kernel("kerneld-sec/ghost", version=1, policy="error")
        assert "_sec_imp_a" not in sys.modules
    finally:
        server.stop(0).wait()
        sock.unlink(missing_ok=True)


def test_the_verifier_keeps_the_client_import_graph_light() -> None:
    """KERNELD_VERIFY adds no heavy import (and none at all unless the knob is set)."""
    from tests.test_foundation import HEAVY, _modules_after

    loaded = _modules_after("import kerneld_client.tree_verify")
    assert not [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert "kerneld_client.tree_verify" not in _modules_after("import kerneld_client.loader")
