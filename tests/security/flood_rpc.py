"""An attacker on the user socket, as another user: hold connections, flood slow calls, or send
one oversized ResolveMany; prints JSON.

    python -m tests.security.flood_rpc UID GID SOCKET hold COUNT
    python -m tests.security.flood_rpc UID GID SOCKET resolve THREADS SECONDS DEADLINE
    python -m tests.security.flood_rpc UID GID SOCKET many ENTRIES REPO

Started as root, it imports grpc first and drops to UID/GID (no supplementary groups) before its
first connection, as `probe_rpc` does. `hold` opens COUNT raw connections that speak HTTP/2
(preface, SETTINGS, ACKs for the daemon's SETTINGS and PINGs) but never make a call, prints one
line `{"connected": n, "open": m}` once the daemon has had a second to close what it refuses,
then keeps answering until its stdin is closed. `resolve` runs THREADS callers that ask, for
SECONDS, for kernels with random names (each a download the daemon must try) under DEADLINE;
it prints how each call ended and the slowest rejection.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import threading
import time
import uuid
from collections import Counter

import grpc

from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto import kerneld_pb2_grpc as pb_grpc
from tests.daemon.rpc import resolve_req

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
PING, ACK = 6, 1


def _answer(sock: socket.socket, data: bytes) -> None:
    """ACK every SETTINGS and PING frame in `data` (frames may straddle reads: good enough for
    an attacker that wants its connections to look alive)."""
    at = 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        kind, flags = data[at + 3], data[at + 4]
        payload = data[at + 9 : at + 9 + length]
        if kind == 4 and not flags & ACK:
            sock.sendall(SETTINGS_ACK)
        elif kind == PING and not flags & ACK and len(payload) == 8:
            sock.sendall(b"\x00\x00\x08\x06\x01\x00\x00\x00\x00" + payload)
        at += 9 + length


def _pump(socks: dict[int, socket.socket], timeout: float) -> None:
    """Answer what the daemon sent; drop the connections it closed."""
    if not socks:
        time.sleep(timeout)
        return
    poller = select.poll()  # not select(): descriptors past 1024
    for fd in socks:
        poller.register(fd, select.POLLIN)
    for fd, _ in poller.poll(timeout * 1000):
        sock = socks[fd]
        try:
            data = sock.recv(65536)
            if data:
                _answer(sock, data)
                continue
        except OSError:
            pass
        socks.pop(sock.fileno())
        sock.close()


def hold(path: str, count: int) -> None:
    socks: dict[int, socket.socket] = {}
    connected = 0
    give_up = time.monotonic() + 10.0
    for _ in range(count):
        if time.monotonic() > give_up:
            break
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(0.5)  # a daemon that accepts nothing leaves connect() blocked
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            continue
        connected += 1
        try:
            sock.sendall(PREFACE + SETTINGS)
        except OSError:  # already closed by the daemon
            sock.close()
            continue
        socks[sock.fileno()] = sock
    settle = time.monotonic() + 1.0
    while time.monotonic() < settle:
        _pump(socks, 0.1)
    print(json.dumps({"connected": connected, "open": len(socks)}), flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        _pump(socks, 0.1)


def resolve(path: str, threads: int, seconds: float, deadline: float) -> None:
    codes: Counter[str] = Counter()
    slowest_rejection = 0.0
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def caller() -> None:
        nonlocal slowest_rejection
        with grpc.insecure_channel(f"unix:{path}") as channel:
            stub = pb_grpc.KernelsStub(channel)
            while time.monotonic() < end:
                request = resolve_req(f"flood/{uuid.uuid4().hex}", 1)
                started = time.monotonic()
                try:
                    stub.Resolve(request, timeout=deadline)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                took = time.monotonic() - started
                with lock:
                    codes[code] += 1
                    if code == "RESOURCE_EXHAUSTED":
                        slowest_rejection = max(slowest_rejection, took)
                if code == "RESOURCE_EXHAUSTED":
                    time.sleep(0.05)  # keep the daemon full without spinning the CPU

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"codes": dict(codes), "slowest_rejection": slowest_rejection}))


def many(path: str, entries: int, repo: str) -> None:
    """One ResolveMany asking `entries` times for `repo` v1 (cached: each entry costs the daemon
    a resolution, a lease and an answer, and nothing upstream)."""
    one = resolve_req(repo, 1, lease_seconds=86400)
    request = pb.ResolveManyRequest(requests=[one] * entries)
    with grpc.insecure_channel(f"unix:{path}") as channel:
        try:
            reply = pb_grpc.KernelsStub(channel).ResolveMany(request, timeout=30)
            out = {"code": "OK", "results": len(reply.results)}
        except grpc.RpcError as exc:
            out = {"code": exc.code().name, "message": exc.details()}
    print(json.dumps(out))


def main(argv: list[str]) -> int:
    uid, gid, path, mode, *args = argv
    if os.geteuid() == 0 and int(uid) != 0:
        os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
    if mode == "hold":
        hold(path, int(args[0]))
    elif mode == "resolve":
        resolve(path, int(args[0]), float(args[1]), float(args[2]))
    elif mode == "many":
        many(path, int(args[0]), args[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
