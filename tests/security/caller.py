"""Act as a real user against a daemon: `python -m tests.security.caller UID GID SOCKET STEPS
[GID ...]` prints a JSON list, one result per step.

Imports grpc as root (the interpreter may be unreadable to the target user), then drops to
UID/GID with only the extra GIDs as supplementary groups. STEPS is JSON: a list of
{"op": "token"} (this process's token from the socket's .cred side-channel) or
{"op": "resolve"|"pin", "repo": ..., "version": N, "fetch": bool, "client": ...,
 "token": "auto" | "none" | a token string}; a call's result is "OK" or "CODE: message".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from kerneld_client import caller
from kerneld_client.proto import kerneld_pb2 as pb
from tests.daemon.rpc import CPU


def _call(socket: Path, step: dict[str, Any]) -> str:
    token = step.get("token", "auto")
    if token == "auto":
        meta = caller.caller_metadata(socket)
    else:
        meta = None if token == "none" else ((caller.CALLER_METADATA, token),)
    kernel = pb.KernelRef(repo_id=step["repo"], version=step.get("version", 1))
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        try:
            if step["op"] == "pin":
                pin = channel.unary_unary(
                    "/kerneld.v1.Admin/Pin",
                    request_serializer=pb.PinRequest.SerializeToString,
                    response_deserializer=pb.PinResponse.FromString,
                )
                pin(pb.PinRequest(kernel=kernel), timeout=20, metadata=meta)
            else:
                resolve = channel.unary_unary(
                    "/kerneld.v1.Kernels/Resolve",
                    request_serializer=pb.ResolveRequest.SerializeToString,
                    response_deserializer=pb.ResolveResponse.FromString,
                )
                request = pb.ResolveRequest(
                    kernel=kernel,
                    platform=CPU,
                    allow_fetch=step.get("fetch", True),
                    client=step.get("client", "caller-test"),
                )
                resolve(request, timeout=20, metadata=meta)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return "OK"


def main(argv: list[str]) -> int:
    uid, gid, socket, steps, *extra = argv
    if os.geteuid() == 0 and int(uid) != 0:
        os.setgroups([int(g) for g in extra])
        os.setgid(int(gid))
        os.setuid(int(uid))
    out = []
    for step in json.loads(steps):
        if step["op"] == "token":
            out.append(caller.caller_token(Path(socket)))
        else:
            out.append(_call(Path(socket), step))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
