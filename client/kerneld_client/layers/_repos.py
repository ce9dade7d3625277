"""Layer repositories: where a kernel layer comes from, and the per-process kernel cache.

`LayerRepository`, `LockedLayerRepository` and `LocalLayerRepository` have the constructors of
their `kernels` namesakes, but load through `kerneld_client.loader` (the host's kerneld store:
published index, then the daemon), so a model with 48 RMSNorm layers costs one index read, not
48 Hub round trips. Each also has `load()` (the `kernels` repository protocol: returns the layer
class, raises on failure), so a repository can be handed to code written for `kernels`.

Every kernel is obtained once per process per (repository, revision, backend): `kernel_source()`
caches the loaded module with its provenance (commit, variant, metadata). Failures are not
cached here (the daemon may come back); `kernelize` remembers them for the length of one call.
Construction never does I/O: a repository in a mapping that is never used costs nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kerneld_client.errors import KernelLoadError

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "KernelSource",
    "LayerRepository",
    "LocalLayerRepository",
    "LockedLayerRepository",
    "clear_kernel_cache",
    "get_layer_class",
    "kernel_source",
]


@dataclass(frozen=True)
class KernelSource:
    """A kernel module loaded for a repository, and where exactly it came from."""

    module: ModuleType
    repo: str
    revision: str
    commit: str = ""
    variant: str = ""
    path: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    provenance: str = ""
    """Who signed it, as the daemon checked at ingest (`LoadedKernel.provenance`); empty:
    nothing recorded."""


class _Repository:
    """What `kernelize` needs from a repository; the three public classes implement it."""

    layer_name: str

    def cache_key(self, backend: str | None) -> Hashable:
        """Identifies the kernel (not the layer): equal keys share one loaded module."""
        raise NotImplementedError

    def describe(self) -> tuple[str, str]:
        """(repo, revision) for reports, without I/O."""
        raise NotImplementedError

    def disable_ids(self) -> tuple[str | None, frozenset[str]]:
        """(repo id, revisions it is known by before loading) for `KERNELD_DISABLE`."""
        raise NotImplementedError

    def fetch(self, backend: str | None) -> KernelSource:
        """Obtain the kernel module (uncached); raises the client's typed errors."""
        raise NotImplementedError

    def layer_class(self, source: KernelSource) -> type[nn.Module]:
        """The hub layer this repository names in a loaded kernel (`layers.<layer_name>`)."""
        return get_layer_class(source, self.layer_name, str(self))

    def load(self) -> type[nn.Module]:
        """The `kernels` repository protocol: the layer class, or an exception."""
        return self.layer_class(kernel_source(self, None))


def _source_of(module: ModuleType, repo: str, revision: str) -> KernelSource:
    """Commit and variant of a module the client loaded, from its record of loaded kernels."""
    from kerneld_client import loader

    for loaded in reversed(loader.loaded_kernels()):
        if loaded.module is module:
            return KernelSource(
                module=module,
                repo=repo,
                revision=revision,
                commit=loaded.commit,
                variant=loaded.variant,
                path=str(loaded.path),
                metadata=dict(loaded.metadata),
                provenance=str(loaded.provenance or ""),
            )
    # Not loaded through the client's records (a `fallback=` object would land here).
    return KernelSource(module=module, repo=repo, revision=revision)


def _as_module(value: object, what: str) -> ModuleType:
    if not isinstance(value, ModuleType):
        raise KernelLoadError(
            f"the client returned {value!r} instead of a kernel module", repo_id=what
        )
    return value


class LayerRepository(_Repository):
    """A layer of a Hub kernel repo at a version (branch `vN`) or a revision.

    `trust_remote_code` and `user_agent` are accepted for compatibility with `kernels`; trust is
    the host administrator's policy (kerneld's allow/deny lists), and they matter only to the
    client's `hub` fallback.
    """

    def __init__(
        self,
        repo_id: str,
        *,
        layer_name: str,
        revision: str | None = None,
        version: int | None = None,
        backend: str | None = None,
        trust_remote_code: bool | list[str] = False,
        user_agent: str | dict[str, str] | None = None,
        check_arch: bool = True,
    ) -> None:
        if revision is not None and version is not None:
            raise ValueError("Either a revision or a version must be specified, not both.")
        if revision is None and version is None:
            raise ValueError("Either a revision or a version must be specified.")
        self.repo_id = repo_id
        self.layer_name = layer_name
        self.revision = revision
        self.version = version
        self.backend = backend
        self._trust_remote_code: bool | tuple[str, ...] = (
            tuple(trust_remote_code) if isinstance(trust_remote_code, list) else trust_remote_code
        )
        self._user_agent = user_agent
        self.check_arch = check_arch

    @property
    def ref(self) -> str:
        """The ref asked for: `vN` for a version (versions are branches)."""
        return f"v{self.version}" if self.version is not None else str(self.revision)

    def cache_key(self, backend: str | None) -> Hashable:
        key = ("hub", self.repo_id, self.revision, self.version, self.backend or backend)
        return key if self.check_arch else (*key, "no-arch-check")

    def describe(self) -> tuple[str, str]:
        return self.repo_id, self.ref

    def disable_ids(self) -> tuple[str | None, frozenset[str]]:
        return self.repo_id, frozenset({self.ref})

    def fetch(self, backend: str | None) -> KernelSource:
        from kerneld_client import loader

        trust = self._trust_remote_code
        module = loader.get_kernel(
            self.repo_id,
            revision=self.revision,
            version=self.version,
            backend=self.backend or backend,
            trust_remote_code=list(trust) if isinstance(trust, tuple) else trust,
            user_agent=self._user_agent,
            check_arch=self.check_arch,
        )
        return _source_of(_as_module(module, self.repo_id), self.repo_id, self.ref)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LayerRepository)
            and (self.repo_id, self.layer_name, self.revision, self.version, self.backend)
            == (other.repo_id, other.layer_name, other.revision, other.version, other.backend)
            and self._trust_remote_code == other._trust_remote_code
            and self.check_arch == other.check_arch
        )

    def __hash__(self) -> int:
        return hash((self.repo_id, self.layer_name, self.revision, self.version, self.backend))

    def __str__(self) -> str:
        return f"`{self.repo_id}` ({self.ref}), layer `{self.layer_name}`"

    def __repr__(self) -> str:
        selector = (
            f"version={self.version}" if self.version is not None else f"revision={self.revision!r}"
        )
        return f"LayerRepository({self.repo_id!r}, layer_name={self.layer_name!r}, {selector})"


class LocalLayerRepository(_Repository):
    """A layer of a kernel on local disk: a repo with `build/<variant>/`, or a variant folder."""

    def __init__(self, repo_path: str | Path, *, layer_name: str, check_arch: bool = True) -> None:
        self.repo_path = Path(repo_path)
        self.layer_name = layer_name
        self.check_arch = check_arch

    def cache_key(self, backend: str | None) -> Hashable:
        return ("local", str(self.repo_path.absolute()), backend, self.check_arch)

    def describe(self) -> tuple[str, str]:
        return str(self.repo_path), ""

    def disable_ids(self) -> tuple[str | None, frozenset[str]]:
        return None, frozenset()

    def fetch(self, backend: str | None) -> KernelSource:
        from kerneld_client import loader

        module = loader.get_local_kernel(
            self.repo_path, backend=backend, check_arch=self.check_arch
        )
        return _source_of(_as_module(module, str(self.repo_path)), str(self.repo_path), "")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LocalLayerRepository)
            and self.layer_name == other.layer_name
            and self.repo_path == other.repo_path
            and self.check_arch == other.check_arch  # as kernels 0.19.1 compares them
        )

    def __hash__(self) -> int:
        return hash((self.layer_name, self.repo_path, self.check_arch))

    def __str__(self) -> str:
        return f"`{self.repo_path}` (layer `{self.layer_name}`)"

    def __repr__(self) -> str:
        return f"LocalLayerRepository({str(self.repo_path)!r}, layer_name={self.layer_name!r})"


def _caller_module() -> str:
    """The module that called into kerneld_client (to find its package's `kernels.lock`)."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(
        "kerneld_client"
    ):
        frame = frame.f_back  # type: ignore[assignment]
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


class LockedLayerRepository(_Repository):
    """A layer of a kernel at the commit a `kernels.lock` pins (either lock format).

    Without `lockfile`, the lock file in the installed metadata of the package that constructed
    the repository is used, as in `kernels`. Unlike `kernels`, a missing lock does not raise
    here: the lock is read when the layer is first kernelized, so a problem with it is a
    fallback (or an error under `use_fallback=False` / `KERNELD_REQUIRE=1`), not a crash at
    import time.
    """

    def __init__(
        self,
        repo_id: str,
        *,
        lockfile: str | Path | None = None,
        layer_name: str,
        trust_remote_code: bool | list[str] = False,
        check_arch: bool = True,
    ) -> None:
        self.repo_id = repo_id
        self.check_arch = check_arch
        self.lockfile = Path(lockfile) if lockfile is not None else None
        self.layer_name = layer_name
        self._caller = _caller_module() if lockfile is None else ""
        self._trust_remote_code: bool | tuple[str, ...] = (
            tuple(trust_remote_code) if isinstance(trust_remote_code, list) else trust_remote_code
        )
        self._pin: tuple[str, str | None] | None = None
        self._pin_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # copies and pickles (a kernelized model's, too) carry the pin read so far, not the lock
        state = dict(self.__dict__)
        del state["_pin_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pin_lock = threading.Lock()

    def pin(self) -> tuple[str, str | None]:
        """(commit, ref or None) that the lock file pins for this repo; read once."""
        with self._pin_lock:
            if self._pin is None:
                self._pin = self._read_pin()
            return self._pin

    def _lock_text(self) -> tuple[str | bytes, str]:
        from kerneld_client import lockfile as lf

        if self.lockfile is not None:
            try:
                return self.lockfile.read_bytes(), str(self.lockfile)
            except OSError as exc:
                raise lf.LockfileError(f"cannot read: {exc}", source=str(self.lockfile)) from None
        import importlib.metadata

        package = self._caller.split(".")[0]
        for dist_name in importlib.metadata.packages_distributions().get(package, []):
            text = importlib.metadata.distribution(dist_name).read_text(lf.LOCKFILE_NAME)
            if text is not None:
                return text, f"{dist_name} ({lf.LOCKFILE_NAME})"
        raise lf.LockfileError(
            f"no {lf.LOCKFILE_NAME} in the installed metadata of the package of "
            f"{self._caller or '?'}; lock the project's kernels and reinstall it, or pass lockfile="
        )

    def _read_pin(self) -> tuple[str, str | None]:
        from kerneld_client import lockfile as lf

        text, source = self._lock_text()
        parsed = lf.parse_lockfile(text, source=source)
        for repo, commit, ref in parsed.pinned():
            if repo == self.repo_id:
                return commit, ref
        raise lf.LockfileError(f"kernel `{self.repo_id}` is not locked", source=source)

    def cache_key(self, backend: str | None) -> Hashable:
        key = ("hub", self.repo_id, self.pin()[0], None, backend)
        return key if self.check_arch else (*key, "no-arch-check")

    def describe(self) -> tuple[str, str]:
        pin = self._pin
        return self.repo_id, pin[0] if pin is not None else "(locked)"

    def disable_ids(self) -> tuple[str | None, frozenset[str]]:
        try:
            commit, ref = self.pin()
        except Exception:  # reported when the kernel is loaded
            return self.repo_id, frozenset()
        return self.repo_id, frozenset({commit} | ({ref} if ref else set()))

    def fetch(self, backend: str | None) -> KernelSource:
        from kerneld_client import loader

        commit, _ref = self.pin()
        trust = self._trust_remote_code
        if self.lockfile is not None:
            # The client reads the lock file itself, so kernel-depends are pinned by it too.
            module = loader.get_locked_kernel(
                self.repo_id,
                lockfile=self.lockfile,
                backend=backend,
                trust_remote_code=list(trust) if isinstance(trust, tuple) else trust,
                check_arch=self.check_arch,
            )
        else:
            module = loader.get_kernel(
                self.repo_id,
                revision=commit,
                backend=backend,
                trust_remote_code=list(trust) if isinstance(trust, tuple) else trust,
                check_arch=self.check_arch,
            )
        return _source_of(_as_module(module, self.repo_id), self.repo_id, commit)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LockedLayerRepository) and (
            self.repo_id,
            self.layer_name,
            self.lockfile,
            self._caller,
            self.check_arch,
        ) == (other.repo_id, other.layer_name, other.lockfile, other._caller, other.check_arch)

    def __hash__(self) -> int:
        return hash((self.repo_id, self.layer_name, self.lockfile, self._caller, self.check_arch))

    def __str__(self) -> str:
        return f"`{self.repo_id}` (locked), layer `{self.layer_name}`"

    def __repr__(self) -> str:
        where = f"lockfile={str(self.lockfile)!r}" if self.lockfile else f"caller={self._caller!r}"
        return f"LockedLayerRepository({self.repo_id!r}, layer_name={self.layer_name!r}, {where})"


# ------------------------------------------------------------------------------ the cache

_cache: dict[Hashable, KernelSource] = {}
_cache_lock = threading.RLock()


def _load_repository(repo: _Repository, backend: str | None) -> KernelSource:
    """The one place a kernel is actually obtained (tests count calls through it)."""
    return repo.fetch(backend)


def kernel_source(repo: _Repository, backend: str | None) -> KernelSource:
    """The kernel of `repo`, loaded at most once per process per cache key."""
    key = repo.cache_key(backend)
    with _cache_lock:
        cached = _cache.get(key)
        if cached is None:
            cached = _load_repository(repo, backend)
            _cache[key] = cached
        return cached


def clear_kernel_cache() -> None:
    """Forget every loaded kernel source (the modules stay imported): the next `kernelize`
    asks the client again, e.g. after an administrator changed what the host serves."""
    with _cache_lock:
        _cache.clear()


def get_layer_class(source: KernelSource, layer_name: str, where: str = "") -> type[nn.Module]:
    """`layers.<layer_name>` of a kernel module; KernelLoadError when absent."""
    where = where or source.repo
    layers = getattr(source.module, "layers", None)
    if layers is None:
        raise KernelLoadError(f"kernel {where} does not define any layers", repo_id=source.repo)
    layer = getattr(layers, layer_name, None)
    if layer is None:
        public = getattr(layers, "__all__", None) or [
            n for n in dir(layers) if not n.startswith("_") and isinstance(getattr(layers, n), type)
        ]
        raise KernelLoadError(
            f"layer `{layer_name}` not found in kernel {where} (it has: {', '.join(public)})",
            repo_id=source.repo,
        )
    return layer  # type: ignore[no-any-return]
