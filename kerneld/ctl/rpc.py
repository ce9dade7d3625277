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

from kerneld.ctl.common import EXIT_FAILURE, CtlError, Ctx, DaemonUnavailable

if TYPE_CHECKING:
    import grpc

    from kerneld_client._proto import kerneld_pb2_grpc

ERROR_TRAILER = "kerneld-error-bin"
DEFAULT_TIMEOUT_S = 30.0
_OFFLINE_HINT = "start kerneld, or work on a stopped store with --store PATH"


def admin_socket(ctx: Ctx) -> Path:
    explicit = getattr(ctx.args, "admin_socket", None)
    if explicit:
        return Path(explicit)
    from kerneld_client import locations

    return locations.default_admin_socket()


def probe(path: Path) -> None:
    """Raise DaemonUnavailable with a precise reason if nothing usable listens at `path`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DaemonUnavailable(
            f"kerneld is not running (no admin socket at {path})", hint=_OFFLINE_HINT
        ) from None
    except PermissionError:
        raise DaemonUnavailable(
            f"permission denied reaching the admin socket {path}",
            hint="join the kerneld admin group (kerneld-admin), or run as root",
        ) from None
    import stat

    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonUnavailable(f"{path} is not a socket", hint="check --admin-socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(os.fspath(path))
    except PermissionError:
        raise DaemonUnavailable(
            f"permission denied on the admin socket {path}",
            hint="join the kerneld admin group (kerneld-admin), or run as root",
        ) from None
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            raise DaemonUnavailable(
                f"kerneld is not running (stale admin socket {path})", hint=_OFFLINE_HINT
            ) from None
        raise DaemonUnavailable(f"cannot connect to {path}: {exc.strerror or exc}") from None
    finally:
        sock.close()


#: Largest admin answer kerneldctl accepts (gRPC's default is 4 MiB).
MAX_ANSWER_BYTES = 1 << 30


class Admin:
    """A connected Admin stub; use as a context manager (closes the channel)."""

    def __init__(self, ctx: Ctx) -> None:
        self.path = admin_socket(ctx)
        probe(self.path)
        import grpc

        from kerneld_client._proto import kerneld_pb2_grpc

        self._grpc = grpc
        self.channel: grpc.Channel = grpc.insecure_channel(
            f"unix:{self.path}",
            # A listing or GC report of a big store (100,000 trees: ~25 MB) exceeds gRPC's
            # default 4 MiB receive limit; the admin socket is local and trusted.
            options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)],
        )
        self.stub: kerneld_pb2_grpc.AdminStub = kerneld_pb2_grpc.AdminStub(self.channel)
        self.explicit_timeout = getattr(ctx.args, "timeout", None) is not None
        self.timeout = float(getattr(ctx.args, "timeout", None) or DEFAULT_TIMEOUT_S)

    def __enter__(self) -> Admin:
        return self

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


def error_detail(exc: grpc.RpcError) -> Any | None:
    """The daemon's ErrorDetail from the trailing metadata, if it sent one."""
    from kerneld_client._proto import kerneld_pb2

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
            return DaemonUnavailable(
                f"permission denied on the admin socket {path}",
                hint="join the kerneld admin group (kerneld-admin), or run as root",
            )
        return DaemonUnavailable(f"kerneld is unavailable at {path}: {details}", hint=_OFFLINE_HINT)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DaemonUnavailable(f"kerneld did not answer in time ({details})")
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
