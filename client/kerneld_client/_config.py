"""The client's knobs, read from the environment on every call (cheap; tests and launchers change
them between calls), and the once-per-kernel fallback warning.

    KERNELD_FALLBACK        torch (default; hub with the `kernels` hook) | hub | error: what a
                            failed load does
    KERNELD_REQUIRE=1       every fallback becomes an error (fail hard)
    KERNELD_TIMEOUT         seconds for a daemon call that downloads nothing (default 1)
    KERNELD_FETCH_TIMEOUT   seconds for a daemon call that may download (default 300)
    KERNELD_BACKOFF         seconds to skip the daemon after it was found down (default 30)
    KERNELD_RESTART_WAIT    seconds a call waits for a daemon that looks restarting (its socket
                            gone or refusing, or it answers "not ready") before it counts as
                            down (default 10; 0: never wait)
    KERNELD_REF_MAX_AGE     seconds after which a ref in the published index is re-checked
                            with the daemon (default: never; the daemon keeps refs fresh)
    KERNELD_HUB_CACHE       the `hub` fallback's download cache (default ~/.cache/kerneld/hub)
    KERNELD_VERIFY=1        re-hash every store tree before importing it (against its tree
                            digest and metadata.json's digest); a mismatch refuses the tree
                            (CorruptTree) and the fallback policy applies. Costs one read of
                            the kernel's files per process (default: off; the daemon verified
                            them on ingest and its scrub re-checks them)
    KERNELD_STORE_OWNER     the user (name or uid) a store root, the published index and the
                            daemon's advert may belong to besides root and this process's own
                            user (default: the system user `kerneld`, if it exists); anything
                            owned by another user is refused (UntrustedPath)
    ... and the variables of the ENV_* constants below, each with its `#:` comment.

This is the one module of the client that reads the environment: `locations.py` turns the path
variables read here into where things are (sockets, stores, caches), the `kernels` hook asks
here for HF_ENDPOINT. The one exception is the start-up gate, KERNELD_HOOK_KERNELS, which
`kerneld_client_hook.pth` and `integrations/_autohook.py` read at every interpreter start
before anything of ours is imported. Yes/no values are one convention, `flag`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import warnings
from pathlib import Path

__all__ = [
    "ENV_ADMIN_SOCKET",
    "ENV_ALLOW_NONDETERMINISTIC",
    "ENV_BACKOFF",
    "ENV_BYTECODE_CACHE",
    "ENV_COALESCE",
    "ENV_DISABLE",
    "ENV_DISABLE_KERNEL_MAPPING",
    "ENV_FALLBACK",
    "ENV_FETCH_TIMEOUT",
    "ENV_HF_ENDPOINT",
    "ENV_HUB_CACHE",
    "ENV_KUBERNETES",
    "ENV_LOCAL_KERNELS",
    "ENV_PLATFORM_JSON",
    "ENV_REF_MAX_AGE",
    "ENV_REQUIRE",
    "ENV_RESTART_WAIT",
    "ENV_SOCKET",
    "ENV_STORE",
    "ENV_STORE_OWNER",
    "ENV_TIMEOUT",
    "ENV_VERIFY",
    "FALLBACK_POLICIES",
    "KernelFallbackWarning",
    "backoff_s",
    "coalescing",
    "env_path",
    "env_value",
    "fallback_policy",
    "fetch_timeout_s",
    "flag",
    "hf_endpoint",
    "home_dir",
    "hooked",
    "in_container",
    "is_off",
    "kernels_logger",
    "raw",
    "ref_max_age_s",
    "require",
    "restart_wait_s",
    "set_hooked",
    "store_owner_uid",
    "timeout_s",
    "verify_trees",
    "warn_once",
]

log = logging.getLogger("kerneld_client")

#: The daemon's user socket, for what any `kerneld-users` member may ask (status): $KERNELD_SOCKET,
#: else beside an explicit --admin-socket, else the defaults.
ENV_SOCKET = "KERNELD_SOCKET"
#: the daemon's admin socket (default: $KERNELD_ADMIN_SOCKET, else the one that exists, else
#: /run/kerneld/admin.sock as root or on a system install, else $XDG_RUNTIME_DIR/kerneld/admin.sock)
ENV_ADMIN_SOCKET = "KERNELD_ADMIN_SOCKET"
#: The store a client reads: $KERNELD_STORE, else the running daemon's, else the defaults.
ENV_STORE = "KERNELD_STORE"
ENV_FALLBACK = "KERNELD_FALLBACK"
ENV_REQUIRE = "KERNELD_REQUIRE"
ENV_TIMEOUT = "KERNELD_TIMEOUT"
ENV_FETCH_TIMEOUT = "KERNELD_FETCH_TIMEOUT"
ENV_BACKOFF = "KERNELD_BACKOFF"
ENV_RESTART_WAIT = "KERNELD_RESTART_WAIT"
ENV_REF_MAX_AGE = "KERNELD_REF_MAX_AGE"
ENV_HUB_CACHE = "KERNELD_HUB_CACHE"
ENV_VERIFY = "KERNELD_VERIFY"
ENV_STORE_OWNER = "KERNELD_STORE_OWNER"
#: `0`/`off`/`no`/`false` disables coalescing of cold resolves between processes.
ENV_COALESCE = "KERNELD_COALESCE"
#: A directory for compiled kernel code, or off/0/no/false to disable the cache.
ENV_BYTECODE_CACHE = "KERNELD_BYTECODE_CACHE"
#: Comma list of layer names and/or repo ids (`org/name` or `org/name@revision`) to keep on PyTorch.
ENV_DISABLE = "KERNELD_DISABLE"
#: Use kernels not declared deterministic even when deterministic algorithms are on.
ENV_ALLOW_NONDETERMINISTIC = "KERNELD_ALLOW_NONDETERMINISTIC"
#: `kernels`' switch: every marked layer keeps its original forward.
ENV_DISABLE_KERNEL_MAPPING = "DISABLE_KERNEL_MAPPING"
#: `LOCAL_KERNELS=org/a=/path:org/b=/path`, as `kernels` reads it.
ENV_LOCAL_KERNELS = "LOCAL_KERNELS"
#: What a job whose `kernels` is not hooked gets: `kernels`' own code, from HF_ENDPOINT.
ENV_HF_ENDPOINT = "HF_ENDPOINT"
#: A JSON facts object that replaces platform detection (tests, launchers that know better).
ENV_PLATFORM_JSON = "KERNELD_PLATFORM_JSON"
#: The system user of the packaged daemon (systemd `User=kerneld`, sysusers.d).
DEFAULT_STORE_OWNER = "kerneld"

DEFAULT_TIMEOUT_S = 1.0
DEFAULT_FETCH_TIMEOUT_S = 300.0
DEFAULT_BACKOFF_S = 30.0
#: A `systemctl restart kerneld` (drain, exit, start, store open) fits in it with room to spare;
#: a job's own patience is KERNELD_FETCH_TIMEOUT (300 s).
DEFAULT_RESTART_WAIT_S = 10.0


#: What a failed load may do (`loading.fallback.FallbackPolicy` is the enum of them; its
#: class costs the warm path's import 0.15 ms to create, so it is made only when a load fails).
FALLBACK_POLICIES = ("torch", "hub", "error")


class KernelFallbackWarning(RuntimeWarning):
    """A kernel could not be loaded through kerneld and a fallback was used instead."""


#: Set by the `kernels` hook while it serves the `kernels` package (None: not hooked): the
#: logger names of that release (`versions`, `kernelize`), where records `kernels` writes go.
_hooked: dict[str, str] | None = None


def set_hooked(loggers: dict[str, str] | None) -> None:
    """The `kernels` hook is on (with that release's logger names) or off (None)."""
    global _hooked
    _hooked = loggers


def hooked() -> bool:
    """Whether this process's `kernels` package is served by kerneld (the start-up hook)."""
    return _hooked is not None


def kernels_logger(kind: str, default: str) -> str:
    """Where a record `kernels` also writes goes: `kernels`' logger of that `kind` when the
    hook serves `kernels`, else `default` (kerneld_client's)."""
    return _hooked.get(kind, default) if _hooked is not None else default


def fallback_policy(explicit: str | None = None) -> str:
    """The name of this call's policy: the keyword (a name or a `FallbackPolicy`), else
    $KERNELD_FALLBACK, else `torch` (`hub` while the `kernels` hook serves `kernels`, whose
    own code would download from the Hub).

    ValueError for an unknown name (a configuration error is not a kernel failure).
    """
    value = explicit if explicit is not None else os.environ.get(ENV_FALLBACK, "").strip()
    name = getattr(value, "value", value)  # a FallbackPolicy member is a str: its value
    if not name:
        return "hub" if _hooked is not None else "torch"
    if name not in FALLBACK_POLICIES:
        names = ", ".join(FALLBACK_POLICIES)
        raise ValueError(f"unknown fallback policy {value!r}; expected one of {names}")
    return str(name)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def raw(name: str) -> str:
    """A variable's value, stripped ("" when unset)."""
    return os.environ.get(name, "").strip()


def flag(name: str) -> bool:
    """Is the variable set to a true value (1, true, yes, on; any case)?"""
    return raw(name).lower() in _TRUE


def is_off(value: str) -> bool:
    """Is `value` one of the false values (0, false, no, off): a feature switched off?"""
    return value.strip().lower() in _FALSE


def require() -> bool:
    """$KERNELD_REQUIRE set to a true value: every fallback is an error."""
    return flag(ENV_REQUIRE)


def verify_trees() -> bool:
    """$KERNELD_VERIFY set to a true value: re-hash a store tree before importing it, for
    processes that must not trust the disk since the daemon last looked at it."""
    return flag(ENV_VERIFY)


def coalescing() -> bool:
    """Processes of one user that miss the same kernel at once wait for one of them to ask
    the daemon, unless $KERNELD_COALESCE is a false value."""
    return not is_off(raw(ENV_COALESCE))


def _seconds(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        log.warning("ignoring %s=%r: not a number of seconds", name, raw)
        return default
    if math.isnan(value) or value < 0:
        log.warning("ignoring %s=%r: must be >= 0", name, raw)
        return default
    return value


def timeout_s() -> float:
    return _seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S


def fetch_timeout_s() -> float:
    return _seconds(ENV_FETCH_TIMEOUT, DEFAULT_FETCH_TIMEOUT_S) or DEFAULT_FETCH_TIMEOUT_S


def backoff_s() -> float:
    value = _seconds(ENV_BACKOFF, DEFAULT_BACKOFF_S)
    return DEFAULT_BACKOFF_S if value is None else value


#: Set in every Kubernetes container (the API server's address), whatever the pod spec says.
ENV_KUBERNETES = "KUBERNETES_SERVICE_HOST"


def in_container() -> str | None:
    """ "kubernetes", "container" (Docker, Podman, nspawn) or None: where a group is not
    joined with usermod (the pod spec or the run command adds it)."""
    if os.environ.get(ENV_KUBERNETES):
        return "kubernetes"
    if os.environ.get("container") or any(  # noqa: SIM112  (systemd's name, lower case)
        os.path.exists(p) for p in ("/.dockerenv", "/run/.containerenv")
    ):
        return "container"
    return None


def restart_wait_s() -> float:
    value = _seconds(ENV_RESTART_WAIT, DEFAULT_RESTART_WAIT_S)
    return DEFAULT_RESTART_WAIT_S if value is None else value


def ref_max_age_s() -> float | None:
    return _seconds(ENV_REF_MAX_AGE, None)


_owner_memo: tuple[str, int | None] | None = None


def store_owner_uid() -> int | None:
    """The uid of the daemon's user that the client trusts besides root and itself, or None.

    $KERNELD_STORE_OWNER (a user name or a uid) when set, else the system user `kerneld` if it
    exists. Memoized per value: a passwd lookup can cost more than the rest of a warm load.
    """
    global _owner_memo
    raw = os.environ.get(ENV_STORE_OWNER, "").strip()
    memo = _owner_memo
    if memo is not None and memo[0] == raw:
        return memo[1]
    uid: int | None
    if raw.isdigit():
        uid = int(raw)
    else:
        name = raw or DEFAULT_STORE_OWNER
        uid = passwd_file_uid(name)
        if uid is None:
            import pwd  # NSS: not needed when /etc/passwd has the user

            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                if raw:
                    log.warning("ignoring %s=%r: no such user", ENV_STORE_OWNER, raw)
    _owner_memo = (raw, uid)
    return uid


#: Where `passwd_file_uid` looks (a module constant, so that tests can point it elsewhere).
SYSTEM_USERS_FILE = "/etc/passwd"
_USERS_FILE_MAX_BYTES = 4 << 20


def passwd_file_uid(name: str) -> int | None:
    """The uid /etc/passwd gives `name`, read directly; None when it has no such line (then ask
    NSS). The daemon's user is a system user (systemd-sysusers writes it there), and a warm load
    in a fresh process would otherwise pay 0.15 ms for `import pwd` and NSS's first lookup,
    which reads nsswitch.conf. The file is root's, as NSS's own `files` source is."""
    try:
        fd = os.open(SYSTEM_USERS_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > _USERS_FILE_MAX_BYTES:
            return None  # let NSS read that
        data = os.read(fd, size + 1)  # its size, not the cap: a 4 MiB buffer costs an mmap
    except OSError:
        return None
    finally:
        os.close(fd)
    text = b"\n" + data
    start = text.find(b"\n" + name.encode("utf-8", "surrogateescape") + b":")
    if start < 0:
        return None
    end = text.find(b"\n", start + 1)
    fields = text[start + 1 : end if end >= 0 else None].split(b":")
    return int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None


def env_path(name: str) -> Path | None:
    """A path variable's value (not stripped: a path may end in a space), None when unset or
    empty."""
    value = os.environ.get(name)
    return Path(value) if value else None


def env_value(name: str) -> str | None:
    """A variable's exact value, None when unset or empty (where the text itself matters, as
    for the identity of $KERNELD_STORE)."""
    return os.environ.get(name) or None


def home_dir() -> Path:
    """$HOME, else the password database's home."""
    return Path(os.environ.get("HOME") or Path.home())


def hf_endpoint() -> str:
    """$HF_ENDPOINT, stripped: where `kernels` (and huggingface_hub) download from."""
    return raw(ENV_HF_ENDPOINT)


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(kernel: str, message: str) -> bool:
    """Emit `message` as a KernelFallbackWarning the first time `kernel` falls back in this
    process (a training loop must not print it on every step); True if it was emitted."""
    with _warned_lock:
        if kernel in _warned:
            log.debug("%s", message)
            return False
        _warned.add(kernel)
    # warn_once <- _fall_back <- _run <- get_kernel & co <- the caller
    warnings.warn(message, KernelFallbackWarning, stacklevel=5)
    return True
