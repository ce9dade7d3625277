"""The daemon's lifecycle: lock, bind, open, serve, reload, drain, exit.

Order at start (each step can fail with a clear message and exit code, see `main`):
1. signal handlers (SIGTERM/SIGINT stop, SIGHUP reload) and the systemd watchdog;
2. the single-instance locks of both socket paths, then the sockets, bound under a umask and
   chmod/chown'ed; health answers NOT_SERVING and RPCs UNAVAILABLE/NOT_READY from here on;
3. the store: owner lock (one daemon per store) and crash-recovery scan;
4. health SERVING, the advert file beside the user socket, `READY=1`;
5. background prefetch (readiness never waits for the network) and the periodic scrub.
On SIGTERM: NOT_SERVING, `STOPPING=1`, stop accepting RPCs, let in-flight RPCs and fetches finish
for up to `server.drain_timeout`, flush leases, remove sockets and advert, close the store.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kerneld import __version__
from kerneld.config import Config, ConfigError, config_key
from kerneld.server.core import Core
from kerneld.server.fronts.httpfront.httphead import HttpLimits
from kerneld.server.fronts.hubapi.server import HubApiServer
from kerneld.server.fronts.metrics_endpoint import METRICS_LIMITS, MetricsServer
from kerneld.server.fronts.rpc.admin_service import AdminService
from kerneld.server.fronts.rpc.kernels_service import KernelsService
from kerneld.server.plumbing.access import apply_store_access
from kerneld.server.plumbing.activation import Inherited, hub_api_sockets
from kerneld.server.plumbing.exposure import Exposure, check_hub_endpoint
from kerneld.server.plumbing.identity import (
    CallerInterceptor,
    CredentialListener,
    TokenBook,
    cred_path,
)
from kerneld.server.plumbing.metrics import Metrics
from kerneld.server.plumbing.notify import Notifier, Watchdog, store_summary, watchdog_interval
from kerneld.server.plumbing.sockets import (
    SocketLock,
    SocketSetupError,
    prepare_path,
    remove_advert,
    secure,
    umask,
    write_advert,
)
from kerneld_client.locations import Advert
from kerneld_client.proto import kerneld_pb2 as pb
from kerneld_client.proto import kerneld_pb2_grpc as pb_grpc

log = logging.getLogger("kerneld.daemon")
#: `[server] max_concurrent_rpcs = 0`: this many calls per thread are admitted (one running,
#: the rest queued briefly). The ranks of a job that start together, each asking for a few
#: kernels, must not be refused; a queue bounded this way still answers a flood at once.
QUEUE_FACTOR = 4

KERNELS_SERVICE = pb.DESCRIPTOR.services_by_name["Kernels"].full_name
ADMIN_SERVICE = pb.DESCRIPTOR.services_by_name["Admin"].full_name
#: Sockets are bound owner-only and opened up to the configured mode right after.
BIND_UMASK = 0o177
SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
#: Admin RPCs that change nothing (not audited); health and reflection are not Admin methods.
ADMIN_READ_ONLY = frozenset({"List", "ListDenies", "GetAdminStatus", "Check", "Watch"})
#: Descriptors kept free for the store and SQLite files, blobs being hashed, upstream HTTP
#: connections and logs (measured: ~40 at rest); every listener's cap comes on top
#: (`descriptor_budget`).
FD_RESERVE = 512
#: Calls one connection may carry at once (HTTP/2's recommended minimum): the client makes one
#: call per channel, but a process's concurrent channels share a connection; each open stream
#: costs the daemon memory before an RPC thread sees it.
MAX_STREAMS_PER_CONNECTION = 100
#: The admin socket's RPCs admitted at once, per thread (admins are trusted; the bound only
#: keeps a runaway script from queueing without end).
ADMIN_QUEUE_PER_THREAD = 4


def descriptor_budget(cfg: Config, *, hub_api: bool) -> dict[str, int]:
    """The descriptors each part of the daemon may hold at its caps, by what holds them: every
    listener's connection cap (a refused HTTP connection is kept a moment so that its answer is
    read), the netlink socket that names TCP peers, the pidfds that bind callers' tokens, and
    FD_RESERVE for the store. Reserved before the first socket is bound, so that no caller
    filling one part leaves another (the admin socket, the store) without a descriptor."""
    parts = {
        "user-socket connections": cfg.max_connections,
        "admin-socket connections": cfg.admin_max_connections,
        "caller pidfds": TokenBook.MAX_BOUND,
    }
    if hub_api:
        limits = HttpLimits()
        parts["Hub API connections"] = limits.max_connections + limits.max_refused_draining
    if cfg.metrics_socket is not None or cfg.metrics_listen:
        parts["metrics connections"] = (
            METRICS_LIMITS.max_connections + METRICS_LIMITS.max_refused_draining
        )
    if hub_api or cfg.metrics_listen:
        parts["sock_diag netlink socket (TCP peers' owners)"] = 1
    parts["store, SQLite, downloads and logs"] = FD_RESERVE
    return parts


def _shown_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def block_signals() -> None:
    """Block the daemon's signals in this thread and every thread started after; call before
    any thread exists (threads inherit the mask)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


class Daemon:
    """One kerneld process. `reload_config()` returns the config to switch to on SIGHUP."""

    def __init__(
        self,
        config: Config,
        *,
        reload_config: Callable[[], Config],
        hardware_root: Path = Path("/"),
        inherited: Sequence[Inherited] = (),
    ) -> None:
        """`inherited`: listening sockets systemd passed (`activation.listen_fds`)."""
        self.config = config
        self.inherited = list(inherited)
        self.reload_config = reload_config
        self.metrics = Metrics()
        self.core = Core(config, metrics=self.metrics, hardware_root=hardware_root)
        self.notifier = Notifier()
        self.unclean = False
        """True when the process must exit without waiting for worker threads."""
        self._stop = threading.Event()
        self._reload_lock = threading.Lock()
        self._signal = ""
        self._locks: list[SocketLock] = []
        self._servers: list[grpc.Server] = []
        self._health: list[health.HealthServicer] = []
        self._bound: list[Path] = []
        self._metrics_server: MetricsServer | None = None
        self._hub_api: HubApiServer | None = None
        self._watchdog: Watchdog | None = None
        self._tokens = TokenBook()
        self._creds: list[CredentialListener] = []

    # ---- signals -------------------------------------------------------------------------
    # Signals are blocked in every thread and taken synchronously by the main loop
    # (sigtimedwait). With Python handlers instead, a signal the kernel delivers to one of
    # grpc's threads leaves the main thread asleep and the handler waits until it wakes up.

    # ---- start ---------------------------------------------------------------------------

    def _server(self, name: str, threads: int, connections: int, rpcs: int) -> grpc.Server:
        """One socket's server: its own threads, and grpc core's limits so that what one
        socket's callers do (connections held open, idle or not, calls piling up) stays within
        that socket's share of the process.

        Considered (grpcio 1.85 core channel args): `grpc.max_allowed_incoming_connections`
        (per listening port; more are closed at accept, so their descriptors come back at once),
        `grpc.max_connection_idle_ms` (GOAWAY, then close, for a connection with no call,
        including one that never sent the HTTP/2 preface), `grpc.max_concurrent_streams`;
        grpcio's `maximum_concurrent_rpcs` answers RESOURCE_EXHAUSTED on the polling thread
        without taking a worker. Ping floods are already refused by core's defaults (ping
        strikes, GOAWAY too_many_pings); `grpc.max_connection_age_ms` would also cut long
        admin streams (Verify, GC progress) and buys nothing the cap does not.
        """
        options = [
            ("grpc.max_receive_message_length", 4 << 20),
            ("grpc.max_allowed_incoming_connections", connections),
            ("grpc.max_connection_idle_ms", int(self.config.idle_timeout_s * 1000)),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ]
        return grpc.server(
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name),
            options=options,
            maximum_concurrent_rpcs=rpcs,
            interceptors=self._interceptors(name),
        )

    def _interceptors(self, name: str) -> list[grpc.ServerInterceptor[Any, Any]]:
        """Every call learns its caller from its token; admin calls that change something get
        an audit line (all but the read-only ones, so a new admin RPC is audited by default)."""
        audited = (lambda m: m not in ADMIN_READ_ONLY) if name == "admin" else (lambda m: False)
        return [CallerInterceptor(self._tokens, audited=audited)]

    def _reserve_descriptors(self) -> None:
        """Make sure both sockets' connection caps and FD_RESERVE fit under the open-files
        limit, so a full user socket never leaves the admin socket (or the store) without a
        descriptor; raises the soft limit when the hard one allows, else refuses to start."""
        cfg = self.config
        parts = descriptor_budget(
            cfg, hub_api=bool(self.inherited or cfg.hub_api_listen or cfg.hub_api_socket)
        )
        need = sum(parts.values())
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft >= need:
            return
        shown = ", ".join(f"{n} {what}" for what, n in parts.items())
        problem = (
            f"{shown} need an open-files limit of {need}, but it is {soft}: lower [server] "
            "max_connections or raise the limit (LimitNOFILE= in the unit)"
        )
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(cfg.source, "server.max_connections", problem)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        except (OSError, ValueError) as exc:
            raise ConfigError(cfg.source, "server.max_connections", f"{problem} ({exc})") from exc
        log.info("raised the open-files limit from %d to %d for the sockets' caps", soft, need)

    def _bind(self) -> None:
        cfg = self.config
        user, admin = cfg.user_socket, cfg.admin_socket
        if user.path == admin.path:
            raise SocketSetupError(f"the user and admin sockets are the same path: {user.path}")
        for sock in (user, admin):
            self._locks.append(SocketLock(sock.path))
        for sock in (user, admin):
            prepare_path(sock.path)

        self._reserve_descriptors()
        user_server = self._server(
            "rpc",
            cfg.threads,
            cfg.max_connections,
            cfg.max_concurrent_rpcs or QUEUE_FACTOR * cfg.threads,
        )
        user_health = health.HealthServicer()
        pb_grpc.add_KernelsServicer_to_server(KernelsService(self.core), user_server)
        health_pb2_grpc.add_HealthServicer_to_server(user_health, user_server)

        admin_threads = max(4, cfg.threads // 2)
        admin_server = self._server(
            "admin",
            admin_threads,
            cfg.admin_max_connections,
            admin_threads * ADMIN_QUEUE_PER_THREAD,
        )
        admin_health = health.HealthServicer()
        pb_grpc.add_AdminServicer_to_server(
            AdminService(self.core, reload=self.reload), admin_server
        )
        health_pb2_grpc.add_HealthServicer_to_server(admin_health, admin_server)
        reflection.enable_server_reflection(
            (ADMIN_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), admin_server
        )
        for h, service in ((user_health, KERNELS_SERVICE), (admin_health, ADMIN_SERVICE)):
            h.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            h.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._health = [user_health, admin_health]

        with umask(BIND_UMASK):
            for server, sock in ((user_server, user), (admin_server, admin)):
                server.add_insecure_port(f"unix:{sock.path}")
                self._bound.append(sock.path)
            for sock in (user, admin):  # caller identity: see server/plumbing/identity.py
                listener = CredentialListener(cred_path(sock.path), self._tokens)
                listener.bind()
                self._creds.append(listener)
        for sock in (user, admin):
            secure(sock.path, sock)
            secure(cred_path(sock.path), sock)
        for server in (user_server, admin_server):
            server.start()
            self._servers.append(server)
        for listener in self._creds:
            listener.start()
        log.info("listening user=%s admin=%s", user.path, admin.path)

    # ---- the optional HTTP listeners ---------------------------------------------------------
    # A port another process holds, or a listener refused for what it would expose, is an error
    # line and a line in `kerneldctl status`, never a daemon that does not start: jobs load
    # through the gRPC sockets and the published index whatever happens to these.

    def _listener_problem(self, what: str, problem: str) -> None:
        log.error("%s: %s", what, problem)
        self.core.listener_problems.append(f"{what}: {problem}")

    def _start_metrics(self) -> None:
        cfg = self.config
        if cfg.metrics_socket is None and not cfg.metrics_listen:
            return
        server = MetricsServer(
            self.metrics,
            socket_path=cfg.metrics_socket,
            listen=cfg.metrics_listen,
            socket_mode=cfg.metrics_socket_mode,
            socket_group=cfg.metrics_socket_group,
        )
        for failed in server.failed:
            self._listener_problem("metrics", f"not listening on {failed}; the rest serves")
        server.start()
        self._metrics_server = server

    def _start_hub_api(self) -> None:
        cfg = self.config
        passed = hub_api_sockets(
            self.inherited, listen=cfg.hub_api_listen, socket_path=cfg.hub_api_socket
        )
        if not (passed or cfg.hub_api_listen or cfg.hub_api_socket):
            return
        served: list[Inherited] = []
        refused: list[tuple[Inherited, str]] = []
        for item in passed:
            exposure = (
                check_hub_endpoint(
                    _shown_address(item.address), item.address[1], system=cfg.system, passed=True
                )
                if item.address is not None
                else Exposure(serve=True)
            )
            if exposure.serve:
                served.append(item)
            else:
                refused.append((item, exposure.refusal))
                self._listener_problem("hub api", exposure.refusal)
            if exposure.warning:
                log.warning("%s", exposure.warning)
        listen = "" if passed else cfg.hub_api_listen
        if listen:
            port = int(listen.rpartition(":")[2])
            exposure = check_hub_endpoint(f"http://{listen}", port, system=cfg.system, passed=False)
            if exposure.warning:
                log.warning("%s", exposure.warning)
            if not exposure.serve:
                self._listener_problem("hub api", exposure.refusal)
                listen = ""
        server = HubApiServer(
            self.core,
            listen=listen,
            socket_path=None if passed else cfg.hub_api_socket,
            inherited=served,
            refused=refused,
        )
        for failed in server.failed:
            self._listener_problem("hub api", f"not listening on {failed}; the rest serves")
        server.start()
        self._hub_api = server
        self.core.hub_api = list(server.where)

    def _serving(self, on: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if on
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for h, service in zip(self._health, (KERNELS_SERVICE, ADMIN_SERVICE), strict=True):
            h.set("", status)
            h.set(service, status)
        self.metrics.ready.set(1 if on else 0)

    def run(self) -> int:
        """Serve until SIGTERM; returns the exit status (exceptions propagate to `main`)."""
        block_signals()
        interval = watchdog_interval()
        if interval is not None:
            self._watchdog = Watchdog(self.notifier, interval, self.core.healthy)
            self._watchdog.start()
        try:
            self.notifier.status("binding sockets")
            self._bind()
            self.notifier.status(f"opening store {self.config.store_path}")
            started = time.monotonic()
            store = self.core.open()
            self.metrics.watch_quarantine(
                lambda: (*store.quarantine.usage(), store.quarantine.max_bytes)
            )
            apply_store_access(store.root, self.config.user_socket)
            self._start_metrics()
            self._start_hub_api()
            # The advert first: a client that sees SERVING finds the index right away.
            write_advert(
                Advert(
                    store_root=store.root,
                    index_dir=store.published.directory,
                    user_socket=self.config.user_socket.path,
                    admin_socket=self.config.admin_socket.path,
                    pid=os.getpid(),
                    version=__version__,
                )
            )
            self.core.ready = True
            self._serving(True)
            usage = store.space.usage()
            summary = (
                f"serving {usage.trees} trees ({usage.bytes_used} bytes) from "
                f"{store.root} on {self.config.user_socket.path}"
            )
            log.info("ready in %.3fs: %s", time.monotonic() - started, summary)
            self.notifier.ready(summary)
            # from here on the status line follows the store (repair, scrub, GC), see notify.py
            sock = self.config.user_socket.path
            self.notifier.track(lambda: store_summary(store, sock))
            self.core.start_timer()
            self.core.warm_upstreams()
            self.core.scrubber.start()
            self._loop()
        finally:
            self._shutdown()
        return 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            info = signal.sigtimedwait(SIGNALS, 0.5)
            if info is None:
                continue
            if info.si_signo != signal.SIGHUP:
                self._signal = signal.Signals(info.si_signo).name
                self._stop.set()
                continue
            try:
                self.reload()
            except Exception as exc:
                log.error("reload failed, keeping the running config: %s", exc)
                self.notifier.ready(f"reload failed: {exc}")

    # ---- reload --------------------------------------------------------------------------

    def reload(self) -> tuple[bool, str]:
        """Re-read the config (SIGHUP or Admin.ReloadConfig); invalid config keeps the old one
        and raises ConfigError."""
        with self._reload_lock:
            self.notifier.reloading("reloading config")
            try:
                new = self.reload_config()
            except Exception:
                self.notifier.ready("reload failed; running config kept")
                raise
            applied, restart = self.core.apply_config(new)
            self.config = self.core.config
            parts = []
            # named as in kerneld.toml ("[resolve] ref_ttl"), not as Config fields
            if applied:
                parts.append("applied: " + ", ".join(config_key(c) for c in applied))
            if restart:
                parts.append("needs a restart: " + ", ".join(config_key(c) for c in restart))
            detail = "; ".join(parts) or "no changes"
            log.info("config reloaded from %s: %s", new.source, detail)
            self.notifier.ready(f"config reloaded: {detail}")
            return bool(applied), detail

    # ---- stop ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop as if SIGTERM had arrived (within the loop's 0.5 s poll)."""
        self._signal = self._signal or "request"
        self._stop.set()

    def _shutdown(self) -> None:
        grace = self.config.drain_timeout_s
        deadline = time.monotonic() + grace
        why = self._signal or "startup failure"
        if self._servers:
            log.info(
                "stopping (%s): draining in-flight RPCs and fetches for up to %.1fs", why, grace
            )
            self.notifier.stopping(f"draining ({why})")
        self.core.ready = False
        for h in self._health:
            h.enter_graceful_shutdown()
        if grace <= 0:
            self.core.cancel.set()
        self.core.stop_timer()
        if self._hub_api is not None:
            self._hub_api.quiesce()  # no new HTTP requests; those running drain with the RPCs
        events = [server.stop(grace) for server in self._servers]
        for event in events:
            event.wait(max(0.0, deadline - time.monotonic()) + 1.0)
        if self._hub_api is not None:
            self._hub_api.stop(max(0.0, deadline - time.monotonic()))
        idle = self.core.wait_idle(deadline - time.monotonic())
        if not idle:
            self.core.cancel.set()
            log.warning(
                "drain timeout: %d request(s)/fetch(es) still running; exiting anyway (partial "
                "downloads stay invisible and resume at the next start)",
                self.core.inflight,
            )
            self.unclean = True
        if self._metrics_server is not None:
            self._metrics_server.stop()
        user_socket = self.config.user_socket.path
        remove_advert(user_socket, os.getpid())
        for listener in self._creds:
            listener.stop()
        for path in self._bound:
            try:
                if path.is_socket():
                    path.unlink()
            except OSError as exc:
                log.warning("could not remove socket %s: %s", path, exc)
        if self._watchdog is not None:
            self._watchdog.stop()
        if idle:
            self.core.close()
        else:
            self.core.flush_leases()
        for lock in self._locks:
            lock.release()
        if self._servers:
            log.info("stopped (%s)", why)
