"""The admin-socket connection: one channel per command, errors turned into CtlErrors.

A missing socket, a refused connection and a socket the caller may not open (wrong group) are
told apart before gRPC is involved, so the message says what to do. A failed call carries the
daemon's `ErrorDetail` (trailer `kerneld-error-bin`); its message and hint are shown as they are.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneld.config.environment import Environment
from kerneld.ctl.common import (
    EXIT_FAILURE,
    CtlError,
    Ctx,
    DaemonNotReachable,
    PermissionDenied,
)

if TYPE_CHECKING:
    import grpc

    from kerneld_client.proto import kerneld_pb2_grpc

ERROR_TRAILER = "kerneld-error-bin"
DEFAULT_TIMEOUT_S = 30.0
_OFFLINE_HINT = "start kerneld, or work on a stopped store with --store PATH"
_SYSTEM_OFFLINE_HINT = (
    "start it: systemctl start kerneld (journalctl -u kerneld says why it stopped)"
)
_ADMIN_HINT = (
    "join the kerneld-admin group (usermod -aG kerneld-admin USER, then log in again), or run "
    "as root"
)
_USER_HINT = (
    "join the kerneld-users group (usermod -aG kerneld-users USER, then log in again), or run "
    "as root"
)


def system_install() -> bool:
    """Whether this host has the system service installed (its config file or its store).

    /run/kerneld is a RuntimeDirectory: it vanishes when the service stops, so the sockets'
    absence says nothing about which daemon an admin means.
    """
    from kerneld_client import locations

    return locations.SYSTEM_CONFIG_FILE.exists() or locations.SYSTEM_STORE.exists()


def _default_socket(explicit_socket: Path | None, name: str) -> Path:
    """A socket the admin means: the variable's (`explicit_socket`), else whichever daemon
    listens (system first), else the system one when run as root or where the system install
    exists, else the user's."""
    from kerneld_client import locations

    explicit = explicit_socket
    if explicit:
        return explicit
    system = locations.SYSTEM_RUN_DIR / name
    user = locations.user_run_dir() / name
    if system.exists():
        return system
    if user.exists():
        return user
    if os.geteuid() == 0 or system_install():
        return system
    return user


def admin_socket(ctx: Ctx) -> Path:
    explicit = getattr(ctx.args, "admin_socket", None)
    if explicit:
        return Path(explicit)
    from kerneld_client import locations

    return _default_socket(Environment.read().admin_socket, locations.ADMIN_SOCKET_NAME)


def user_socket(ctx: Ctx) -> Path:
    """The daemon's user socket, for what any `kerneld-users` member may ask (status):
    $KERNELD_SOCKET, else beside an explicit --admin-socket, else the defaults."""
    from kerneld_client import locations

    env = Environment.read().user_socket
    if env:
        return env
    explicit = getattr(ctx.args, "admin_socket", None)
    if explicit:
        return Path(explicit).with_name(locations.SOCKET_NAME)
    return _default_socket(env, locations.SOCKET_NAME)


def _offline_hint(path: Path) -> str:
    from kerneld_client import locations

    if path.parent == locations.SYSTEM_RUN_DIR:
        return _SYSTEM_OFFLINE_HINT + "; or work on the stopped store with --store PATH"
    return _OFFLINE_HINT


def probe(path: Path, *, admin: bool = True) -> None:
    """Raise DaemonNotReachable (not running) or PermissionDenied (not allowed) with a precise
    reason if nothing usable listens at `path`."""
    kind = "admin socket" if admin else "socket"
    hint = _ADMIN_HINT if admin else _USER_HINT
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DaemonNotReachable(
            f"kerneld is not running (no {kind} at {path})", hint=_offline_hint(path)
        ) from None
    except PermissionError:
        raise PermissionDenied(f"permission denied reaching the {kind} {path}", hint=hint) from None
    import stat

    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonNotReachable(f"{path} is not a socket", hint="check --admin-socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(os.fspath(path))
    except PermissionError:
        raise PermissionDenied(f"permission denied on the {kind} {path}", hint=hint) from None
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            raise DaemonNotReachable(
                f"kerneld is not running (stale {kind} {path})", hint=_offline_hint(path)
            ) from None
        raise DaemonNotReachable(f"cannot connect to {path}: {exc.strerror or exc}") from None
    finally:
        sock.close()


#: Largest admin answer kerneldctl accepts (gRPC's default is 4 MiB).
MAX_ANSWER_BYTES = 1 << 30


def _with_caller(channel: grpc.Channel, path: Path) -> grpc.Channel:
    """`channel` sending this process's caller token with every call, so the daemon's audit
    lines name the admin's real uid (kerneld/server/plumbing/identity.py); unchanged without one."""
    import grpc

    from kerneld_client.caller import caller_metadata

    extra = caller_metadata(path)
    if not extra:
        return channel

    class Details(grpc.ClientCallDetails):
        def __init__(self, d: Any) -> None:
            self.method, self.timeout = d.method, d.timeout
            self.metadata = (*(d.metadata or ()), *(extra or ()))
            self.credentials, self.wait_for_ready = d.credentials, d.wait_for_ready
            self.compression = d.compression

    class Caller(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
        def _details(self, d: Any) -> Any:
            return Details(d)

        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._details(details), request)

        def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._details(details), request)

    return grpc.intercept_channel(channel, Caller())


class Admin:
    """A connected Admin stub; use as a context manager (closes the channel)."""

    def __init__(self, ctx: Ctx) -> None:
        self.path = admin_socket(ctx)
        probe(self.path)
        self._connect(ctx)

    def _connect(self, ctx: Ctx) -> None:
        import grpc

        from kerneld_client.proto import kerneld_pb2_grpc

        self._grpc = grpc
        self.channel: grpc.Channel = grpc.insecure_channel(
            f"unix:{self.path}",
            # A listing or GC report of a big store (100,000 trees: ~25 MB) exceeds gRPC's
            # default 4 MiB receive limit; the admin socket is local and trusted.
            options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)],
        )
        self.channel = _with_caller(self.channel, self.path)
        self.stub: kerneld_pb2_grpc.AdminStub = kerneld_pb2_grpc.AdminStub(self.channel)
        self.explicit_timeout = getattr(ctx.args, "timeout", None) is not None
        self.timeout = float(getattr(ctx.args, "timeout", None) or DEFAULT_TIMEOUT_S)

    def __enter__(self) -> Admin:
        return self

    def kernels(self) -> kerneld_pb2_grpc.KernelsStub:
        """The Kernels service on the same channel (the user socket's RPCs)."""
        from kerneld_client.proto import kerneld_pb2_grpc

        return kerneld_pb2_grpc.KernelsStub(self.channel)

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def unary(self, method: Any, request: Any, *, long: bool = False) -> Any:
        """One call; `long` ones (GC of a big store) get an hour unless --timeout says else."""
        timeout = self.timeout if not long or self.explicit_timeout else 3600.0
        try:
            return method(request, timeout=timeout)
        except self._grpc.RpcError as exc:
            raise translate(exc, self.path) from None

    def stream(self, method: Any, request: Any) -> Iterator[Any]:
        """Iterate a server stream; errors mid-stream become CtlErrors too."""
        try:
            yield from method(request)
        except self._grpc.RpcError as exc:
            raise translate(exc, self.path) from None


class UserChannel(Admin):
    """The user socket (what every `kerneld-users` member may call): `kernels()` is its stub;
    `stub` (Admin) is not served there."""

    def __init__(self, ctx: Ctx) -> None:
        self.path = user_socket(ctx)
        probe(self.path, admin=False)
        self._connect(ctx)


def error_detail(exc: grpc.RpcError) -> Any | None:
    """The daemon's ErrorDetail from the trailing metadata, if it sent one."""
    from kerneld_client.proto import kerneld_pb2

    trailers = getattr(exc, "trailing_metadata", None)
    items = trailers() if callable(trailers) else None
    for key, value in items or ():
        if key == ERROR_TRAILER and isinstance(value, bytes):
            detail = kerneld_pb2.ErrorDetail()
            try:
                detail.ParseFromString(value)
            except Exception:
                return None
            return detail
    return None


def detail_message(detail: Any) -> str:
    where = "@".join(p for p in (detail.repo_id, detail.revision) if p)
    if detail.variant:
        where = f"{where} [{detail.variant}]" if where else detail.variant
    text = f"{where}: {detail.message}" if where else detail.message
    reasons = [f"{v.variant}: {v.reason or 'accepted'}" for v in detail.variants]
    if reasons:
        text += " (" + "; ".join(reasons) + ")"
    return text


def translate(exc: grpc.RpcError, path: Path) -> CtlError:
    import grpc

    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    detail = error_detail(exc)
    if detail is not None:
        return CtlError(detail_message(detail), code=EXIT_FAILURE, hint=detail.hint)
    if code == grpc.StatusCode.UNAVAILABLE:
        if "ermission denied" in (details or ""):
            return PermissionDenied(f"permission denied on {path}", hint=_ADMIN_HINT)
        return DaemonNotReachable(
            f"kerneld is unavailable at {path}: {details}", hint=_offline_hint(path)
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DaemonNotReachable(f"kerneld did not answer in time ({details})")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return CtlError(f"this kerneld does not support that request yet ({details})")
    name = code.name if code is not None else "error"
    return CtlError(f"kerneld refused the request ({name}): {details}")


def error_dict(detail: Any) -> dict[str, Any]:
    """An ErrorDetail as JSON."""
    return {
        "code": _enum_name(detail, "code"),
        "message": detail.message,
        "repo_id": detail.repo_id,
        "revision": detail.revision,
        "variant": detail.variant,
        "hint": detail.hint,
    }


def _enum_name(message: Any, field: str) -> str:
    value = getattr(message, field)
    try:
        return str(message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number[value].name)
    except (KeyError, AttributeError):
        return str(value)
