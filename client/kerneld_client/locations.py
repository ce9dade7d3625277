"""Where kerneld's sockets and store are, shared by the daemon, kerneldctl and the client.

Two modes:
- system (the systemd service): sockets in /run/kerneld, store in /var/lib/kerneld/store;
- user (a workstation, no root): sockets in $XDG_RUNTIME_DIR/kerneld (or ~/.cache/kerneld/run
  when that is unset), store in ~/.cache/kerneld/store.

A running daemon advertises itself in a small JSON file beside its user socket
(`<socket>.json`: store root, published index directory, admin socket, pid, version), so a client
finds the published index without gRPC and without parsing the daemon's config.

Kept free of third-party imports: this module is on the client's warm path. (`platformdirs`
would give the same XDG paths, but its import costs milliseconds on that path, and the two
modes above are all kerneld needs; it is not a dependency.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kerneld_client import _config

# The path variables' names, for the daemon and kerneldctl (they are read in `_config`).
ENV_SOCKET = _config.ENV_SOCKET
ENV_ADMIN_SOCKET = _config.ENV_ADMIN_SOCKET
ENV_STORE = _config.ENV_STORE

SYSTEM_RUN_DIR = Path("/run/kerneld")
SYSTEM_STORE = Path("/var/lib/kerneld/store")
SOCKET_NAME = "kerneld.sock"
ADMIN_SOCKET_NAME = "admin.sock"
ADVERT_SUFFIX = ".json"
ADVERT_FORMAT = "kerneld-advert"


def user_cache_dir() -> Path:
    base = _config.env_path("XDG_CACHE_HOME")
    return (base or _config.home_dir() / ".cache") / "kerneld"


def hub_cache_dir() -> Path:
    """The `hub` fallback's download cache: $KERNELD_HUB_CACHE, else in the user's cache."""
    return _config.env_path(_config.ENV_HUB_CACHE) or user_cache_dir() / "hub"


def private_dir(path: Path, uid: int) -> bool:
    """Create `path` (0700) if missing; True if it is a real directory of `uid` that no one else
    may write (so no one else can replace the files in it)."""
    import stat

    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == uid
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def private_tmp_dir(name: str) -> Path | None:
    """`<tmp>/kerneld-<uid>/<name>`, this user's own, for what would go to a home that is
    read-only or absent (container images); None if no safe one can be had."""
    import tempfile

    uid = os.geteuid()
    base = Path(tempfile.gettempdir()) / f"kerneld-{uid}"
    folder = base / name
    # Check each level before creating the next: nothing is made inside someone else's dir.
    return folder if private_dir(base, uid) and private_dir(folder, uid) else None


def runtime_dir() -> Path | None:
    """$XDG_RUNTIME_DIR (the user's private runtime directory), None when unset."""
    return _config.env_path("XDG_RUNTIME_DIR")


def user_run_dir() -> Path:
    runtime = runtime_dir()
    return runtime / "kerneld" if runtime else user_cache_dir() / "run"


def user_config_file() -> Path:
    base = _config.env_path("XDG_CONFIG_HOME")
    return (base or _config.home_dir() / ".config") / "kerneld" / "kerneld.toml"


SYSTEM_CONFIG_FILE = Path("/etc/kerneld/kerneld.toml")


def default_socket() -> Path:
    """The user socket a client talks to: $KERNELD_SOCKET, else the system one, else the user's."""
    env = _config.env_path(ENV_SOCKET)
    if env:
        return env
    system = SYSTEM_RUN_DIR / SOCKET_NAME
    if system.exists():
        return system
    user = user_run_dir() / SOCKET_NAME
    if not user.exists() and SYSTEM_RUN_DIR.is_dir():
        return system  # the system daemon restarting (its runtime directory outlives it)
    return user


def default_admin_socket() -> Path:
    env = _config.env_path(ENV_ADMIN_SOCKET)
    if env:
        return env
    system = SYSTEM_RUN_DIR / ADMIN_SOCKET_NAME
    if system.exists():
        return system
    return user_run_dir() / ADMIN_SOCKET_NAME


def advert_path(socket: Path) -> Path:
    return socket.with_name(socket.name + ADVERT_SUFFIX)


class Advert:
    """What a running daemon publishes beside its user socket. (A plain slotted class: this
    module is on the warm path, and a frozen dataclass costs most of a millisecond to define.)"""

    __slots__ = ("admin_socket", "index_dir", "pid", "store_root", "user_socket", "version")

    def __init__(
        self,
        store_root: Path,
        index_dir: Path,
        user_socket: Path,
        admin_socket: Path,
        pid: int,
        version: str,
    ) -> None:
        self.store_root = store_root
        self.index_dir = index_dir
        self.user_socket = user_socket
        self.admin_socket = admin_socket
        self.pid = pid
        self.version = version

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Advert) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__
        )

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in self.__slots__))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"Advert({fields})"

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": ADVERT_FORMAT,
                "version": 1,
                "store_root": str(self.store_root),
                "index_dir": str(self.index_dir),
                "user_socket": str(self.user_socket),
                "admin_socket": str(self.admin_socket),
                "pid": self.pid,
                "daemon_version": self.version,
            },
            indent=1,
            sort_keys=True,
        )


#: An advert is a few hundred bytes; a larger file is not one.
MAX_ADVERT_BYTES = 64 << 10


def read_advert(socket: Path | None = None) -> Advert | None:
    """The advert of the daemon behind `socket` (default: `default_socket()`), or None.

    The advert names the store a process imports from, so one that another user could have
    written (foreign owner, writable, or in a directory someone else can write) is refused with
    UntrustedPath instead of being ignored: falling back to a default store would hide the attack.
    """
    read = _read_advert(advert_path(socket or default_socket()))
    return None if read is None else read[0]


def _read_advert(path: Path) -> tuple[Advert, tuple[object, ...]] | None:
    """`read_advert`, and the advert's identity as `store_identity` gives it (from the `fstat`
    of the file it read)."""
    from kerneld_client import _path_trust  # imports _config, which imports this module

    opened = _path_trust.check_advert(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        data = os.read(fd, MAX_ADVERT_BYTES + 1)  # a regular file (checked): one read is all
        if len(data) > MAX_ADVERT_BYTES:
            return None
        doc = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(doc, dict) or doc.get("format") != ADVERT_FORMAT or doc.get("version") != 1:
        return None
    try:
        advert = Advert(
            store_root=Path(doc["store_root"]),
            index_dir=Path(doc["index_dir"]),
            user_socket=Path(doc["user_socket"]),
            admin_socket=Path(doc["admin_socket"]),
            pid=int(doc["pid"]),
            version=str(doc["daemon_version"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return advert, _file_identity(str(path), st)


def _file_identity(path: str, st: os.stat_result) -> tuple[object, ...]:
    return (path, st.st_dev, st.st_ino, st.st_ctime_ns)  # any write, chmod or chown moves ctime


def _env_identity(env: str) -> tuple[object, ...]:
    """$KERNELD_STORE as what names the store: a relative path names another one after a chdir."""
    return (ENV_STORE, env if os.path.isabs(env) else os.path.join(os.getcwd(), env))


def default_store() -> Path:
    """The store a client reads: $KERNELD_STORE, else the running daemon's, else the defaults.

    UntrustedPath when the daemon's advert could have been written by another user."""
    return named_store()[0]


def named_store() -> tuple[Path, tuple[object, ...] | None]:
    """`default_store()`, and what named it as `store_identity()` gives it (None: the
    defaults), from the same read."""
    env = _config.env_value(ENV_STORE)
    if env:
        return Path(env), _env_identity(env)
    read = _read_advert(advert_path(default_socket()))
    if read is not None:
        return read[0].store_root, read[1]
    return (SYSTEM_STORE if SYSTEM_STORE.exists() else user_cache_dir() / "store"), None


def store_identity() -> tuple[object, ...] | None:
    """What names the store `named_store()` would name, cheaply (one `lstat`, no read and no
    check): the variable's value, else the daemon's advert (its path, and its inode and change
    time, which a new daemon or a change of its content, owner or mode renews). None when
    neither names it (no daemon: the defaults, which may change at any moment)."""
    env = _config.env_value(ENV_STORE)
    if env:
        return _env_identity(env)
    advert = str(advert_path(default_socket()))
    try:
        return _file_identity(advert, os.lstat(advert))
    except OSError:
        return None
