"""Mirror upstreams read the static mirror layout from a directory and over HTTP (real nginx)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kerneld.mirror.documents import Manifest, MirrorWriter, blob_path, manifest_path
from kerneld.mirror.upstream import MirrorDirUpstream, MirrorHttpUpstream
from kerneld.upstream.base import RemoteFile
from kerneld.upstream.errors import (
    EntryNotFound,
    RepoNotFound,
    RevisionNotFound,
    UpstreamProtocolError,
    UpstreamUnavailable,
)
from kerneld.upstream.retry import RetryPolicy
from tests.support.nginx import Nginx, nginx_binary

REPO = "org/act"
C1 = "1" * 40
C2 = "2" * 40
FAST = RetryPolicy(attempts=2, base_delay=0.0, timeout=5)


def _files() -> dict[str, bytes]:
    return {
        "metadata.json": b'{"id": "_act_1234567"}',
        "__init__.py": b"from ._ops import ops\n",
        "_ops.py": b"ops = None\n" * 1000,
        "layers/__init__.py": b"",
    }


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture(scope="module")
def mirror_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mirror")
    writer = MirrorWriter(root, name="test")
    writer.write_info()
    files = []
    for path, data in _files().items():
        sha = hashlib.sha256(data).hexdigest()
        writer.write_blob(sha, data)
        files.append(RemoteFile(path, len(data), sha256=sha, git_sha1=_git_sha1(data)))
    writer.write_manifest(
        Manifest(REPO, C1, {"torch-universal": files, "torch213-cxx11-cpu-x86_64-linux": files})
    )
    writer.write_refs(REPO, {"main": C1, "v1": C1}, {"v1.0.0": C1})
    return root


@pytest.fixture(scope="module")
def nginx(mirror_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    if nginx_binary() is None:
        pytest.skip("nginx is not installed; scripts/bootstrap installs it")
    with Nginx(mirror_dir, tmp_path_factory.mktemp("nginx")) as server:
        yield server


@pytest.fixture(params=["dir", "http"])
def upstream(request: pytest.FixtureRequest, mirror_dir: Path):
    if request.param == "dir":
        return MirrorDirUpstream(mirror_dir, policy=FAST)
    server = request.getfixturevalue("nginx")
    return MirrorHttpUpstream(server.url, policy=FAST)


def test_refs_and_revisions(upstream) -> None:
    refs = upstream.list_refs(REPO)
    assert refs.branches == {"main": C1, "v1": C1}
    assert refs.versions() == {1: C1}
    assert upstream.resolve_revision(REPO, "v1") == C1
    assert upstream.resolve_revision(REPO, "refs/heads/main") == C1
    assert upstream.resolve_revision(REPO, "v1.0.0") == C1
    assert upstream.resolve_revision(REPO, "refs/tags/v1.0.0") == C1
    assert upstream.resolve_revision(REPO, C1) == C1
    with pytest.raises(RevisionNotFound):
        upstream.resolve_revision(REPO, "v9")
    with pytest.raises(RevisionNotFound):
        upstream.resolve_revision(REPO, "refs/tags/main")
    with pytest.raises(RevisionNotFound):
        upstream.resolve_revision(REPO, C2)
    with pytest.raises(RepoNotFound):
        upstream.list_refs("org/missing")


def test_variants_files_and_bytes(upstream) -> None:
    assert upstream.list_variants(REPO, C1) == [
        "torch-universal",
        "torch213-cxx11-cpu-x86_64-linux",
    ]
    files = {f.path: f for f in upstream.list_files(REPO, C1, "torch-universal")}
    assert set(files) == set(_files())
    for path, data in _files().items():
        with upstream.open_file(REPO, C1, "torch-universal", files[path]) as chunks:
            assert b"".join(chunks) == data
    ops = files["_ops.py"]
    with upstream.open_file(REPO, C1, "torch-universal", ops, offset=100) as chunks:
        assert b"".join(chunks) == _files()["_ops.py"][100:]
    with pytest.raises(EntryNotFound):
        upstream.list_files(REPO, C1, "torch-cuda")


def test_missing_blob_is_entry_not_found(upstream) -> None:
    ghost = RemoteFile("x.py", 3, sha256="f" * 64)
    with pytest.raises(EntryNotFound), upstream.open_file(REPO, C1, "torch-universal", ghost):
        pass


@pytest.mark.parametrize("bad", ["../etc/passwd", "org/../../x", "/abs/path", "a/b/c", ""])
def test_hostile_repo_ids_never_reach_a_path(upstream, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid kernel repo id"):
        upstream.list_refs(bad)


def test_not_a_mirror(tmp_path: Path) -> None:
    with pytest.raises(UpstreamUnavailable, match="not a kerneld mirror"):
        MirrorDirUpstream(tmp_path, policy=FAST).list_refs(REPO)


@pytest.mark.parametrize(
    ("info", "match"),
    [
        ({"format": "kerneld-mirror", "version": 99}, "version 99 is not supported"),
        ({"format": "something-else", "version": 1}, "expected 'kerneld-mirror'"),
    ],
)
def test_unknown_mirror_format_is_refused(tmp_path: Path, info: dict, match: str) -> None:
    (tmp_path / "mirror-info").write_text(json.dumps(info))
    with pytest.raises(UpstreamProtocolError, match=match):
        MirrorDirUpstream(tmp_path, policy=FAST).list_refs(REPO)


@pytest.mark.parametrize(
    "manifest",
    [
        b"not json",
        b"[]",
        json.dumps({"repo_id": "org/other", "commit": C1, "variants": {}}).encode(),
        json.dumps({"repo_id": REPO, "commit": C1, "variants": {"../x": {"files": []}}}).encode(),
        json.dumps(
            {
                "repo_id": REPO,
                "commit": C1,
                "variants": {"v": {"files": [{"path": "a", "size": -1, "sha256": "0" * 64}]}},
            }
        ).encode(),
        json.dumps(
            {
                "repo_id": REPO,
                "commit": C1,
                "variants": {"v": {"files": [{"path": "a", "size": 1, "sha256": "xyz"}]}},
            }
        ).encode(),
    ],
)
def test_malformed_manifest_is_a_protocol_error(tmp_path: Path, manifest: bytes) -> None:
    MirrorWriter(tmp_path).write_info()
    target = tmp_path / manifest_path(REPO, C1)
    target.parent.mkdir(parents=True)
    target.write_bytes(manifest)
    with pytest.raises(UpstreamProtocolError):
        MirrorDirUpstream(tmp_path, policy=FAST).list_variants(REPO, C1)


def test_symlink_out_of_dir_mirror_is_refused(tmp_path: Path) -> None:
    mirror = tmp_path / "m"
    MirrorWriter(mirror).write_info()
    secret = tmp_path / "secret"
    secret.write_bytes(b"outside")
    sha = "a" * 64
    link = mirror / blob_path(sha)
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    up = MirrorDirUpstream(mirror, policy=FAST)
    with (
        pytest.raises(UpstreamProtocolError, match="outside the mirror"),
        up.open_file(REPO, C1, "v", RemoteFile("x", 7, sha256=sha)) as chunks,
    ):
        b"".join(chunks)


def test_http_mirror_down_is_unavailable(nginx) -> None:
    up = MirrorHttpUpstream("http://127.0.0.1:9/", policy=FAST)
    with pytest.raises(UpstreamUnavailable):
        up.list_refs(REPO)
