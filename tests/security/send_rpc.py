"""Send Kernels RPCs over a user socket as another user; print what each answered, as JSON.

    python -m tests.security.send_rpc UID GID SOCKET [GID ...] < PLAN

PLAN (stdin, JSON): a list of `[method, base64 request, repeat]`. Started as root: grpc and the
stubs are imported and the plan read first (the target user may not be able to read either),
then the process drops to UID/GID (supplementary groups: the extra GIDs only) before its first
connection, as `probe_rpc` does; each call gets a connection of its own. Output: one entry
per plan item, `{"codes": {status: count}, "details": last error message, "response": base64
of the last answer}`.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import grpc

from kerneld_client.proto import kerneld_pb2 as pb

TIMEOUT = 30.0


def _raw(data: bytes) -> bytes:
    return data


def run(socket_path: str, plan: list[list[Any]]) -> list[dict[str, Any]]:
    """Each call on a connection of its own, as `kerneld_client` makes them."""
    service = pb.DESCRIPTOR.services_by_name["Kernels"]
    out: list[dict[str, Any]] = []
    for method_name, encoded, repeat in plan:
        assert method_name in service.methods_by_name, method_name
        raw = base64.b64decode(encoded)
        codes: dict[str, int] = {}
        details, response = "", b""
        for _ in range(repeat):
            with grpc.insecure_channel(f"unix:{socket_path}") as channel:
                call = channel.unary_unary(
                    f"/{service.full_name}/{method_name}",
                    request_serializer=_raw,
                    response_deserializer=_raw,
                )
                try:
                    response = call(raw, timeout=TIMEOUT)
                    codes["OK"] = codes.get("OK", 0) + 1
                except grpc.RpcError as exc:
                    name = exc.code().name  # type: ignore[attr-defined]
                    codes[name] = codes.get(name, 0) + 1
                    details = exc.details() or ""  # type: ignore[attr-defined]
        out.append(
            {"codes": codes, "details": details, "response": base64.b64encode(response).decode()}
        )
    return out


def main(argv: list[str]) -> int:
    uid, gid, socket_path, *extra = argv
    plan = json.loads(sys.stdin.read())
    if os.geteuid() == 0 and int(uid) != 0:
        os.setgroups([int(g) for g in extra])
        os.setgid(int(gid))
        os.setuid(int(uid))
    print(json.dumps(run(socket_path, plan)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
