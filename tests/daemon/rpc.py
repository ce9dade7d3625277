"""Request builders and error helpers for the daemon tests (real gRPC over unix sockets)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from kerneld.server.statuses import detail_from_trailers
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.variants import Backend, BackendType, PlatformFacts
from kerneld_client.wire import facts_to_proto

TIMEOUT = 20.0


def facts(
    torch: tuple[int, int] | None = (2, 13), backend: Backend | None = None, cpu: str = "x86_64"
) -> pb.PlatformFacts:
    return facts_to_proto(
        PlatformFacts(
            cpu=cpu,
            os="linux",
            torch_version=torch,
            cxx11_abi=True if torch else None,
            backend=backend or Backend(BackendType.CPU),
        )
    )


CPU = facts()
CUDA129 = facts(backend=Backend(BackendType.CUDA, (12, 9)))


def ref(
    repo: str, version: int | None = None, revision: str | None = None, locked: str = ""
) -> pb.KernelRef:
    out = pb.KernelRef(repo_id=repo)
    if version is not None:
        out.version = version
    elif revision is not None:
        out.revision = revision
    elif locked:
        out.locked_commit = locked
    return out


def resolve_req(
    repo: str,
    version: int | None = 1,
    *,
    revision: str | None = None,
    platform: pb.PlatformFacts | None = CPU,
    allow_fetch: bool = True,
    **kw: Any,
) -> pb.ResolveRequest:
    request = pb.ResolveRequest(
        kernel=ref(repo, version if revision is None else None, revision),
        allow_fetch=allow_fetch,
        client="pytest",
        **kw,
    )
    if platform is not None:
        request.platform.CopyFrom(platform)
    return request


def failure(
    call: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[grpc.StatusCode, pb.ErrorDetail]:
    """Call an RPC that must fail; its status code and the ErrorDetail trailer."""
    kwargs.setdefault("timeout", TIMEOUT)
    try:
        result = call(*args, **kwargs)
        if hasattr(result, "__iter__") and not isinstance(result, bytes):
            list(result)
    except grpc.RpcError as exc:
        detail = detail_from_trailers(exc.trailing_metadata())  # type: ignore[attr-defined]
        assert detail is not None, f"no ErrorDetail trailer: {exc}"
        assert detail.message == exc.details()  # type: ignore[attr-defined]
        return exc.code(), detail  # type: ignore[attr-defined]
    raise AssertionError(f"{call} succeeded")


def tree_files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def http_get_unix(path: Path, target: str = "/metrics") -> str:
    """GET over a unix socket (metrics), HTTP/1.0 so the server closes when done."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(f"GET {target} HTTP/1.0\r\nHost: kerneld\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if "{" in key:
            base, _, rest = key.partition("{")
            got = ",".join(sorted(rest.rstrip("}").split(",")))
        else:
            base, got = key, ""
        if base == name and got == want:
            return float(value)
    return 0.0


def connect_as(path: Path, uid: int, gid: int) -> int:
    """Fork, drop to uid/gid (no supplementary groups), connect; 0 or the errno."""
    pid = os.fork()
    if pid == 0:  # child: no gRPC here, only a raw connect
        code = 0
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
        except OSError as exc:
            code = exc.errno or 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
