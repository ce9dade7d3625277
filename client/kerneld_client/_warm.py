"""The warm hit in one slim module: fingerprint -> published pick -> trust verdict -> tree lock ->
import, with the standard library only. `kerneld_client.get_kernel` tries it first.

Importing the staged loader (`loader`, `loading/`: 28 modules, ~5,000 lines) cost a fresh process
5-6 ms, more than the warm call itself; merged into one module it still cost 2.5 ms
(bench/s1_merged.py): the code is the cost, not the layout. So this is a second, slimmer
implementation of the one load that decides start-up time, a kernel in the store whose ref and
pick for this platform the daemon published. It makes every check the staged loader makes on that
load: the store root and the daemon's advert (owner, mode, every directory above them), the index
document (owner, mode, format, its deny list), publishers.json (the `[trust]` verdict), the tree's
OFD read lock, the tree (owner and mode of every entry, no symlink out), metadata.json (id, name,
layout, the device's archs, no `python-depends` or `kernel-depends` to resolve). Anything else,
and any doubt, is a miss (None): the staged loader then does the whole load, so its errors,
fallbacks and every other case are unchanged. Nothing of a tree runs before every check passed.

One copy, shared with the staged loader: the memo of loads, the registry of loaded kernels and of
held tree locks (`LoadedKernel`), the import hook that never writes into a tree and its bytecode
cache, the dependencies a kernel sees while it is imported, and the platform fingerprint. This
module reads the client's variables itself (the names of `_config`, which costs 0.2 ms to import;
tests/client/test_warm_fast.py checks the names agree).
"""

from __future__ import annotations

import errno
import fcntl
import importlib.machinery
import importlib.util
import json
import keyword
import marshal
import os
import stat
import sys
import threading
import zipimport
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any, Final

from kerneld_client.vocabulary import is_commit, is_repo_id, repo_key

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from kerneld_client.kernel_metadata import Metadata
    from kerneld_client.loading.fallback import FallbackPolicy
    from kerneld_client.published_index import Provenance
    from kerneld_client.repo_info import RepoInfo

_env = os.environ


class _Missing:
    """Sentinel type: no `fallback=` object was given."""

    def __repr__(self) -> str:
        return "<no fallback>"


MISSING: Final = _Missing()


# --- the registry of loads, shared with the staged loader ----------------------------------


class LoadedKernel:
    """One kernel variant loaded into this process, and where it came from.

    `source` is `index` (warm path), `daemon` (RPC path), `hub` (the hub fallback) or `local`.
    (A plain slotted class: a frozen dataclass would cost a millisecond at import.)
    """

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
        from kerneld_client.loading.loaded import provenance_of

        return provenance_of(self)

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


@contextmanager
def importing(real: str) -> Iterator[None]:
    """Held while `real` is imported: a second thread loading the same tree waits, then finds
    it registered. Only the import is under it, never a dependency's load."""
    with _registry_lock:
        lock = _importing.setdefault(real, threading.Lock())
    with lock:
        yield


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
    raw = _env.get("KERNELD_BYTECODE_CACHE", "").strip()
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
    cache, home = _env.get("XDG_CACHE_HOME"), _env.get("HOME")
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


# --- the platform's fingerprint -------------------------------------------------------------

_ABI = {True: "cxx11", False: "cxx98", None: "noabi"}


def _field(text: str) -> str:
    """A free-text fact (CPU, OS) that cannot run into the next field."""
    return text.replace("%", "%25").replace("-", "%2D")


def fingerprint(facts: Mapping[str, Any]) -> str:
    """The fingerprint of facts in `PlatformFacts.to_dict()` form (ValueError if malformed):
    what the daemon publishes picks under (`variants.fingerprints` tells what is in it)."""
    try:
        torch = str(facts.get("torch_version") or "")
        backend = facts.get("backend") or {"type": "cpu"}
        parts = [
            f"torch{torch}" if torch else "notorch",
            _ABI[facts.get("cxx11_abi")],
            f"{backend['type']}{backend.get('version') or ''}",
            _field(str(facts["cpu"])),
            _field(str(facts["os"])),
        ]
        python = ".".join(str(facts.get("python_version") or "").split(".")[:2])
        parts.append(f"py{python}{'t' if facts.get('free_threaded') else ''}")
        macos = str(facts.get("macos_version") or "")
        if macos:
            parts.append(f"macos{macos.split('.', maxsplit=1)[0]}")
        tvm_ffi = str(facts.get("tvm_ffi_version") or "")
        if tvm_ffi:
            parts.append(f"tvmffi{tvm_ffi}")
        if facts.get("mlx"):
            parts.append("mlx")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not platform facts: {exc!r}") from None
    return "-".join(parts)


def _two(text: str) -> str:
    """`variants.versions.parse_version(text, parts=2)`, dotted ("" for none): 2.13.0+cpu ->
    2.13."""
    body, groups, start = text.lstrip(), [], 0
    while True:
        end = start
        while end < len(body) and body[end] in "0123456789":
            end += 1
        if end == start:
            break
        groups.append(body[start:end])
        if end + 1 < len(body) and body[end] == "." and body[end + 1] in "0123456789":
            start = end + 1
        else:
            break
    try:
        nums = [int(g) for g in groups[:2]] + [0, 0]
    except ValueError:
        return ""
    return f"{nums[0]}.{nums[1]}" if groups else ""


_platform: tuple[str, str, tuple[str, ...]] | None = None  # (fingerprint, backend, devices)


def platform_key() -> tuple[str, str, tuple[str, ...]] | None:
    """(fingerprint, backend type, device capabilities) of this process, as
    `platform.current_platform()` detects them; None where this module does not detect
    (`KERNELD_PLATFORM_JSON`, no torch imported yet, not Linux, TPU, Neuron, MPS, XPU, NPU,
    tvm-ffi installed): the staged loader then does. Once `kerneld_client.platform` is imported,
    its answer (which `set_platform_facts` may pin) is the answer."""
    global _platform
    full = sys.modules.get("kerneld_client.platform")
    if full is not None:
        p = full.current_platform()
        return p.key, p.backend_type, p.device_capabilities
    if _platform is not None:
        return _platform
    torch = sys.modules.get("torch")
    if torch is None or _env.get("KERNELD_PLATFORM_JSON", "").strip() or sys.platform != "linux":
        return None
    if importlib.util.find_spec("tvm_ffi") is not None:
        return None  # its version comes from package metadata: tens of ms, the staged loader's
    mlx = importlib.util.find_spec("mlx") is not None
    backends, version = getattr(torch, "backends", None), getattr(torch, "version", None)
    if hasattr(backends, "tpu") or hasattr(torch, "neuron"):
        return None
    cuda, hip = getattr(version, "cuda", None), getattr(version, "hip", None)
    if cuda is not None:
        backend, bversion = "cuda", _two(str(cuda))
    elif hip is not None:
        backend, bversion = "rocm", _two(str(hip).split("-")[0])
    else:
        mps = getattr(backends, "mps", None)
        if (mps is not None and mps.is_available()) or getattr(version, "xpu", None) is not None:
            return None
        try:
            if torch._C._get_privateuse1_backend_name() == "npu":
                return None
        except Exception:  # noqa: S110  (as the staged detection: no such backend)
            pass
        backend, bversion = "cpu", ""
    py = sys.version_info
    facts = {
        "torch_version": _two(str(getattr(torch, "__version__", ""))),
        "cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
        "backend": {"type": backend, "version": bversion},
        "cpu": os.uname().machine,
        "os": "linux",
        "python_version": f"{py[0]}.{py[1]}",
        "free_threaded": "t" in getattr(sys, "abiflags", ""),
        "mlx": mlx,
    }
    _platform = (fingerprint(facts), backend, _devices(torch, backend))
    return _platform


def _devices(torch: Any, backend: str) -> tuple[str, ...]:
    """The current device's CUDA capability (`9.0`) or ROCm target (`gfx942`), as
    `platform._device_capabilities` reads them; empty without a usable device."""
    if backend not in ("cuda", "rocm"):
        return ()
    try:
        cuda = torch.cuda
        if not cuda.is_available():
            return ()
        index = cuda.current_device()
        if backend == "cuda":
            major, minor = cuda.get_device_capability(index)
            return (f"{major}.{minor}",)
        return (str(cuda.get_device_properties(index).gcnArchName).split(":", maxsplit=1)[0],)
    except Exception:
        return ()


# --- the store root, the advert, the index: their owners and modes ---------------------------


class _Miss(Exception):
    """Not a warm hit this module serves: the staged loader decides (and says why)."""


_owner_memo: tuple[str, int] | None = None


def _owner_uid() -> int | None:
    """`_config.store_owner_uid()` where /etc/passwd or the variable answers; _Miss where NSS
    would have to (the staged loader asks it)."""
    global _owner_memo
    raw = _env.get("KERNELD_STORE_OWNER", "").strip()
    if raw.isdigit():
        return int(raw)
    config = sys.modules.get("kerneld_client._config")
    if config is not None:
        return config.store_owner_uid()  # type: ignore[no-any-return]
    if _owner_memo is not None and _owner_memo[0] == raw:
        return _owner_memo[1]
    name = (raw or "kerneld").encode("utf-8", "surrogateescape")
    try:
        with open("/etc/passwd", "rb") as f:
            data = b"\n" + f.read(4 << 20)
    except OSError:
        raise _Miss from None
    start = data.find(b"\n" + name + b":")
    if start < 0:
        raise _Miss
    end = data.find(b"\n", start + 1)
    fields = data[start + 1 : end if end >= 0 else None].split(b":")
    if len(fields) > 2 and fields[2].isdigit():
        _owner_memo = (raw, int(fields[2]))
        return _owner_memo[1]
    raise _Miss


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid()) or uid == _owner_uid()


def _check_ancestors(real: str, child_uid: int) -> None:
    """`_path_trust.check_ancestors`: every directory above `real` trusted-owned, and writable
    by nobody else unless sticky with a trusted-owned entry below."""
    child = real
    while True:
        parent = os.path.dirname(child)
        if parent == child:
            return
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode) or not _trusted(st.st_uid):
            raise _Miss
        if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and _trusted(child_uid)):
            raise _Miss
        child, child_uid = parent, st.st_uid


def _socket() -> str:
    """`locations.default_socket()`."""
    env = _env.get("KERNELD_SOCKET")
    if env:
        return str(Path(env))
    if os.path.exists("/run/kerneld/kerneld.sock"):
        return "/run/kerneld/kerneld.sock"
    runtime = _env.get("XDG_RUNTIME_DIR")
    if runtime:
        user = Path(runtime, "kerneld", "kerneld.sock")
    else:
        home = _env.get("HOME")
        if not home:
            raise _Miss
        user = Path(_env.get("XDG_CACHE_HOME") or Path(home, ".cache"), "kerneld/run/kerneld.sock")
    if not user.exists() and os.path.isdir("/run/kerneld"):
        return "/run/kerneld/kerneld.sock"
    return str(user)


def _identity() -> tuple[object, ...]:
    """`locations.store_identity()`: what names the store (_Miss: the defaults do)."""
    env = _env.get("KERNELD_STORE")
    if env:
        return ("KERNELD_STORE", env if os.path.isabs(env) else os.path.join(os.getcwd(), env))
    advert = _socket() + ".json"
    try:
        st = os.lstat(advert)
    except OSError:
        raise _Miss from None
    return (advert, st.st_dev, st.st_ino, st.st_ctime_ns)


def _advert_store() -> tuple[str, tuple[object, ...]]:
    """The store the daemon's advert names, checked as `_path_trust.check_advert` checks it,
    and the advert's identity from the same `fstat`."""
    path = Path(_socket() + ".json")
    real = os.path.join(os.path.realpath(path.parent), path.name)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise _Miss from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st.st_uid) or st.st_mode & 0o022:
            raise _Miss
        _check_ancestors(real, st.st_uid)
        data = os.read(fd, (64 << 10) + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8"))
        if len(data) > 64 << 10 or doc["format"] != "kerneld-advert" or doc["version"] != 1:
            raise _Miss
        for key in ("index_dir", "user_socket", "admin_socket"):
            Path(doc[key])
        int(doc["pid"])
        str(doc["daemon_version"])
        store = str(Path(doc["store_root"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise _Miss from None
    return store, (str(path), st.st_dev, st.st_ino, st.st_ctime_ns)


#: (what named the store, its real path, its owner, (dev, inode, ctime) of the checked root)
_root_memo: tuple[tuple[object, ...], str, int, tuple[int, ...]] | None = None


def _store_root() -> tuple[str, int]:
    """(real path, owner uid) of the store, checked as `loading.loaded.store_root()` checks it,
    in full once per process and store."""
    global _root_memo
    named = _identity()
    memo = _root_memo
    if memo is not None and memo[0] == named:
        try:
            st = os.lstat(memo[1])
            if (st.st_dev, st.st_ino, st.st_ctime_ns) == memo[3]:
                return memo[1], memo[2]
        except OSError:
            pass
    if named[0] == "KERNELD_STORE":
        path = str(Path(_env["KERNELD_STORE"]))
    else:
        path, named = _advert_store()
    real = os.path.realpath(path)
    if real == "/":
        raise _Miss
    try:
        st = os.lstat(real)
    except OSError:
        raise _Miss from None
    if not stat.S_ISDIR(st.st_mode) or not _trusted(st.st_uid) or st.st_mode & 0o022:
        raise _Miss
    _check_ancestors(real, st.st_uid)
    _root_memo = (named, real, st.st_uid, (st.st_dev, st.st_ino, st.st_ctime_ns))
    return real, st.st_uid


def _read_trusted(path: str, owner: int) -> Any:
    """A published index file parsed (`published_index._read_trusted`'s checks); _Miss when
    absent, not the store owner's, writable by others or not JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        raise _Miss from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
            raise _Miss
        if st.st_size > 16 << 20:
            raise _Miss
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        raise _Miss from None


def _index_doc(root: str, owner: int, repo: str) -> dict[str, Any]:
    """The repo's published document, read and checked."""
    org, _, name = repo.partition("/")
    return _checked_doc(_read_trusted(f"{root}/index/v1/{org}/{name}.json", owner), repo)


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _checked_doc(doc: Any, repo: str) -> dict[str, Any]:
    """The per-repo document if `published_index.parse_repo_doc` accepts all of it and it
    describes `repo`; _Miss otherwise (a malformed document is a question for the daemon)."""
    if not isinstance(doc, dict) or doc.get("format") != "kerneld-client-index":
        raise _Miss
    if doc.get("version") != 1 or doc.get("repo") != repo:
        raise _Miss
    int(doc.get("generation") or 0)
    for ref, v in (doc.get("refs") or {}).items():
        if not isinstance(ref, str) or not isinstance(v["commit"], str):
            raise _Miss
        float(v.get("fetched_at") or 0.0)
    for entry in (doc.get("commits") or {}).values():
        upstream, picks = entry.get("upstream_variants"), entry.get("picks") or {}
        if upstream is not None and not _strs(upstream):
            raise _Miss
        if not isinstance(picks, dict) or not all(
            isinstance(p, str) or p is None for p in picks.values()
        ):
            raise _Miss
        for raw in (entry.get("variants") or {}).values():
            prov = raw.get("provenance")
            if not _strs(raw.get("archs") or []) or not _strs(
                [raw.get("tree"), raw.get("digest"), raw.get("lock")]
            ):
                raise _Miss
            if prov is not None and not (
                isinstance(prov, dict)
                and all(isinstance(prov.get(k, ""), str) for k in ("status", "signer", "issuer"))
            ):
                raise _Miss
    for d in doc.get("denies") or []:
        if not isinstance(d["revision"], str):
            raise _Miss
    versions = doc.get("versions")
    if versions is not None and not (
        isinstance(versions, list) and all(type(v) is int and v >= 0 for v in versions)
    ):
        raise _Miss
    return doc


def _publisher_trusted(root: str, owner: int, repo: str, trust_remote_code: bool) -> None:
    """The daemon's `[trust]` verdict as published (`published_index.Publishers.trusts`);
    _Miss unless it is a plain yes (no file: a store never served by a checking daemon)."""
    try:
        doc = _read_trusted(root + "/index/v1/publishers.json", owner)
    except _Miss:
        if os.path.lexists(root + "/index/v1/publishers.json"):
            raise
        return
    if doc.get("format") != "kerneld-publishers" or doc.get("version") != 1:
        raise _Miss
    policy, allow = doc["policy"], doc.get("allow") or []
    orgs = {**(doc.get("orgs") or {}), **(doc.get("repos") or {})}
    trusted_orgs = {repo_key(o) for o, v in orgs.items() if v.get("trusted") is True}
    if not isinstance(policy, str) or not _strs(allow):
        raise _Miss
    if policy == "any" or (trust_remote_code and doc.get("honor_trust_remote_code") is True):
        return
    names = (repo_key(repo.split("/", 1)[0]), repo_key(repo))
    if policy == "hub" and any(n in trusted_orgs for n in names):
        return
    key = repo_key(repo)
    for pattern in map(repo_key, allow):
        if "?" in pattern or "[" in pattern:
            raise _Miss  # fnmatch's patterns: the staged loader's
        first, *rest = pattern.split("*")
        if not rest:
            if key == pattern:
                return
            continue
        last, pos = rest.pop(), len(first)
        end = len(key) - len(last)
        if end < pos or not (key.startswith(first) and key.endswith(last)):
            continue
        for part in rest:
            found = key.find(part, pos, end)
            if found < 0:
                break
            pos = found + len(part)
        else:
            return
    raise _Miss


def _check_tree(root: str, real: str, owner: int) -> None:
    """`_path_trust.check_real_tree`: every directory from the root down and every entry of the
    tree owned by the store owner and writable by nobody else; symlinks only inside it."""
    current = root
    for part in real[len(root) + 1 :].split("/"):
        current = current + "/" + part
        st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
            raise _Miss
    stack = [real]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != owner or st.st_mode & 0o022:
                    raise _Miss
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(entry.path)
                    if target != real and not target.startswith(real + "/"):
                        raise _Miss
                elif stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif not stat.S_ISREG(st.st_mode):
                    raise _Miss


def _clean(rel: Any) -> bool:
    """A relative path of plain names (no `.`, `..`, empty part): real below a real root."""
    return isinstance(rel, str) and all(p not in ("", ".", "..") for p in rel.split("/"))


# --- the hit --------------------------------------------------------------------------------

_POLICIES = ("torch", "hub", "error")


def get_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: int | None = None,
    backend: str | None = None,
    fallback: object = MISSING,
    policy: str | FallbackPolicy | None = None,
    check_arch: bool = True,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict[str, str] | None = None,
) -> Any:
    """Load a kernel from the host's kerneld store (fetched by the daemon if needed).

    Exactly one of `version` (branch `vN`) and `revision` (branch, tag or commit). On failure:
    `policy` (default $KERNELD_FALLBACK, else `torch`) decides; under `torch` the `fallback`
    object is returned if one was given, else the typed error is raised. `trust_remote_code`
    (True, or a list of repo ids) accepts a publisher the host's `[trust]` policy does not
    trust, as in `kernels` (unless the admin turned that off); `user_agent` matters only to the
    `hub` fallback.
    """
    asked: dict[str, Any] = {
        "revision": revision,
        "version": version,
        "backend": backend,
        "fallback": fallback,
        "policy": policy,
        "check_arch": check_arch,
        "trust_remote_code": trust_remote_code,
        "user_agent": user_agent,
    }
    module = None
    try:
        if backend is None and (policy is None or type(policy) is str):
            module = warm_hit(repo_id, version, revision, policy, check_arch, trust_remote_code)
    except _ImportFailed as exc:
        from kerneld_client.loader import failed_import

        return failed_import(str(exc), exc.__cause__, repo_id, **asked)
    if module is not None:
        return module
    from kerneld_client.loader import staged_get_kernel

    return staged_get_kernel(repo_id, **asked)


def warm_hit(
    repo_id: str,
    version: int | None,
    revision: str | None,
    policy: str | None,
    check_arch: bool,
    trust_remote_code: bool | list[str],
) -> ModuleType | None:
    """The kernel's module if this is a warm hit; None: ask the staged loader."""
    if (
        (version is None) == (revision is None)
        or (version is not None and (type(version) is not int or version < 0))
        or (revision is not None and type(revision) is not str)
        or not is_repo_id(repo_id)
        or (policy or _env.get("KERNELD_FALLBACK", "").strip() or "torch") not in _POLICIES
        or _env.get("LOCAL_KERNELS", "").strip()
        or _env.get("KERNELD_REF_MAX_AGE", "").strip()
        or _env.get("KERNELD_VERIFY", "").strip().lower() not in (*_OFF, "")
        or type(check_arch) is not bool
    ):
        return None
    if type(trust_remote_code) is bool:
        trust: bool | frozenset[str] = trust_remote_code
    elif isinstance(trust_remote_code, list | tuple | set | frozenset):
        trust = frozenset(trust_remote_code)
    else:
        return None
    key = (repo_id, version, revision, None, None, check_arch, True, (), trust, "")
    ref = f"v{version}" if version is not None else str(revision)
    memo = MEMO.get(key)
    if memo is not None:
        if repo_id not in VERSIONS_SEEN:
            return None  # the staged loader reads the versions for the notice
        _note_newer_version(repo_id, version)
        return memo.module
    try:
        loaded = _load(repo_id, ref, check_arch, trust is True or (trust and repo_id in trust))
    except _ImportFailed:
        raise
    except Exception:  # any doubt (a check failed, something unexpected): the staged loader's
        return None
    if loaded is None:
        return None
    MEMO[key] = loaded
    _note_newer_version(repo_id, version)
    return loaded.module


def _load(repo: str, ref: str, check_arch: bool, trust_remote_code: bool) -> LoadedKernel | None:
    """The warm hit's checks, in the staged loader's order; then the import."""
    plat = platform_key()
    if plat is None:
        return None
    root, owner = _store_root()
    doc = _index_doc(root, owner, repo)
    versions = doc.get("versions")
    VERSIONS_SEEN[repo] = None if versions is None else tuple(versions)
    resolved = (doc.get("refs") or {}).get(ref)
    commit = resolved["commit"] if resolved is not None else ref if is_commit(ref) else None
    if commit is None or doc.get("denies"):
        return None  # any deny: the staged loader says whether it covers this request
    _publisher_trusted(root, owner, repo, trust_remote_code)
    entry = (doc.get("commits") or {}).get(commit)
    best = (entry.get("picks") or {}).get(plat[0]) if entry is not None else None
    variant = (entry.get("variants") or {}).get(best) if best is not None else None
    if variant is None or not _clean(variant["tree"]) or not _clean(variant["lock"]):
        return None  # not published for this platform, or not in the store: ranked or fetched
    prov = variant.get("provenance")
    digest = variant["digest"]
    PROVENANCE_SEEN[digest] = (
        None if prov is None else tuple(prov.get(k, "") for k in ("status", "signer", "issuer"))
    )
    real = f"{root}/{variant['tree']}"
    existing = registered(real)
    if existing is not None:
        return existing
    taken = hold(real, f"{root}/{variant['lock']}", real)
    try:
        _check_tree(root, real, owner)
        loaded = _import(repo, ref, commit, best, real, digest, check_arch, plat)
    except BaseException:
        if taken:
            release(real)
        raise
    if loaded is None and taken:
        release(real)
    return loaded


def _import(
    repo: str,
    ref: str,
    commit: str,
    variant: str,
    real: str,
    digest: str,
    check_arch: bool,
    plat: tuple[str, str, tuple[str, ...]],
) -> LoadedKernel | None:
    """`materialize._finish` for a checked tree: metadata.json's checks, then the one import."""
    metadata = _metadata(real)
    if not isinstance(metadata, dict) or metadata.get("kernel-depends") is not None:
        return None
    if metadata.get("python-depends") or metadata.get("build-layout") not in (None, "files"):
        return None  # the staged loader checks the distributions, imports a zip build
    if check_arch and not _device_ok(metadata, plat):
        return None
    mid, pyname = metadata.get("id"), metadata.get("name")
    if not isinstance(mid, str) or not mid.isidentifier() or keyword.iskeyword(mid):
        return None
    if pyname is not None:
        pyname = pyname.replace("-", "_") if isinstance(pyname, str) else ""
        if not (pyname.isascii() and pyname.isidentifier()) or keyword.iskeyword(pyname):
            return None
    folder = _package(real, pyname)
    if folder is None:
        return None
    with importing(real):
        existing = registered(real)
        if existing is not None:
            return existing
        token = DEPENDENCIES.set({})
        try:
            module = _exec(mid, real, folder)
        finally:
            DEPENDENCIES.reset(token)
        if module is None:
            return None
        return register(
            real,
            LoadedKernel(
                repo_id=repo,
                ref=ref,
                commit=commit,
                variant=variant,
                path=Path(real),
                digest=digest,
                module=module,
                metadata=metadata,
                source="index",
            ),
        )


def _metadata(real: str) -> Any:
    with open(real + "/metadata.json", "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def _device_ok(metadata: dict[str, Any], plat: tuple[str, str, tuple[str, ...]]) -> bool:
    """`materialize._check_device`: the build's `backend.archs` cover this process's devices
    (only a CUDA or ROCm build on such a process with known devices is checked)."""
    backend = metadata.get("backend")
    if not isinstance(backend, dict):
        return True
    btype, archs = backend.get("type"), backend.get("archs")
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    if not isinstance(btype, str) or not archs or btype.lower() != plat[1] or not plat[2]:
        return True
    from kerneld_client.variants.devices import device_compatible

    return device_compatible(btype, archs, plat[1], plat[2])[0]


def _package(real: str, pyname: str | None) -> str | None:
    """`importer._package_dir` where no symlink is involved: the tree's own `__init__.py`, else
    `<python name>/__init__.py`; None for anything else (the staged loader resolves links)."""
    for folder in (real,) if pyname is None else (real, real + "/" + pyname):
        try:
            st = os.lstat(folder + "/__init__.py")
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (folder == real or not os.path.islink(folder)):
            return folder
        return None
    return None


def _exec(name: str, real: str, folder: str) -> ModuleType | None:
    """`importer.import_variant` of a checked store tree (files layout, its package folder
    found): under the metadata id, through the hook, bytecode from the per-user cache."""
    init = folder + "/__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init, loader=NoBytecodeSourceLoader(name, init), submodule_search_locations=[folder]
    )
    if spec is None or spec.loader is None:
        return None
    with _import_lock:
        existing = sys.modules.get(name)
        if existing is not None:
            # the same folder (or imported by `kernels` from it); anything else: the staged loader
            return existing if getattr(existing, TREE_ATTR, None) == real else None
        register_root(real, cache_bytecode=True)
        module = importlib.util.module_from_spec(spec)
        setattr(module, TREE_ATTR, real)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[mod]
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise _ImportFailed(f"importing {real} as {name!r} failed: {exc!r}") from exc
    return module


class _ImportFailed(Exception):
    """The kernel's own code failed: the typed error, and the fallback, are the staged
    loader's (`loading.call.failed_import`)."""


def _note_newer_version(repo: str, version: int | None) -> None:
    """`kernels`' notice when a load by version is not the repo's newest version."""
    versions = VERSIONS_SEEN.get(repo)
    if version is None or not versions or max(versions) <= version:
        return
    import logging

    config = sys.modules.get("kerneld_client._config")
    name = "kerneld_client"
    if config is not None:
        name = config.kernels_logger("versions", name)
    logging.getLogger(name).warning(
        "You are using version %d of '%s', but version %d is available.",
        version,
        repo,
        max(versions),
    )
