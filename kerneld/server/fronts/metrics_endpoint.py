"""The metrics exposition: `[metrics]` served over HTTP on a unix socket or a loopback port (any
address with `allow_remote`, for a scraper on another host: a Kubernetes pod's IP).

A front end on the daemon's HTTP front (`fronts/httpfront/`), like the Hub endpoint; the
counters themselves are `kerneld/server/plumbing/metrics.py`'s, read at scrape time.
"""

from __future__ import annotations

import gzip
import ipaddress
import logging
import socket
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from kerneld.config import SocketConfig
from kerneld.server.fronts.httpfront.httpexchange import Exchange
from kerneld.server.fronts.httpfront.httphead import HttpLimits
from kerneld.server.fronts.httpfront.httplisteners import HttpListeners
from kerneld.server.plumbing.identity import Caller
from kerneld.server.plumbing.metrics import Metrics
from kerneld.server.plumbing.peers import identify_peer

log = logging.getLogger("kerneld.metrics")


#: A scraper or two: few workers and connections (the listener shares the unit's TasksMax).
METRICS_LIMITS = HttpLimits(
    workers=2, per_uid_workers=1, max_connections=64, per_uid_connections=16
)


#: The uid every remote scraper is counted as (`[metrics] allow_remote`): the kernel names no
#: owner for another host's connection, and the per-uid limits must still bound them.
REMOTE_SCRAPER_UID = 65534


def _identify_scraper(sock: socket.socket, peer: Any) -> Caller | None:
    """`identify_peer`, and a connection from another host as one shared remote scraper (only
    bound off loopback when `[metrics] allow_remote` says so)."""
    if isinstance(peer, tuple) and not ipaddress.ip_address(peer[0]).is_loopback:
        return Caller(uid=REMOTE_SCRAPER_UID, gid=REMOTE_SCRAPER_UID)
    return identify_peer(sock, peer)


class _Exposition:
    """The scrape handler for the HTTP front: any GET path gets the registry in the format its
    Accept asks for (`?name[]=` keeps only those metrics), gzipped when accepted, as
    prometheus_client's own handler answers."""

    methods = frozenset({"GET"})

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def __call__(self, exchange: Exchange) -> None:
        encoder, content_type = choose_encoder(exchange.header("Accept") or "")
        names = parse_qs(urlsplit(exchange.target).query).get("name[]")
        output = encoder(self.registry.restricted_registry(names) if names else self.registry)
        headers = {"Content-Type": content_type}
        accepted = exchange.header("Accept-Encoding") or ""
        if "gzip" in [e.split(";")[0].strip() for e in accepted.lower().split(",")]:
            output = gzip.compress(output)
            headers["Content-Encoding"] = "gzip"
        headers["Content-Length"] = str(len(output))
        exchange.respond(200, headers, output)


class MetricsServer:
    """HTTP exposition of `metrics` on a unix socket path and/or a loopback HOST:PORT.

    The unix socket is bound owner-only and then opened to `socket_mode` for `socket_group`
    (`[metrics] socket_mode`, `socket_group`), like the RPC sockets: its mode and group decide who
    may scrape. The system default is the `kerneld-admin` group, whose members also run kerneldctl.
    """

    def __init__(
        self,
        metrics: Metrics,
        *,
        socket_path: Path | None,
        listen: str,
        socket_mode: int = 0o660,
        socket_group: str = "",
    ) -> None:
        handler = _Exposition(metrics.registry)
        self._listeners = HttpListeners(
            "metrics",
            handler,
            socket_path=socket_path,
            listen=listen,
            socket=None
            if socket_path is None
            else SocketConfig(socket_path, socket_mode, socket_group),
            identify=_identify_scraper,
            limits=METRICS_LIMITS,
        )
        self.where = self._listeners.where
        self.failed = self._listeners.failed

    def start(self) -> None:
        self._listeners.start()
        for where in self.where:
            log.info("metrics on %s/metrics", where)

    def stop(self) -> None:
        self._listeners.stop()
