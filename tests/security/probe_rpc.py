"""Call every RPC of one service over one socket as another user; print {method: status}.

    python -m tests.security.probe_rpc UID GID SOCKET SERVICE [GID ...]

Started as root: grpc and the stubs are imported first (the interpreter's files may not be
readable by the target user), then the process drops to UID/GID (supplementary groups: the
extra GIDs only) before its first connection. Every method comes from the proto descriptor, so
an RPC added later is probed without touching any test. Requests are empty messages: what
matters is whether the call reaches the service, not whether it succeeds.
"""

from __future__ import annotations

import json
import os
import sys

import grpc
from google.protobuf import message_factory

from kerneld_client.proto import kerneld_pb2 as pb

TIMEOUT = 10.0


def methods(service: str) -> list[str]:
    return [m.name for m in pb.DESCRIPTOR.services_by_name[service].methods]


def probe(socket_path: str, service: str) -> dict[str, str]:
    """{method: gRPC status name} for every method of `service` (OK when it answered)."""
    desc = pb.DESCRIPTOR.services_by_name[service]
    out: dict[str, str] = {}
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        for method in desc.methods:
            request_cls = message_factory.GetMessageClass(method.input_type)
            response_cls = message_factory.GetMessageClass(method.output_type)
            path = f"/{desc.full_name}/{method.name}"
            make = channel.unary_stream if method.server_streaming else channel.unary_unary
            call = make(
                path,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_cls.FromString,
            )
            try:
                result = call(request_cls(), timeout=TIMEOUT)
                if method.server_streaming:
                    list(result)
                out[method.name] = "OK"
            except grpc.RpcError as exc:
                out[method.name] = exc.code().name
    return out


def main(argv: list[str]) -> int:
    uid, gid, socket_path, service, *extra = argv
    if os.geteuid() == 0 and int(uid) != 0:
        os.setgroups([int(g) for g in extra])
        os.setgid(int(gid))
        os.setuid(int(uid))
    print(json.dumps(probe(socket_path, service)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
