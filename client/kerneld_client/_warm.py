"""The warm hit, slim: fingerprint -> published pick -> trust verdict -> tree lock -> import, with
the standard library only. `kerneld_client.get_kernel` tries it first (issue 56).

Importing the staged loader (`loader`, `loading/`: 28 modules, ~5,000 lines) cost a fresh process
5-6 ms, more than the warm call itself; merged into one module it still cost 2.5 ms
(bench/s1_merged.py): the code is the cost, not the layout. So this is a second, slimmer
implementation of the one load that decides start-up time, a kernel in the store whose ref and
pick for this platform the daemon published. It makes every check the staged loader makes on that
load: the store root and the daemon's advert (owner, mode, every directory above them), the index
document (owner, mode, format, its deny list), publishers.json (the `[trust]` verdict), the tree's
OFD read lock, the tree (owner and mode of every entry, no symlink out), metadata.json (id, name,
layout, the device's archs, no `python-depends` or `kernel-depends` to resolve); the checks of
the store are in `_warm_trust`. Anything else, and any doubt, is a miss (None): the staged loader
then does the whole load, so its errors, fallbacks and every other case are unchanged. Nothing of
a tree runs before every check passed; a kernel whose own import fails gets the staged loader's
error and fallback without being imported twice.

Shared with the staged loader, defined once in `_loads`: the memo, the registry of loaded kernels
and held tree locks, the import hook and its bytecode cache, the dependencies' context."""

from __future__ import annotations

import importlib
import importlib.util
import json
import keyword
import os
import stat
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kerneld_client._loads import (
    DEPENDENCIES,
    MEMO,
    MISSING,
    PROVENANCE_SEEN,
    TREE_ATTR,
    VERSIONS_SEEN,
    LoadedKernel,
    NoBytecodeSourceLoader,
    _import_lock,
    hold,
    importing,
    register,
    register_root,
    registered,
    release,
    setting,
)
from kerneld_client._warm_trust import (
    check_tree,
    clean,
    index_doc,
    publisher_trusted,
    read_file,
    store_root,
)
from kerneld_client.vocabulary import fingerprint, is_commit, is_repo_id

if TYPE_CHECKING:
    from kerneld_client.loading.fallback import FallbackPolicy

_OFF = ("0", "false", "no", "off")


# --- the platform's fingerprint -------------------------------------------------------------


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
    its answer (which `set_platform_facts` may pin) is the answer.

    Detected once per process, as `platform.current_platform` does, and for its reason: torch's
    version, its build (CUDA or HIP version, C++ ABI), Python, the OS and the machine cannot
    change under a process that imported torch. What could (a package installed while it runs
    makes `mlx` findable, `torch.cuda.set_device` another current device) the staged loader also
    reads only once, so caching it here gives its answer, not an older one; a caller that asks
    it to detect again (`refresh=True`) imports `platform`, whose answer then wins (above).
    The first detection costs about 0.2 ms, most of it the two `find_spec` searches of
    `sys.path` that `kernels` also makes."""
    global _platform
    full = sys.modules.get("kerneld_client.platform")
    if full is not None:
        p = full.current_platform()
        return p.key, p.backend_type, p.device_capabilities
    if _platform is not None:
        return _platform
    torch = sys.modules.get("torch")
    if torch is None or setting("KERNELD_PLATFORM_JSON").strip() or sys.platform != "linux":
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
    warm = backend is None and (policy is None or type(policy) is str)
    hit = (repo_id, version, revision, policy, check_arch, trust_remote_code)
    try:
        if warm:
            module = warm_hit(*hit)
    except _ImportFailed as exc:
        return _staged().failed_import(str(exc), exc.__cause__, repo_id, **asked)
    if module is not None or not warm:
        return module if module is not None else _staged().staged_get_kernel(repo_id, **asked)
    from kerneld_client import _coalesce  # a miss: one rank asks, the others wait (issue 56)

    with _coalesce.warm_turn(repo_id, version, revision) as ask:
        try:  # a waiter: the process that asked has published its answer
            module = None if ask else warm_hit(*hit)
        except _ImportFailed as exc:
            return _staged().failed_import(str(exc), exc.__cause__, repo_id, **asked)
        return module if module is not None else _staged().staged_get_kernel(repo_id, **asked)


def _staged() -> Any:
    """The staged loader, which builds on this module (it imports `_loads`): looked up by name
    when it is needed, as the package's lazy names are."""
    return importlib.import_module("kerneld_client.loader")


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
        or (policy or setting("KERNELD_FALLBACK").strip() or "torch") not in _POLICIES
        or setting("LOCAL_KERNELS").strip()
        or setting("KERNELD_REF_MAX_AGE").strip()
        or setting("KERNELD_VERIFY").strip().lower() not in (*_OFF, "")
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
        trusted = trust is True or (not isinstance(trust, bool) and repo_id in trust)
        loaded = _load(repo_id, ref, check_arch, trusted)
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
    root, owner = store_root()
    doc = index_doc(root, owner, repo)
    versions = doc.get("versions")
    VERSIONS_SEEN[repo] = None if versions is None else tuple(versions)
    resolved = (doc.get("refs") or {}).get(ref)
    commit = resolved["commit"] if resolved is not None else ref if is_commit(ref) else None
    if commit is None or doc.get("denies"):
        return None  # any deny: the staged loader says whether it covers this request
    publisher_trusted(root, owner, repo, trust_remote_code)
    entry = (doc.get("commits") or {}).get(commit) or {}
    best = (entry.get("picks") or {}).get(plat[0])
    variant = (entry.get("variants") or {}).get(best) if isinstance(best, str) else None
    if not isinstance(best, str) or variant is None:
        return None  # not published for this platform, or not in the store: ranked or fetched
    if not clean(variant["tree"]) or not clean(variant["lock"]):
        return None  # not published for this platform, or not in the store: ranked or fetched
    prov = variant.get("provenance")
    digest = variant["digest"]
    PROVENANCE_SEEN[digest] = (
        None if prov is None else tuple(prov.get(k, "") for k in ("status", "signer", "issuer"))
    )
    real = f"{root}/{variant['tree']}"
    existing = registered(real)
    if existing is not None and (not check_arch or _device_ok(existing.metadata, plat)):
        return existing  # else _import refuses it: a check_arch=False call imported it
    taken = hold(real, f"{root}/{variant['lock']}", real)
    try:
        check_tree(root, real, owner)
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
    return json.loads(read_file(real + "/metadata.json", sys.maxsize).decode("utf-8"))


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
