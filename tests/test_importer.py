"""Importing a variant folder: unique module names, no writes into the tree, clear errors."""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from pathlib import Path

import pytest

from kerneld_client.errors import KernelLoadError
from kerneld_client.importer import TREE_ATTR, import_variant


def _variant(root: Path, ident: str, *, value: int = 1, nested: bool = False) -> Path:
    folder = root / ident
    pkg = folder / "my_kernel" if nested else folder
    (pkg / "layers").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from ._ops import value\nfrom . import layers\nVALUE = value()\n"
    )
    (pkg / "_ops.py").write_text(f"def value():\n    return {value}\n")
    (pkg / "layers" / "__init__.py").write_text("from .act import Act\n")
    (pkg / "layers" / "act.py").write_text("class Act:\n    name = 'act'\n")
    (folder / "metadata.json").write_text(json.dumps({"id": ident, "name": "my-kernel"}))
    return folder


def _writable_snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture(autouse=True)
def _clean_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_imports_under_metadata_id_without_writing(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "_demo_abc1234", value=7)
    before = _writable_snapshot(folder)
    module = import_variant(folder)
    assert module.__name__ == "_demo_abc1234"
    assert module.VALUE == 7
    assert module.layers.Act.name == "act"
    assert getattr(module, TREE_ATTR) == str(folder.resolve())
    # Running as root ignores modes, so prove it by content: no bytecode cache was written.
    assert _writable_snapshot(folder) == before
    assert not list(folder.rglob("__pycache__"))


def test_bytecode_writes_prevented_even_when_writable(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "_demo_w")
    os.chmod(folder, 0o777)
    sys.dont_write_bytecode, old = False, sys.dont_write_bytecode
    try:
        import_variant(folder)
    finally:
        sys.dont_write_bytecode = old
    assert not list(folder.rglob("*.pyc"))


def test_bytecode_cache_hit_reads_no_source_and_a_changed_file_recompiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cached trees (`cache_bytecode=True`) keep compiled code in the per-user cache, keyed by
    each source file's identity: a hit reads no source, and a rewritten file (same size, new
    content) is compiled again instead of running the old code."""
    from kerneld_client import importer

    monkeypatch.setenv("KERNELD_BYTECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    folder = _variant(tmp_path, "_demo_cached", value=1)
    read: list[str] = []
    get_data = importer._NoBytecodeSourceLoader.get_data

    def recording(self: importer._NoBytecodeSourceLoader, path: str) -> bytes:
        read.append(path)
        return get_data(self, path)

    monkeypatch.setattr(importer._NoBytecodeSourceLoader, "get_data", recording)

    def fresh_import() -> int:
        for name in [m for m in sys.modules if m.split(".")[0] == "_demo_cached"]:
            del sys.modules[name]
        read.clear()
        return import_variant(folder, cache_bytecode=True).VALUE

    assert fresh_import() == 1 and len(read) == 4  # compiled: every source read once
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(cached) == 4
    assert fresh_import() == 1 and read == []  # all four from the cache
    ops = folder / "_ops.py"
    st = ops.stat()
    ops.write_text("def value():\n    return 2\n")  # the same size
    os.utime(ops, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert fresh_import() == 2 and read == [str(ops)]
    assert len(list((tmp_path / "cache").iterdir())) == 5


def test_nested_layout(tmp_path: Path) -> None:
    module = import_variant(_variant(tmp_path, "_nested_1", value=3, nested=True))
    assert module.VALUE == 3


def test_same_folder_twice_returns_same_module(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "_demo_twice")
    assert import_variant(folder) is import_variant(folder)


def test_two_kernels_coexist(tmp_path: Path) -> None:
    a = import_variant(_variant(tmp_path, "_k_v1", value=1))
    b = import_variant(_variant(tmp_path, "_k_v2", value=2))
    assert (a.VALUE, b.VALUE) == (1, 2)


def test_second_build_with_same_id_is_refused(tmp_path: Path) -> None:
    import_variant(_variant(tmp_path / "a", "_dup"))
    with pytest.raises(KernelLoadError, match="already imported"):
        import_variant(_variant(tmp_path / "b", "_dup"))


def _with_digest(folder: Path) -> Path:
    """Give a variant's metadata.json the digest of every file, as builds have."""
    from examples.kernels.digest import variant_digest

    meta = json.loads((folder / "metadata.json").read_text())
    meta["digest"] = {"algorithm": "sha256", "files": variant_digest(folder)}
    (folder / "metadata.json").write_text(json.dumps(meta))
    return folder


def test_the_same_build_from_another_folder_is_the_imported_module(tmp_path: Path) -> None:
    """A Hub cache copy first, the store's copy later: one build (identical metadata.json with
    a digest its files match), so the running module is returned and nothing runs twice. A copy
    whose files do not match the digest is another build, and refused."""
    first = import_variant(_with_digest(_variant(tmp_path / "a", "_same", value=5)))
    same = _with_digest(_variant(tmp_path / "b", "_same", value=5))
    assert import_variant(same) is first
    changed = _with_digest(_variant(tmp_path / "c", "_same", value=5))
    (changed / "_ops.py").write_text("def value():\n    return 6\n")  # not what the digest says
    with pytest.raises(KernelLoadError, match="already imported"):
        import_variant(changed)
    other = _with_digest(_variant(tmp_path / "d", "_same", value=7))  # another build, same id
    with pytest.raises(KernelLoadError, match="already imported"):
        import_variant(other)


def _as_hf_snapshot(folder: Path, blobs: Path) -> Path:
    """Turn `folder` into a Hugging Face cache snapshot's layout: every file a link into
    `blobs` (named by content, as the cache names them)."""
    import hashlib

    blobs.mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        path.unlink()
        path.symlink_to(blob)
    return folder


def test_the_same_build_in_a_linked_cache_snapshot_is_the_imported_module(tmp_path: Path) -> None:
    """Issue 53: a build imported from the store, then the same build from the Hugging Face
    cache (`LocalFuncRepository` over the snapshot; its files are links into the blobs) is
    the module already running, not another build refused as a duplicate. A linked copy whose
    content differs from the digest is still refused."""
    first = import_variant(_with_digest(_variant(tmp_path / "store", "_linked", value=5)))
    snapshot = _as_hf_snapshot(
        _with_digest(_variant(tmp_path / "snap", "_linked", value=5)), tmp_path / "blobs"
    )
    assert import_variant(snapshot, own_folder=True) is first
    changed = _with_digest(_variant(tmp_path / "snap2", "_linked", value=5))
    (changed / "_ops.py").write_text("def value():\n    return 6\n")
    _as_hf_snapshot(changed, tmp_path / "blobs2")
    with pytest.raises(KernelLoadError, match="already imported"):
        import_variant(changed, own_folder=True)
    # A folder not the caller's own (a store tree) never has its links followed.
    with pytest.raises(KernelLoadError, match="refusing"):
        import_variant(snapshot)


def test_broken_kernel_leaves_no_module_behind(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "_broken")
    (folder / "_ops.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(KernelLoadError, match="boom") as info:
        import_variant(folder)
    assert isinstance(info.value, ImportError)
    assert "_broken" not in sys.modules


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ("not json", "cannot read"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"id": "a.b"}), "identifier"),
        (json.dumps({"id": "class"}), "identifier"),
        (json.dumps({"name": "x"}), "identifier"),
    ],
)
def test_bad_metadata_is_a_clear_error(tmp_path: Path, metadata: str, match: str) -> None:
    folder = _variant(tmp_path, "_meta")
    (folder / "metadata.json").write_text(metadata)
    with pytest.raises(KernelLoadError, match=match):
        import_variant(folder)


def test_missing_metadata_and_package(tmp_path: Path) -> None:
    with pytest.raises(KernelLoadError, match="no metadata.json"):
        import_variant(tmp_path)
    (tmp_path / "metadata.json").write_text(json.dumps({"id": "_empty"}))
    with pytest.raises(KernelLoadError, match="neither __init__.py"):
        import_variant(tmp_path)


def test_same_folder_imported_by_another_loader_is_reused(tmp_path: Path) -> None:
    """`kernels` (or plain importlib) may have imported the folder first: reuse, don't refuse."""
    import importlib.util

    folder = _variant(tmp_path, "_other_loader")
    spec = importlib.util.spec_from_file_location(
        "_other_loader", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_other_loader"] = module
    spec.loader.exec_module(module)
    assert import_variant(folder) is module


def test_finders_cached_before_registration_are_replaced(tmp_path: Path) -> None:
    """A standard finder cached for the folder or a subpackage of it (another loader imported
    it first) would serve our import and write bytecode into the tree: registration drops them,
    including one reached through a symlink, and a link back up does not loop."""
    folder = _variant(tmp_path, "_demo_cached")
    (folder / "layers" / "up").symlink_to(folder, target_is_directory=True)
    (folder / "linked").symlink_to(folder / "layers", target_is_directory=True)
    stale = [folder, folder / "layers", folder / "linked"]
    for path in stale:
        sys.path_importer_cache[str(path)] = importlib.machinery.FileFinder(
            str(path), (importlib.machinery.SourceFileLoader, [".py"])
        )
    sys.dont_write_bytecode, old = False, sys.dont_write_bytecode
    try:
        module = import_variant(folder)
    finally:
        sys.dont_write_bytecode = old
    assert module.layers.Act.name == "act"
    for path in stale:
        finder = sys.path_importer_cache.get(str(path))
        assert finder is None or all(
            loader is not importlib.machinery.SourceFileLoader for _, loader in finder._loaders
        ), path
    assert not list(folder.rglob("__pycache__"))


def _zip_variant(root: Path, ident: str, *, value: int = 3) -> Path:
    """A `build-layout: zip` build as kernel-builder lays it out for `kernels` 0.19: the package
    in `<id>.zip` (its `__init__` at the archive's root), metadata.json beside it."""
    import zipfile

    folder = root / ident
    folder.mkdir()
    with zipfile.ZipFile(folder / f"{ident}.zip", "w") as archive:
        archive.writestr(
            "__init__.py",
            "from ._ops import value\nfrom . import layers\nfrom ._beside import BESIDE\n"
            "VALUE = value()\n",
        )
        archive.writestr("_ops.py", f"def value():\n    return {value}\n")
        archive.writestr("layers/__init__.py", "from .act import Act\n")
        archive.writestr("layers/act.py", "class Act:\n    name = 'zipped'\n")
        archive.writestr("data/table.txt", "1 2 3\n")
    # A module beside the archive (where a compiled extension would sit) comes first.
    (folder / "_beside.py").write_text("BESIDE = 'beside'\n")
    (folder / "metadata.json").write_text(
        json.dumps({"id": ident, "name": "my-kernel", "build-layout": "zip"})
    )
    return folder


def test_zip_layout_imports_from_the_archive_without_writing(tmp_path: Path) -> None:
    import importlib.resources

    folder = _zip_variant(tmp_path, "_demo_zip1")
    before = _writable_snapshot(folder)
    module = import_variant(folder, cache_bytecode=True)
    assert module.__name__ == "_demo_zip1"
    assert module.VALUE == 3
    assert module.layers.Act.name == "zipped"
    assert module.BESIDE == "beside"
    assert module.__file__ == str(folder.resolve() / "_demo_zip1.zip" / "__init__.py")
    assert module.layers.__file__.startswith(str(folder.resolve() / "_demo_zip1.zip"))
    table = importlib.resources.files(module) / "data" / "table.txt"
    assert table.read_text() == "1 2 3\n"
    assert getattr(module, TREE_ATTR) == str(folder.resolve())
    assert import_variant(folder) is module
    assert _writable_snapshot(folder) == before


def test_zip_layout_errors_are_clear(tmp_path: Path) -> None:
    missing = _zip_variant(tmp_path, "_demo_zip2")
    (missing / "_demo_zip2.zip").unlink()
    with pytest.raises(KernelLoadError, match=r"build-layout zip, but _demo_zip2\.zip is missing"):
        import_variant(missing)
    unknown = _zip_variant(tmp_path, "_demo_zip3")
    meta = json.loads((unknown / "metadata.json").read_text())
    (unknown / "metadata.json").write_text(json.dumps({**meta, "build-layout": "tarball"}))
    with pytest.raises(KernelLoadError, match="'build-layout' must be one of files, zip"):
        import_variant(unknown)
    outside = _zip_variant(tmp_path, "_demo_zip4")
    (outside / "_demo_zip4.zip").rename(tmp_path / "elsewhere.zip")
    (outside / "_demo_zip4.zip").symlink_to(tmp_path / "elsewhere.zip")
    with pytest.raises(KernelLoadError, match="not a file inside"):
        import_variant(outside)
    assert not any(name.startswith("_demo_zip") for name in sys.modules)


def test_zip_layout_in_an_own_folder_may_link_its_archive(tmp_path: Path) -> None:
    """A Hugging Face cache snapshot links every file into its blob store: a local kernel's
    archive may be such a link (never a store tree's, test_zip_layout_errors_are_clear)."""
    folder = _zip_variant(tmp_path, "_demo_zip5")
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (folder / "_demo_zip5.zip").rename(blobs / "0123abcd")
    (folder / "_demo_zip5.zip").symlink_to(blobs / "0123abcd")
    module = import_variant(folder, own_folder=True)
    assert module.VALUE == 3 and module.layers.Act.name == "zipped"
    assert module.__file__ == str(folder.resolve() / "_demo_zip5.zip" / "__init__.py")
