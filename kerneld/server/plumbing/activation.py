"""Listening sockets passed by systemd (socket activation), as `sd_listen_fds(3)` reads them.

With `kerneld.socket`, systemd (PID 1) owns the Hub API's listening sockets: they stay open
while the daemon restarts, so a job that connects meanwhile waits in the listen backlog and is
answered by the next daemon, where a port the daemon binds itself refuses it. systemd passes
them as descriptors 3, 4, ... with `LISTEN_PID` (the process they are meant for), `LISTEN_FDS`
(how many) and `LISTEN_FDNAMES` (`FileDescriptorName=`, colon-separated).

Read here by hand: the protocol is three environment variables, and the one library that
implements it (`systemd-python`, `systemd.daemon.listen_fds`) is a C extension built against
libsystemd, which kerneld does not otherwise need (`sdnotify`, already a dependency, does the
notify side only). The gRPC sockets cannot be passed: grpcio binds a unix socket path itself
and has no way to serve a listening descriptor it did not create.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from kerneld.config.environment import take_listen_variables
from kerneld.server.plumbing.sockets import SocketSetupError

#: sd_listen_fds(3): the first passed descriptor.
SD_LISTEN_FDS_START = 3
#: `FileDescriptorName=` of the Hub API's sockets in kerneld.socket.
HUB_API = "hub-api"
#: The names the daemon serves; any other passed socket is a mistake in the socket unit.
KNOWN_NAMES = (HUB_API,)


class ActivationError(SocketSetupError):
    """The passed sockets are not what kerneld can serve (the message says what to change)."""


@dataclass(frozen=True)
class Inherited:
    """One listening socket systemd passed, with its `FileDescriptorName=`."""

    name: str
    sock: socket.socket

    @property
    def unix_path(self) -> Path | None:
        """The path of a unix socket (None for TCP)."""
        if self.sock.family != socket.AF_UNIX:
            return None
        name = self.sock.getsockname()
        return Path(name) if isinstance(name, str) and name else None

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) of a TCP socket (None for a unix socket)."""
        if self.sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def describe(self) -> str:
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        if self.address is not None:
            host, port = self.address
            return f"{'[' + host + ']' if ':' in host else host}:{port}"
        return f"fd {self.sock.fileno()} (family {self.sock.family})"


def listen_fds(environ: MutableMapping[str, str] | None = None) -> list[Inherited]:
    """The listening sockets passed to this process, or [] when it was not socket-activated.

    sd_listen_fds semantics: the variables count only when `LISTEN_PID` is this process (a
    child that inherited the environment is not the one meant); they are removed from the
    environment either way (no child of the daemon sees them) and the descriptors are made
    close-on-exec. Each must be a listening stream socket with a known name."""
    values = take_listen_variables(environ)
    count, pid = values["LISTEN_FDS"], values["LISTEN_PID"]
    if count is None:
        return []
    try:
        if pid is None or int(pid) != os.getpid():
            return []
        n = int(count)
    except ValueError:
        raise ActivationError(
            f"LISTEN_PID={pid!r} LISTEN_FDS={count!r}: not numbers (not set by systemd?)"
        ) from None
    if n <= 0:
        return []
    names = values["LISTEN_FDNAMES"]
    listed = names.split(":") if names is not None else ["unknown"] * n
    if len(listed) != n:
        raise ActivationError(
            f"LISTEN_FDNAMES={names!r} names {len(listed)} sockets but LISTEN_FDS={n}"
        )
    passed = []
    for offset, name in enumerate(listed):
        fd = SD_LISTEN_FDS_START + offset
        try:
            os.set_inheritable(fd, False)
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise ActivationError(
                f"passed descriptor {fd} ({name}) is not a socket: {exc}"
            ) from exc
        passed.append(Inherited(name, sock))
    for item in passed:
        _check(item)
    return passed


def _check(item: Inherited) -> None:
    sock = item.sock
    if item.name not in KNOWN_NAMES:
        raise ActivationError(
            f"systemd passed a socket named {item.name!r} ({item.describe()}); kerneld serves "
            f"{', '.join(KNOWN_NAMES)}: give the Hub API's ListenStream= lines "
            f"FileDescriptorName={HUB_API} (kerneld.socket) and pass no others"
        )
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    ):
        raise ActivationError(
            f"the passed socket {item.name!r} ({item.describe()}) is not a listening stream "
            "socket: use ListenStream= with Accept=no"
        )
    if item.unix_path is None and item.address is None:
        raise ActivationError(
            f"the passed socket {item.name!r} ({item.describe()}) is neither a unix socket "
            "with a path nor TCP"
        )
    if item.address is not None and not ipaddress.ip_address(item.address[0]).is_loopback:
        raise ActivationError(
            f"the passed socket {item.name!r} listens on {item.describe()}; the Hub API is "
            "served on loopback only: ListenStream=127.0.0.1:PORT (or [::1]:PORT)"
        )


def hub_api_sockets(
    passed: list[Inherited], *, listen: str, socket_path: Path | None
) -> list[Inherited]:
    """The passed Hub API sockets, checked against `[hub_api] listen` and `socket`.

    With socket activation the socket unit decides the addresses; a key that is set must name
    one of the passed sockets (a port 0 any passed TCP socket), since the daemon cannot also
    bind an address systemd holds, and serving another one than the file says would surprise."""
    ours = [item for item in passed if item.name == HUB_API]
    if not ours:
        return []
    where = ", ".join(item.describe() for item in ours)
    if listen:
        host, _, port = listen.rpartition(":")
        host = {"localhost": "127.0.0.1", "[::1]": "::1"}.get(host, host).strip("[]")
        tcp = [item.address for item in ours if item.address is not None]
        if not any(
            ipaddress.ip_address(h) == ipaddress.ip_address(host) and (int(port) in (0, p))
            for h, p in tcp
        ):
            raise ActivationError(
                f"[hub_api] listen = {listen!r} but systemd passed the Hub API {where}: make "
                "them agree, or remove the key (kerneld.socket's ListenStream= decides)"
            )
    if socket_path is not None and not any(item.unix_path == socket_path for item in ours):
        raise ActivationError(
            f"[hub_api] socket = {str(socket_path)!r} but systemd passed the Hub API {where}: "
            "make them agree, or remove the key (kerneld.socket's ListenStream= decides)"
        )
    return ours
