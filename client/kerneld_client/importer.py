"""Import a kernel variant folder as a Python package, without ever writing into it.

A variant is imported under its `metadata.json` `id` (unique per build), so several kernels and
several versions of one kernel coexist in `sys.modules`. Kernel code uses relative imports only, so
the package's submodules are found through its `__path__`.

Training jobs often run as root, which ignores file modes: the standard loaders would drop
`__pycache__/*.pyc` next to the sources and so mutate a verified tree. Folders registered here are
served by a path hook whose source loader never writes bytecode into the folder, and which never
loads a sourceless `.pyc` found in it.

Compiling a kernel's Python on every process start costs milliseconds (more than everything else
on the warm path), so for immutable trees (`import_variant(..., cache_bytecode=True)`: the store's
and the hub fallback's verified folders) compiled code is kept in a per-user cache outside the
tree instead: `$KERNELD_BYTECODE_CACHE`, else `~/.cache/kerneld/bytecode` (written only when
Python may write bytecode, i.e. without PYTHONDONTWRITEBYTECODE; `KERNELD_BYTECODE_CACHE=off`
disables it). Other folders (a local checkout being edited) are compiled in memory each time.
A `build-layout: zip` build (`kernels` 0.19) is one `<id>.zip` beside metadata.json: it is
imported as `kernels` imports it (the package's `__init__` from the archive, submodules from the
variant folder then the archive, both through zipimport), and nothing is written either; its
compiled code is not cached (zipimport compiles it in memory).
Entries are named by the interpreter's magic number, a checksum of the source path and the
source file's identity (inode, size, mtime in ns; CPython's own pyc check uses size and mtime),
so a hit reads no source at all. A cached tree never changes (a store tree is named by its
digest and verified), so a file that somehow did would at worst run the verified code it had.
A cache file must belong to this user and not be writable by others, and anything unreadable is
ignored (the source is compiled).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import keyword
import os
import stat
import sys
import zipimport
from pathlib import Path
from types import CodeType, ModuleType
from typing import TYPE_CHECKING

from kerneld_client._loads import TREE_ATTR, NoBytecodeSourceLoader, _import_lock, register_root
from kerneld_client.errors import KernelLoadError

if TYPE_CHECKING:
    from importlib.abc import Traversable, TraversableResources

    from typing_extensions import Buffer

# The import hook, its loader and the bytecode cache are defined in `_loads`: the warm fast path
# imports store trees through them too (one set of registered roots, one hook).
_lock = _import_lock
_NoBytecodeSourceLoader = NoBytecodeSourceLoader
_register_root = register_root


def read_metadata(variant_dir: Path) -> dict[str, object]:
    """Read and minimally validate `metadata.json` of a variant folder."""
    path = variant_dir / "metadata.json"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))  # no text wrapper: 5-10 us less
    except FileNotFoundError as exc:
        raise KernelLoadError(
            f"{variant_dir} has no metadata.json; it is not a Kernel Hub build variant"
        ) from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KernelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise KernelLoadError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data


def module_name_for(variant_dir: Path, metadata: dict[str, object]) -> str:
    """The name to import under: metadata `id`, which must be a dotless Python identifier."""
    name = metadata.get("id")
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise KernelLoadError(
            f"{variant_dir / 'metadata.json'}: 'id' must be a Python identifier, got {name!r}"
        )
    return name


#: What `metadata.json` `name` may become after dashes turn into underscores: one plain ASCII
#: identifier, hence one path component that can never be absolute, `..` or contain a slash.


def python_name(variant_dir: Path, metadata: dict[str, object]) -> str | None:
    """`name` with dashes as underscores, or None when there is no `name`; KernelLoadError when
    it is anything but a plain identifier (the name becomes a folder to import from)."""
    name = metadata.get("name")
    if name is None:
        return None
    pyname = name.replace("-", "_") if isinstance(name, str) else None
    if (
        pyname is None
        or not (pyname.isascii() and pyname.isidentifier())
        or keyword.iskeyword(pyname)
    ):
        raise KernelLoadError(
            f"{variant_dir / 'metadata.json'}: 'name' must be a Kernel Hub name "
            f"(lowercase letters, digits and dashes), got {name!r}; refusing to import from it",
            hint="the build is malformed or hostile; remove it and report it to its publisher",
        )
    return pyname


def _inside(path: Path, folder: Path) -> Path | None:
    """`path` resolved, if it lies inside `folder` (a resolved path), else None."""
    try:
        real = path.resolve()
    except OSError:
        return None
    return real if real.is_relative_to(folder) else None


def package_dir(variant_dir: Path, metadata: dict[str, object], *, links: bool = False) -> Path:
    """Where the package's `__init__.py` is: flattened layout, or `<python_name>/`.

    Always a folder inside `variant_dir` (resolved): code from anywhere else is never imported,
    even if a symlink or a hostile `name` points there. With `links`, the package's files may
    be symlinks to elsewhere (the Hugging Face cache's snapshot folders link every file into
    its blob store); only for the caller's own folders, never for the store's trees.
    """
    return _package_dir(variant_dir.resolve(), metadata, links=links)


def _package_dir(folder: Path, metadata: dict[str, object], *, links: bool) -> Path:
    """`package_dir` of a resolved `folder`. An entry that is no symlink is inside by
    construction, so only links cost a `resolve()` (path by path, ~30 us each)."""
    pyname = python_name(folder, metadata)
    candidates = [folder] if pyname is None else [folder, folder / pyname]
    for candidate in candidates:
        init = candidate / "__init__.py"
        try:
            st = os.lstat(init)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (candidate is folder or not candidate.is_symlink()):
            return candidate
        if not init.is_file():
            continue
        real = _inside(candidate, folder)
        if real is None or (not links and _inside(init, real) is None):
            raise KernelLoadError(
                f"{init} leads out of the variant folder {folder}; refusing to import it"
            )
        return real
    raise KernelLoadError(
        f"{folder} has neither __init__.py nor <python name>/__init__.py; "
        "not a Kernel Hub build variant"
    )


def _file_inside(module: ModuleType, folder: Path) -> bool:
    origin = getattr(module, "__file__", None)
    if not isinstance(origin, str):
        return False
    try:
        return Path(origin).resolve().is_relative_to(folder)
    except OSError:
        return False


def _imported_from(module: ModuleType) -> Path | None:
    """The variant folder an imported kernel module came from (ours, or the `kernels`
    package's: the folder of its `__init__.py`, unresolved, as a Hub cache snapshot has it)."""
    tree = getattr(module, TREE_ATTR, None)
    if isinstance(tree, str):
        return Path(tree)
    origin = getattr(module, "__file__", None)
    return Path(origin).parent if isinstance(origin, str) else None


def _same_build(existing: ModuleType, folder: Path, *, links: bool = False) -> bool:
    """Is `folder` the build `existing` was imported from: byte-identical metadata.json with a
    digest of every file, and `folder`'s files match that digest? (No code from `folder` runs.)
    `links`: a folder of the caller's whose files may be links (a Hugging Face cache snapshot's
    point into its blobs): their targets are hashed, else such a copy of an imported build would
    be refused as another build with the same id (issue 53)."""
    from kerneld_client import tree_verify
    from kerneld_client.errors import CorruptTree

    other = _imported_from(existing)
    if other is None:
        return False
    try:
        mine = (folder / "metadata.json").read_bytes()
        theirs = (other / "metadata.json").read_bytes()
    except OSError:
        return False
    if mine != theirs or tree_verify.metadata_digest(mine) is None:
        return False
    try:
        # Bytecode a standard import wrote there is no part of the build (none of it runs).
        tree_verify.verify_tree(folder, None, skip_bytecode=True, follow_links=links)
    except CorruptTree:
        return False
    return True


def _resource_reader(archive: Path) -> TraversableResources:
    """`importlib.resources` over the archive (kernels read data files through it)."""
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import TraversableResources
    else:  # pragma: no cover - Python 3.10
        from importlib.abc import TraversableResources

    class _ZipResources(TraversableResources):
        def files(self) -> Traversable:
            import zipfile

            return zipfile.Path(archive)

    return _ZipResources()


class _ZipPackageLoader(importlib.machinery.SourceFileLoader):
    """The package `__init__` of a zip build, read from its archive; as `kernels` 0.19 does it.
    Never writes anything (zipimport compiles in memory)."""

    def __init__(self, fullname: str, archive: Path) -> None:
        super().__init__(fullname, f"{archive}/__init__.py")
        self._archive = archive
        self._zip = zipimport.zipimporter(str(archive))

    def get_code(self, fullname: str) -> CodeType:
        code = self._zip.get_code("__init__")
        if code is None:  # pragma: no cover - zipimporter raises rather than return None
            raise ImportError(f"no __init__ in {self._archive}")
        return code

    def get_source(self, fullname: str) -> str | None:
        return self._zip.get_source("__init__")

    def get_data(self, path: str) -> bytes:
        return self._zip.get_data(path)

    def set_data(self, path: str, data: Buffer, *, _mode: int = 0o666) -> None:
        """Refuse every write the import system attempts (bytecode caches)."""

    def get_resource_reader(self, fullname: str) -> TraversableResources:  # type: ignore[override]
        return _resource_reader(self._archive)


def _zip_archive(folder: Path, name: str, metadata: dict[str, object], *, links: bool) -> Path:
    """The archive of a zip build, `<id>.zip` in the variant folder: a regular file inside it
    (a link leading out is refused, except in the caller's own folders)."""
    archive = folder / f"{name}.zip"
    try:
        st = os.lstat(archive)
    except OSError:
        raise KernelLoadError(
            f"{folder / 'metadata.json'} says build-layout zip, but {archive.name} is missing",
            hint="the build is incomplete: fetch it again, or ask its publisher to fix it",
        ) from None
    if stat.S_ISREG(st.st_mode) or (links and archive.is_file()):
        return archive  # a caller's own folder (a Hub cache snapshot) links to its blobs
    real = _inside(archive, folder)
    if real is None or not real.is_file():
        raise KernelLoadError(f"{archive} is not a file inside {folder}; refusing to import it")
    return real


def _layout(folder: Path, metadata: dict[str, object]) -> str:
    from kerneld_client.metadata import build_layout

    try:
        return build_layout(metadata)
    except ValueError as exc:
        raise KernelLoadError(
            f"{folder / 'metadata.json'}: {exc}",
            hint="the build needs a newer kerneld_client (or it is malformed)",
        ) from None


def _spec(
    name: str, folder: Path, metadata: dict[str, object], *, links: bool
) -> importlib.machinery.ModuleSpec:
    """The import spec of the variant's package: its `__init__.py` (files layout), or the
    archive's `__init__` with submodules from the folder, then the archive (zip layout)."""
    if metadata.get("build-layout") is not None and _layout(folder, metadata) == "zip":
        archive = _zip_archive(folder, name, metadata, links=links)
        spec = importlib.machinery.ModuleSpec(
            name, _ZipPackageLoader(name, archive), origin=f"{archive}/__init__.py", is_package=True
        )
        spec.submodule_search_locations = [str(folder), str(archive)]
        spec.has_location = True
        return spec
    pkg = _package_dir(folder, metadata, links=links)
    init = pkg / "__init__.py"
    loader = _NoBytecodeSourceLoader(name, str(init))
    spec_or_none = importlib.util.spec_from_file_location(
        name, init, loader=loader, submodule_search_locations=[str(pkg)]
    )
    if spec_or_none is None:  # pragma: no cover - spec_from_file_location with a loader never fails
        raise KernelLoadError(f"cannot build an import spec for {init}")
    return spec_or_none


def import_variant(
    variant_dir: Path | str,
    *,
    cache_bytecode: bool = False,
    own_folder: bool = False,
    metadata: dict[str, object] | None = None,
    real: bool = False,
) -> ModuleType:
    """Import the variant at `variant_dir` and return its package module.

    `cache_bytecode` declares the folder immutable (a verified store tree), so its compiled
    code may be reused from the per-user bytecode cache by later processes. `own_folder` is a
    folder of the caller's (a local kernel): its files may be symlinks, as in a Hugging Face
    cache snapshot.

    Importing the same folder twice returns the same module, and so does another folder holding
    the same build (identical metadata.json with a file digest its files match). A different
    build whose metadata `id` is already imported is refused: it would register the same ops.
    `metadata`: the folder's metadata.json as the caller already read it (`read_metadata`),
    so the warm path reads it once; `real`: `variant_dir` is already a resolved path (the
    trust checks resolved it), so it is not resolved again.
    """
    folder = Path(variant_dir) if real else Path(variant_dir).resolve()
    if metadata is None:
        metadata = read_metadata(folder)
    name = module_name_for(folder, metadata)
    spec = _spec(name, folder, metadata, links=own_folder)
    with _lock:
        existing = sys.modules.get(name)
        if existing is not None:
            if getattr(existing, TREE_ATTR, None) == str(folder) or _file_inside(existing, folder):
                # Same folder, possibly imported by another loader (the `kernels` package).
                return existing
            if _same_build(existing, folder, links=own_folder):
                # The same build from another folder (a Hub cache copy, then the store's):
                # the module already running is it, and nothing is registered twice.
                return existing
            raise KernelLoadError(
                f"module {name!r} is already imported from "
                f"{getattr(existing, TREE_ATTR, getattr(existing, '__file__', '?'))}; "
                f"refusing to import a second build with the same id from {folder}"
            )
        _register_root(folder, cache_bytecode=cache_bytecode)
        module = importlib.util.module_from_spec(spec)
        setattr(module, TREE_ATTR, str(folder))
        sys.modules[name] = module
        loader = spec.loader
        assert loader is not None
        try:
            loader.exec_module(module)
        except BaseException as exc:
            for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[mod]
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise KernelLoadError(f"importing {folder} as {name!r} failed: {exc!r}") from exc
    return module
