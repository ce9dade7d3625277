"""`metadata.json` `name` never makes a process import code from outside the verified tree
(issue 20 §1.1).

The client imports `<variant>/<name with dashes as underscores>/` when a variant has no top-level
`__init__.py`. A `name` that is absolute or climbs out with `..` once made a victim import a
package another user had planted in /tmp, after every trust check (and, under KERNELD_VERIFY=1,
the re-hash) had passed. The store now refuses such a build at publish; the client refuses the
name at load (a store written before the check, a hub-fallback download, a local folder) and
imports only from a folder that resolves inside the tree.

The attacker is `nobody`, planting a package that leaves a marker when it is imported; the
victim is a fresh client process.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kerneld.store import Store, TreeFile
from kerneld.store.errors import MetadataError
from kerneld_client import KernelLoadError, importer
from tests.client.support import client_env, publish_synthetic, run_client, synthetic_metadata
from tests.security.support import (
    CPU_FACTS,
    NOBODY,
    VICTIM,
    as_nobody,
    needs_root,
    public_dir,
)

pytestmark = [
    needs_root,
    pytest.mark.filterwarnings("ignore::kerneld_client.KernelFallbackWarning"),
]

REPO = "kerneld-sec/confined"
COMMIT = "d" * 40
VARIANT = "torch-universal"


@pytest.fixture
def planted() -> Iterator[tuple[Path, Path]]:
    """(the attacker's package, the marker its import would write): planted by `nobody` in a
    directory of their own, readable by everyone."""
    with public_dir("kd-sec-name-") as base:
        home = base / "attacker"
        home.mkdir(mode=0o755)
        os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
        marker = base / "pwned"

        def plant() -> str:
            pkg = home / "evil"
            pkg.mkdir(mode=0o755)
            (pkg / "__init__.py").write_text(
                f"open({str(marker)!r}, 'w').write('attacker code ran')\nKID = 'evil'\n"
            )
            return str(pkg)

        yield Path(as_nobody(plant)), marker


def hostile_names(pkg: Path) -> dict[str, Any]:
    """`name` values an attacker would use; the first two point exactly at `pkg`."""
    return {
        "absolute": str(pkg),
        "dotdot": "../" * 40 + str(pkg).lstrip("/"),
        "parent": "..",
        "self": ".",
        "dots": "evil.pkg",
        "slash": "evil/pkg",
        "nul": "evil\x00",
        "not-a-string": ["evil"],
    }


def _variant(kid: str, name: object) -> dict[str, bytes]:
    """A nested-layout variant (`<python name>/__init__.py`, no top-level `__init__.py`)."""
    files = {"confined_kernel/__init__.py": f"KID = {kid!r}\n".encode()}
    files["metadata.json"] = synthetic_metadata(
        files,
        kid=kid,
        name=name,  # type: ignore[arg-type]  # hostile values on purpose
        backend={"type": "cpu"},
    )
    return files


def _publish(store: Store, files: dict[str, bytes], variant: str = VARIANT) -> Path:
    tree_files = []
    for path, data in files.items():
        info = store.blobs.ingest(data, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        tree_files.append(TreeFile(path, info.sha256, len(data)))
    return store.trees.publish_tree(REPO, COMMIT, variant, tree_files).path


# ------------------------------------------------------------------------------- at publish


@pytest.mark.parametrize("case", list(hostile_names(Path("/tmp/x/evil"))))
def test_the_store_refuses_to_publish_a_hostile_name(
    case: str, planted: tuple[Path, Path], tmp_path: Path
) -> None:
    """Every hostile `name` (pointing at nobody's planted package where it can) is refused
    with MetadataError; nothing is published. A Kernel Hub name publishes (the control)."""
    pkg, _ = planted
    name = hostile_names(pkg)[case]
    with Store.open(tmp_path / "store", min_age_s=0) as store:
        with pytest.raises(MetadataError, match="'name' must be a Kernel Hub name"):
            _publish(store, _variant("_sec_conf_bad", name))
        assert [t.digest for t in store.index.trees("live")] == []
        assert _publish(store, _variant("_sec_conf_ok", "confined-kernel")).is_dir()


@pytest.mark.parametrize("name", ["Evil", "-evil", "evil-", "_evil", "", "é", "e" * 300 + "/"])
def test_names_outside_the_hub_grammar_are_refused(name: str, tmp_path: Path) -> None:
    with (
        Store.open(tmp_path / "store", min_age_s=0) as store,
        pytest.raises(MetadataError, match="'name'"),
    ):
        _publish(store, _variant("_sec_conf_gr", name))


@pytest.mark.parametrize("name", ["k", "relu2", "flash-attn3", "paged_attention"])
def test_plain_names_are_published(name: str, tmp_path: Path) -> None:
    """The control of the refusals: Kernel Hub names (and python-style ones) publish."""
    with Store.open(tmp_path / "store", min_age_s=0) as store:
        assert _publish(store, _variant("_sec_conf_fine", name)).is_dir()


# ------------------------------------------------------------------------------- at load


def _rewrite_name(tree: Path, name: object) -> None:
    """What a store published before the check holds: the same tree, a hostile `name` (written
    by the store owner, modes and owner as the daemon leaves them)."""
    meta = tree / "metadata.json"
    old_dir, old_file = tree.stat().st_mode & 0o7777, meta.stat().st_mode & 0o7777
    tree.chmod(0o755)
    meta.unlink()  # the published file may be a hard link to a blob
    meta.write_bytes(_variant("_sec_conf_load", name)["metadata.json"])
    meta.chmod(old_file)
    tree.chmod(old_dir)


def _victim(store: Path, tmp_path: Path) -> dict[str, Any]:
    env = client_env(store, tmp_path, KERNELD_PLATFORM_JSON=CPU_FACTS)
    return run_client(VICTIM % {"repo": REPO}, env)


@pytest.mark.parametrize("case", ["absolute", "dotdot", "parent", "dots", "slash"])
def test_a_hostile_name_in_the_store_is_never_imported(
    case: str, planted: tuple[Path, Path], tmp_path: Path
) -> None:
    """A tree whose metadata names nobody's package: the victim process refuses it
    (KernelLoadError naming the field), nobody's code never runs, the default policy falls
    back. The same tree with its real name loads (the control)."""
    pkg, marker = planted
    store = tmp_path / "store"
    tree = publish_synthetic(
        store,
        REPO,
        COMMIT,
        {VARIANT: _variant("_sec_conf_load", "confined-kernel")},
        refs={"v1": COMMIT},
    )[VARIANT]
    assert _victim(store, tmp_path)["kid"] == "_sec_conf_load"

    _rewrite_name(tree, hostile_names(pkg)[case])
    out = _victim(store, tmp_path)
    assert "kid" not in out, out
    assert out["error"] == "KernelLoadError"
    assert "'name' must be a Kernel Hub name" in out["message"]
    assert out["default"] == "torch"
    assert not marker.exists(), "the attacker's package was imported"


def test_a_symlinked_package_folder_is_not_followed_out_of_the_variant(
    planted: tuple[Path, Path], tmp_path: Path
) -> None:
    """A local variant folder whose `<python name>/` is a symlink to nobody's package: refused,
    nothing runs (the store's own trust checks already refuse such a link; this is the
    importer's containment check, which also covers folders the store does not check)."""
    pkg, marker = planted
    variant = tmp_path / "variant"
    variant.mkdir()
    (variant / "metadata.json").write_text('{"id": "_sec_conf_link", "name": "evil"}')
    (variant / "evil").symlink_to(pkg)
    with pytest.raises(KernelLoadError, match="leads out of the variant folder"):
        importer.import_variant(variant)
    assert not marker.exists()


@pytest.mark.parametrize("case", list(hostile_names(Path("/tmp/x/evil"))))
def test_the_importer_refuses_every_hostile_name(
    case: str, planted: tuple[Path, Path], tmp_path: Path
) -> None:
    """The importer itself (local folders, hub-fallback downloads): the same names refused
    before any import, and nobody's code does not run."""
    pkg, marker = planted
    variant = tmp_path / "variant"
    variant.mkdir()
    metadata: dict[str, object] = {"id": "_sec_conf_imp", "name": hostile_names(pkg)[case]}
    with pytest.raises(KernelLoadError, match="'name' must be a Kernel Hub name"):
        importer.package_dir(variant, metadata)
    assert not marker.exists()


def test_a_local_kernel_in_a_hub_cache_snapshot_loads_with_its_file_links(tmp_path: Path) -> None:
    """The Hugging Face cache links every file of a snapshot into its blob store, and `kernels`
    loads such folders (`get_local_kernel(install_kernel(...))`): a local kernel's files may be
    links. Its package folder still may not be, and a store tree's files never are followed."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    files = {
        "__init__.py": b"ANSWER = 42\n",
        "metadata.json": b'{"id": "_sec_conf_snapshot", "name": "snapshot-kernel"}',
    }
    variant = tmp_path / "snapshots" / "abc" / "build" / "torch-universal"
    variant.mkdir(parents=True)
    for name, data in files.items():
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (variant / name).symlink_to(os.path.relpath(blob, variant))
    with pytest.raises(KernelLoadError, match="leads out of the variant folder"):
        importer.import_variant(variant)  # a store tree: links are not followed
    module = importer.import_variant(variant, own_folder=True)
    assert module.ANSWER == 42
