"""Whether another local user could stand in for one of the daemon's TCP listeners.

Every local user can connect to a loopback port, and any of them may also *bind* it whenever
it is free: before the daemon starts, while it restarts or after a crash (`Restart=`), while it
is stopped. Jobs pointed at the Hub endpoint (`HF_ENDPOINT=http://127.0.0.1:PORT`) then talk
to whoever holds the port, and `kernels` imports the code that peer serves, as the job's user.
Only a privileged port is out of their reach: one below the network namespace's
`net.ipv4.ip_unprivileged_port_start` (1024 unless lowered; it bounds IPv6 too), which takes
CAP_NET_BIND_SERVICE to bind. systemd binds such a port for us and holds it across restarts
(kerneld.socket), so the daemon itself needs no capability.

The rule, for the Hub endpoint (the one listener whose answers jobs execute): a privileged port
is served however it came; an unprivileged one is refused by a system daemon (it serves users
who did not choose the risk) and served with a warning in user mode (one user's own daemon on
a machine they presumably trust). The metrics listener is not checked: a squatter there can
fake numbers, not run code, and its bind failing never stops the daemon (`app.Daemon`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The kernel's default for `net.ipv4.ip_unprivileged_port_start`.
DEFAULT_UNPRIVILEGED_PORT_START = 1024
#: kerneld.socket's TCP port: privileged, so no local user can hold it while systemd does not.
SHIPPED_PORT = 848


def unprivileged_port_start(proc: Path = Path("/proc")) -> int:
    """The lowest port an unprivileged process may bind in this network namespace."""
    try:
        text = (proc / "sys/net/ipv4/ip_unprivileged_port_start").read_text()
        return max(0, int(text.strip()))
    except (OSError, ValueError):
        return DEFAULT_UNPRIVILEGED_PORT_START


@dataclass(frozen=True)
class Exposure:
    """What to do with one TCP address of the Hub endpoint."""

    serve: bool
    warning: str = ""
    """Served, and this is said at every start (user mode, unprivileged port)."""
    refusal: str = ""
    """Not served: why, and the fix."""


def check_hub_endpoint(
    where: str, port: int, *, system: bool, passed: bool, start: int | None = None
) -> Exposure:
    """The decision for the Hub endpoint on TCP `where` (port 0: one the kernel picks, which is
    never privileged); `passed`: systemd passed it (kerneld.socket) rather than the daemon
    binding it; `start`: `ip_unprivileged_port_start` (read from /proc when None)."""
    start = unprivileged_port_start() if start is None else start
    if 0 < port < start:
        return Exposure(serve=True)
    risk = (
        f"port {port or '(any free one)'} is unprivileged (net.ipv4.ip_unprivileged_port_start "
        f"= {start}): any local user may bind it whenever kerneld is not listening on it (at "
        "boot, during a restart or after a crash) and answer jobs' HF_ENDPOINT requests with "
        "kernels of their own, which the jobs import"
    )
    if not system:
        return Exposure(
            serve=True,
            warning=(
                f"the Hub API on {where}: {risk}; use it on a machine no other user logs into, "
                "or run the system service, whose kerneld.socket holds a privileged port"
            ),
        )
    fix = (
        f"`systemctl edit kerneld.socket`: ListenStream=127.0.0.1:PORT with PORT below {start} "
        f"(the shipped unit has 127.0.0.1:{SHIPPED_PORT})"
        if passed
        else f"leave [hub_api] listen unset and enable kerneld.socket (`systemctl enable --now "
        f"kerneld.socket`), which listens on the privileged 127.0.0.1:{SHIPPED_PORT}"
    )
    return Exposure(
        serve=False,
        refusal=f"the Hub API on {where} is not served: {risk}. Fix: {fix}",
    )
