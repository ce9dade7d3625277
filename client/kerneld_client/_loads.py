"""What this process has loaded, and how a store tree is imported: the state the warm fast path
(`_warm`) and the staged loader (`loader`, `loading/`) share, defined once.

The memo of loads, the registry of loaded kernels (`LoadedKernel`) and of the tree locks held for
them (kept for the life of the process, so the daemon's GC never removes a tree a job loaded),
the dependencies a kernel sees while it is imported, and the import hook that never writes into a
tree (its compiled code goes to a per-user cache; `importer` tells the whole story). Standard
library only: every warm load imports it. It is also where the fast path reads its variables
(`setting`), by the names `_config` gives them (importing `_config` costs a warm load 0.2 ms;
tests/client/test_warm_fast.py checks the names).
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import importlib.machinery
import importlib.util
import marshal
import os
import stat
import sys
import threading
import zipimport
import zlib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from kerneld_client.kernel_metadata import Metadata
    from kerneld_client.published_index import Provenance
    from kerneld_client.repo_info import RepoInfo


def setting(name: str) -> str:
    """A variable's value, as the warm fast path reads it ("" when unset)."""
    return os.environ.get(name, "")


class _Missing:
    """Sentinel type: no `fallback=` object was given."""

    def __repr__(self) -> str:
        return "<no fallback>"


MISSING: Final = _Missing()


# --- the registry of loads, shared with the staged loader ----------------------------------


class _KernelsDataclass:
    """What `dataclasses` reads on LoadedKernel: `kernels`' (built on use, off the warm path)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        from kerneld_client.repo_info import kernels_loaded_kernel

        return getattr(kernels_loaded_kernel(), self.name)


class LoadedKernel:
    """One kernel variant loaded into this process, and where it came from.

    `source` is `index` (warm path), `daemon` (RPC path), `hub` (the hub fallback) or `local`.
    (A plain slotted class: a frozen dataclass would cost a millisecond at import.)
    """

    __dataclass_fields__ = _KernelsDataclass()
    __dataclass_params__ = _KernelsDataclass()

    __slots__ = (
        "_meta",
        "commit",
        "digest",
        "module",
        "path",
        "ref",
        "repo_id",
        "source",
        "variant",
    )

    def __init__(
        self,
        *,
        repo_id: str,
        ref: str,
        commit: str,
        variant: str,
        path: Path,
        digest: str,
        module: ModuleType,
        metadata: Mapping[str, Any],
        source: str,
    ) -> None:
        self.repo_id = repo_id
        self.ref = ref
        self.commit = commit
        self.variant = variant
        self.path = path
        self.digest = digest
        self.module = module
        self._meta = metadata
        self.source = source

    @property
    def metadata(self) -> Metadata:
        """`kernels`' Metadata attributes (`.name`, `.backend`...) on the parsed JSON object
        (built on first use: its module is not on the warm path)."""
        from kerneld_client.kernel_metadata import Metadata

        meta = self._meta
        if not isinstance(meta, Metadata):
            meta = self._meta = Metadata.of(meta)
        return meta

    @property
    def module_name(self) -> str:
        return self.module.__name__

    @property
    def repo_info(self) -> RepoInfo | None:
        """The repo and the commit it was loaded at (`kernels`' field; its dataclass); None for
        a local kernel."""
        if self.source == "local":
            return None
        from kerneld_client.repo_info import RepoInfo

        return RepoInfo(self.repo_id, self.commit or self.ref)

    @property
    def provenance(self) -> Provenance | None:
        """Who signed this tree, as kerneld checked it when the tree entered the store
        (`[provenance]`); None: nothing recorded (a local or hub-fallback kernel, or a daemon
        that checks no signatures). From the index entry a warm load used, else read from the
        published index when asked (`loading.loaded.provenance_of`)."""
        if self.source not in ("index", "daemon"):
            return None
        # the staged loader's (which builds on this module), looked up as the package's names are
        loaded = importlib.import_module("kerneld_client.loading.loaded")
        return loaded.provenance_of(self)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return (
            f"LoadedKernel({self.repo_id}@{self.ref} commit={self.commit[:12]} "
            f"variant={self.variant} module={self.module_name} source={self.source})"
        )


#: (repo, version, revision, locked commit, backend, check_arch, allow_fetch, locks, trust,
#: LOCAL_KERNELS folder) -> the first successful load of it (`loading.call`'s memo).
MEMO: dict[tuple[object, ...], LoadedKernel] = {}
#: repo -> every `vN` upstream, as the last index document read for it said.
VERSIONS_SEEN: dict[str, tuple[int, ...] | None] = {}
#: tree digest -> who signed it, as the index entry a warm load used said (a `Provenance`, or
#: None; this module keeps (status, signer, issuer), made a `Provenance` when asked).
PROVENANCE_SEEN: dict[str, object] = {}
#: The dependencies (repo -> module) of the kernel being imported (`_deps.get_kernel_dep`).
DEPENDENCIES: ContextVar[Mapping[str, ModuleType] | None] = ContextVar(
    "kerneld_kernel_deps", default=None
)

_registry_lock = threading.Lock()
_loaded: dict[str, LoadedKernel] = {}  # by real tree path, in load order
_held: dict[str, int] = {}  # real tree path -> fd holding the OFD read lock (kept until exit)
_importing: dict[str, threading.Lock] = {}  # real tree path -> lock of its one import


def loaded_kernels() -> list[LoadedKernel]:
    """Every kernel variant loaded into this process (a new list, in load order)."""
    with _registry_lock:
        return list(_loaded.values())


def registered(real: str) -> LoadedKernel | None:
    return _loaded.get(real)


def register(real: str, loaded: LoadedKernel) -> LoadedKernel:
    """Record a load; the first registration of a tree wins."""
    with _registry_lock:
        return _loaded.setdefault(real, loaded)


def importing(real: str) -> threading.Lock:
    """The lock held (`with importing(real):`) while `real` is imported: a second thread loading
    the same tree waits, then finds it registered. Only the import is under it, never a
    dependency's load. The lock itself, not a generator context manager around it (that cost
    the warm call a generator and a wrapper object, and the import a decoration)."""
    with _registry_lock:
        return _importing.setdefault(real, threading.Lock())


class TreeGone(Exception):
    """The tree was deleted between finding it and locking it: treat as a miss."""


#: ``struct flock`` (``hhqqi`` + 4 bytes of padding on 64-bit Linux) for a whole-file lock,
#: built without `struct`; OFD locks require ``l_pid == 0``.
_FLOCK_SIZE = 32
OFD_READ = fcntl.F_RDLCK.to_bytes(2, sys.byteorder) + bytes(_FLOCK_SIZE - 2)
OFD_WRITE = fcntl.F_WRLCK.to_bytes(2, sys.byteorder) + bytes(_FLOCK_SIZE - 2)
_CONFLICT = (errno.EAGAIN, errno.EACCES)


def ofd_lock(fd: int, kind: bytes, *, blocking: bool) -> None:
    """An open-file-description lock on the whole file (`file_locks` tells why these)."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if blocking else fcntl.F_OFD_SETLK, kind)
    except OSError as exc:
        if exc.errno in _CONFLICT and not isinstance(exc, BlockingIOError):
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)) from exc
        raise


def lock_shared(lock_path: str | Path, tree_path: str | Path, *, blocking: bool = False) -> int:
    """The OFD read lock on a tree's lock file; the fd that holds it (`file_locks.lock_shared`
    documents the protocol). TreeGone when GC removed the tree under us."""
    fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        ofd_lock(fd, OFD_READ, blocking=blocking)
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same or not os.path.isdir(tree_path):
            raise TreeGone(str(tree_path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold(real_tree: str, lock_path: str | Path, tree: str | Path) -> bool:
    """Take the OFD read lock on a store tree for the life of the process; True if taken now
    (False: this process holds it already). Raises what `lock_shared` raises."""
    with _registry_lock:
        if real_tree in _held:
            return False
        _held[real_tree] = lock_shared(lock_path, tree)
        return True


def release(real_tree: str) -> None:
    """Give the lock back after a load that failed before its tree was registered."""
    with _registry_lock:
        fd = _held.pop(real_tree, None)
    if fd is not None:
        os.close(fd)


def _after_fork_in_child() -> None:
    """A thread of the parent may have held these at fork; the child has only this thread."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _importing.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


# --- the import hook: never a byte written into a tree (`importer` tells the whole story) --------

_import_lock = threading.RLock()
_roots: set[str] = set()
_cached_roots: set[str] = set()  # immutable trees whose compiled code may be cached
_hook_installed = False
#: Attribute set on every imported kernel module: the variant folder it came from.
TREE_ATTR = "__kerneld_tree__"
_OFF = ("0", "false", "no", "off")
_dir_memo: tuple[str, bool, Path | None] | None = None


def _bytecode_dir(*, writing: bool) -> Path | None:
    """$KERNELD_BYTECODE_CACHE (a directory, or off), else the per-user cache."""
    global _dir_memo
    raw = setting("KERNELD_BYTECODE_CACHE").strip()
    memo = _dir_memo
    if memo is not None and memo[0] == raw and memo[1] == writing:
        return memo[2]
    folder: Path | None
    if raw.lower() in _OFF:
        folder = None
    elif raw:
        folder = Path(raw)
    elif writing and sys.dont_write_bytecode:
        folder = None
    else:
        folder = _default_bytecode_dir()
    if not writing or not sys.dont_write_bytecode:
        _dir_memo = (raw, writing, folder)
    return folder


def _default_bytecode_dir() -> Path | None:
    """The per-user cache; when the home is read-only or absent (container images), a private
    folder in the temp directory; never the store."""
    cache, home = setting("XDG_CACHE_HOME"), setting("HOME")
    if cache or home:  # `locations.user_cache_dir()`, without importing it
        folder = Path(cache or Path(str(home), ".cache"), "kerneld", "bytecode")
    else:
        from kerneld_client.locations import user_cache_dir

        folder = user_cache_dir() / "bytecode"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        from kerneld_client.locations import private_tmp_dir

        return private_tmp_dir("bytecode")
    return folder


_MAGIC = importlib.util.MAGIC_NUMBER.hex()


def _bytecode_key(path: str, st: os.stat_result) -> str:
    """`<magic>-<crc32 of the path>-<inode>-<size>-<mtime ns>` (no sha256: its first use in a
    process costs more than the rest of a cache hit, and the key needs no secrecy)."""
    crc = zlib.crc32(os.fsencode(path))
    return f"{_MAGIC}-{crc:08x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"


def _cached_code(path: str, key: str) -> CodeType | None:
    folder = _bytecode_dir(writing=False)
    if folder is None:
        return None
    try:
        # O_NONBLOCK: in a shared cache folder another user could plant a FIFO under a key.
        fd = os.open(
            os.path.join(folder, key), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        )
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            return None
        data = os.read(fd, st.st_size + 1)
        # Only this user can have written it (owner and mode checked): as trusted as its code.
        code = marshal.loads(data)  # noqa: S302
    except (OSError, EOFError, ValueError, TypeError):
        return None
    finally:
        os.close(fd)
    return code if isinstance(code, CodeType) and code.co_filename == path else None


def _store_code(key: str, code: CodeType) -> None:
    folder = _bytecode_dir(writing=True)
    if folder is None:
        return
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)  # left by a crashed process of this user with this pid
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, 0o600), "wb") as fh:
            marshal.dump(code, fh)
        os.replace(tmp, folder / key)
    except OSError:
        return


class NoBytecodeSourceLoader(importlib.machinery.SourceFileLoader):
    """Never writes bytecode next to the sources; compiled code lives in the per-user cache."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        if not _under(path, _cached_roots):
            return compile(self.get_data(path), path, "exec", dont_inherit=True, optimize=-1)
        key = _bytecode_key(path, os.stat(path))
        code = _cached_code(path, key)
        if code is None:
            code = compile(self.get_data(path), path, "exec", dont_inherit=True, optimize=-1)
            _store_code(key, code)
        return code

    def set_data(self, path: str, data: Buffer, *, _mode: int = 0o666) -> None:
        """Refuse every write the import system attempts (bytecode caches)."""


def _archive_of(path: str) -> str | None:
    """The zip archive `path` is (`.../<id>.zip`) or lies in (`.../<id>.zip/layers`), if any."""
    end = path.find(".zip")
    while end != -1:
        head = path[: end + 4]
        if (len(path) == end + 4 or path[end + 4] == "/") and os.path.isfile(head):
            return head
        end = path.find(".zip", end + 4)
    return None


def _under(path: str, roots: set[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _path_hook(path: str) -> importlib.machinery.FileFinder | zipimport.zipimporter:
    if not _under(path, _roots):
        raise ImportError("not a kerneld kernel folder")
    if _archive_of(path) is not None:  # a zip build's archive, or a package folder inside it
        return zipimport.zipimporter(path)
    return importlib.machinery.FileFinder(
        path,
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (NoBytecodeSourceLoader, importlib.machinery.SOURCE_SUFFIXES),
    )


def register_root(folder: Path | str, *, cache_bytecode: bool = False) -> None:
    """Serve `folder` (and every folder in it) through the hook from now on."""
    global _hook_installed
    root = str(folder)
    with _import_lock:
        if not _hook_installed:
            sys.path_hooks.insert(0, _path_hook)
            _hook_installed = True
        if cache_bytecode:
            _cached_roots.add(root)
        if root not in _roots:
            _roots.add(root)
            _forget_cached_finders(root)


def _forget_cached_finders(root: str) -> None:
    """Drop the finders cached for `root` and every folder in it before it was registered:
    they would bypass the hook. Walks the folder's few directories rather than the whole
    finder cache (hundreds of entries in a training process)."""
    cache = sys.path_importer_cache
    stack, seen = [root], set()
    while stack:
        folder = stack.pop()
        cache.pop(folder, None)
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if not entry.is_dir():
                        continue
                    if entry.is_symlink():  # a link back up must not loop
                        st = entry.stat()
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    stack.append(entry.path)
        except OSError:
            continue
