"""The client's reader of the published index agrees with what the store writes, and treats
anything it cannot trust or parse as a miss or a refusal, never as a hit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerneld.store import Store
from kerneld.store.layout import Layout
from kerneld_client import _path_trust, published_index
from kerneld_client.errors import UntrustedPath
from tests.client.support import ACTIVATION, Populated


def test_reader_matches_the_store(shared_store: Populated) -> None:
    root = shared_store.root
    commit = shared_store.commits[(ACTIVATION, "v1")]
    doc = published_index.read_repo_index(root, ACTIVATION, owner_uid=root.stat().st_uid)
    assert doc is not None and doc.repo == ACTIVATION
    assert doc.commit_for("v1") == commit and doc.commit_for(commit) == commit
    assert doc.commit_for("no-such-ref") is None
    entry = doc.commits[commit]
    assert entry.upstream_variants is not None
    assert sorted(entry.variants) == sorted(entry.upstream_variants)
    layout = Layout(root)
    with Store.open(root, read_only=True) as store:
        for name, v in entry.variants.items():
            hit = store.catalog.lookup(ACTIVATION, "v1", name)
            assert hit is not None
            assert root / v.tree == hit.path and v.digest == hit.digest
            assert published_index.lock_path_for(root, v.digest) == layout.lock_path(v.digest[7:])
            assert root / v.lock == hit.lock_path


def test_unknown_format_is_a_miss_and_garbage_an_error(tmp_path: Path) -> None:
    assert published_index.parse_repo_doc(json.dumps({"format": "other", "version": 1})) is None
    assert (
        published_index.parse_repo_doc(json.dumps({"format": published_index.FORMAT, "version": 2}))
        is None
    )
    with pytest.raises(published_index.IndexFormatError):
        published_index.parse_repo_doc(b"{not json")
    bad = {
        "format": published_index.FORMAT,
        "version": 1,
        "repo": "a/b",
        "commits": {"c": {"variants": 3}},
    }
    with pytest.raises(published_index.IndexFormatError):
        published_index.parse_repo_doc(json.dumps(bad))
    with pytest.raises(published_index.IndexFormatError):
        published_index.lock_path_for(tmp_path, "sha256:../../etc")
    # The optional upstream version list: absent is None, a list is kept, anything else is bad.
    base = {"format": published_index.FORMAT, "version": 1, "repo": "a/b"}
    parsed = published_index.parse_repo_doc(json.dumps(base))
    assert parsed is not None and parsed.versions is None
    parsed = published_index.parse_repo_doc(json.dumps({**base, "versions": [1, 2, 10]}))
    assert parsed is not None and parsed.versions == (1, 2, 10)
    for versions in ("1,2", [1, "2"], [-1], [True], [1.5]):
        with pytest.raises(published_index.IndexFormatError, match="versions"):
            published_index.parse_repo_doc(json.dumps({**base, "versions": versions}))


def test_index_file_checks(shared_store: Populated, tmp_path: Path) -> None:
    """A symlinked index file, or one owned by someone else, is refused."""
    root = tmp_path / "root"
    (root / "index" / "v1" / "o").mkdir(parents=True)
    target = tmp_path / "evil.json"
    target.write_text(json.dumps({"format": published_index.FORMAT, "version": 1, "repo": "o/n"}))
    (root / "index" / "v1" / "o" / "n.json").symlink_to(target)
    with pytest.raises(PermissionError, match="symlink"):
        published_index.read_repo_index(root, "o/n", owner_uid=0)
    (root / "index" / "v1" / "o" / "n.json").unlink()
    (root / "index" / "v1" / "o" / "n.json").write_text(target.read_text())
    with pytest.raises(PermissionError, match="not by the store owner"):
        published_index.read_repo_index(root, "o/n", owner_uid=12345)
    assert published_index.read_repo_index(root, "o/none", owner_uid=0) is None


def test_trust_check_accepts_the_store_and_refuses_its_root(shared_store: Populated) -> None:
    root = _path_trust.store_root(shared_store.root)
    commit = shared_store.commits[(ACTIVATION, "v1")]
    doc = published_index.read_repo_index(shared_store.root, ACTIVATION, owner_uid=root.owner_uid)
    assert doc is not None
    for v in doc.commits[commit].variants.values():
        assert _path_trust.check_tree(root, Path(v.tree)) == (shared_store.root / v.tree).resolve()
    with pytest.raises(UntrustedPath, match="outside"):
        _path_trust.check_tree(root, Path("."))


def test_the_published_publisher_policy_is_read_as_the_daemon_wrote_it(tmp_path: Path) -> None:
    from kerneld.config import Config
    from kerneld.pipeline.publisher_trust import PublisherTrust

    written: list[dict[str, object]] = []
    cfg = Config(source="test", system=False, store_path=tmp_path, trust_allow=("site/*",))
    trust = PublisherTrust(cfg, lambda org: org == "good", written.append)
    trust.check("good/kernel", trust_remote_code=False)  # asks the "Hub", publishes its answer
    index = tmp_path / "index" / f"v{published_index.VERSION}"
    index.mkdir(parents=True)
    path = index / published_index.PUBLISHERS_FILE
    path.write_text(json.dumps(written[-1]))
    pubs = published_index.read_publishers(tmp_path, owner_uid=None)
    assert pubs is not None
    assert pubs.trusts("good/kernel", trust_remote_code=False)
    assert pubs.trusts("site/anything", trust_remote_code=False)
    assert not pubs.trusts("evil/kernel", trust_remote_code=False)
    assert pubs.trusts("evil/kernel", trust_remote_code=True)

    # Another format, or a document that does not hold together: ask the daemon.
    for bad in ({"format": "kerneld-publishers", "version": 99}, {"format": "x"}, [1]):
        path.write_text(json.dumps(bad))
        with pytest.raises(published_index.IndexFormatError):
            published_index.read_publishers(tmp_path, owner_uid=None)
    path.unlink()
    assert published_index.read_publishers(tmp_path, owner_uid=None) is None


def test_a_daemon_answer_names_a_tree_by_its_store_relative_path() -> None:
    hexd = "ab" * 32
    digest = f"sha256:{hexd}"
    assert published_index.tree_relpath_for(
        f"/var/lib/kerneld/store/v1/trees/{hexd}", digest
    ) == Path(f"v1/trees/{hexd}")
    for bad in (
        f"/store/v1/trees/{'cd' * 32}",  # another tree than the digest says
        f"/store/v1/blobs/{hexd}",
        f"/store/v1/trees/{hexd}/..",
        "/etc",
        "",
    ):
        with pytest.raises(published_index.IndexFormatError):
            published_index.tree_relpath_for(bad, digest)
    with pytest.raises(published_index.IndexFormatError):
        published_index.tree_relpath_for(f"/store/v1/trees/{hexd}", "sha256:short")
