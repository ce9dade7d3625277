"""`kerneld` console entry point.

Exit codes:
    0  stopped cleanly (SIGTERM/SIGINT), or `--check-config` found the config valid
    1  a runtime failure (the store cannot be opened, a socket cannot be bound, ...)
    2  invalid configuration or command line (the message names the file, key and reason)
    3  another kerneld already serves one of the socket paths or owns the store
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kerneld import __version__
from kerneld.config import (
    Config,
    ConfigError,
    UpstreamConfig,
    check_metrics_listen,
    dump_config,
    load_config,
    parse_listen,
    parse_loopback,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_BUSY = 3
LEVELS = ("debug", "info", "warning", "error")
FLAGS = "command line"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerneld",
        description="Host daemon that owns a verified store of Kernel Hub kernels and serves "
        "load paths to training processes over gRPC on unix sockets.",
        epilog="Exit codes: 0 clean stop, 1 runtime failure, 2 invalid config or flags, "
        "3 another kerneld serves the sockets or owns the store. Signals: SIGTERM drains and "
        "stops, SIGHUP reloads the config file.",
    )
    parser.add_argument("--version", action="version", version=f"kerneld {__version__}")
    parser.add_argument(
        "--config",
        type=Path,
        help="TOML config file (default: $KERNELD_CONFIG, /etc/kerneld/kerneld.toml as root, "
        "else ~/.config/kerneld/kerneld.toml; none: built-in defaults)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--system",
        dest="system",
        action="store_const",
        const=True,
        help="system-service defaults (/run/kerneld, /var/lib/kerneld, socket groups)",
    )
    mode.add_argument(
        "--user",
        dest="system",
        action="store_const",
        const=False,
        help="one-user defaults ($XDG_RUNTIME_DIR/kerneld, ~/.cache/kerneld, mode 0600)",
    )
    parser.add_argument("--store", type=Path, help="store directory (overrides [store] path)")
    parser.add_argument("--socket", type=Path, help="user socket path ([sockets] user)")
    parser.add_argument("--admin-socket", type=Path, help="admin socket path ([sockets] admin)")
    parser.add_argument(
        "--upstream-mirror-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a kerneld mirror directory to use as an upstream ahead of the configured ones "
        "(repeatable)",
    )
    parser.add_argument(
        "--hub-endpoint",
        metavar="URL",
        help="Hub endpoint for the hub upstream(s) (adds a hub upstream if none is configured)",
    )
    parser.add_argument(
        "--no-hub",
        action="store_true",
        help="drop hub upstreams (air-gapped: mirrors only; alone, an import-only daemon that "
        "never opens a network connection, like `upstream = []`)",
    )
    parser.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="PATTERN",
        help="trust this publisher's kernels whatever the Hub says ('my-org/*'; added to [trust] "
        "allow; repeatable): a mirror-only daemon has no Hub to ask",
    )
    parser.add_argument("--metrics-socket", type=Path, help="serve metrics on this unix socket")
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve metrics on HOST:PORT (loopback, unless [metrics] allow_remote = true)",
    )
    parser.add_argument(
        "--hub-api-listen",
        metavar="HOST:PORT",
        help="serve the Hub-compatible HTTP API on loopback (HF_ENDPOINT for unmodified kernels)",
    )
    parser.add_argument("--log-level", choices=LEVELS, help="overrides [log] level")
    parser.add_argument(
        "--drain-timeout", type=float, metavar="SECONDS", help="overrides [server] drain_timeout"
    )
    parser.add_argument(
        "--hardware-root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="read /proc and /sys under DIR for GPU detection (containers, tests)",
    )
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="accepted for compatibility: kerneld always runs in the foreground",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="print the resolved configuration (and detected hardware) and exit",
    )
    return parser


def apply_flags(cfg: Config, args: argparse.Namespace) -> Config:
    """Command-line flags win over the file and the environment."""
    updates: dict[str, object] = {}
    if args.store is not None:
        updates["store_path"] = args.store.absolute()
    if args.socket is not None:
        updates["user_socket"] = replace(cfg.user_socket, path=args.socket.absolute())
    if args.admin_socket is not None:
        updates["admin_socket"] = replace(cfg.admin_socket, path=args.admin_socket.absolute())
    chain = list(cfg.upstreams)
    if args.no_hub:
        chain = [u for u in chain if u.kind != "hub"]
    if args.hub_endpoint:
        if not args.hub_endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                FLAGS, "--hub-endpoint", f"expected an http(s) URL, got {args.hub_endpoint!r}"
            )
        hubs = [u for u in chain if u.kind == "hub"]
        if hubs:
            chain = [
                replace(u, location=args.hub_endpoint) if u.kind == "hub" else u for u in chain
            ]
        elif not args.no_hub:
            chain.append(UpstreamConfig("hub", "hub", args.hub_endpoint))
    mirrors = [
        UpstreamConfig(f"cli-mirror-{i}", "mirror-dir", str(path.absolute()))
        for i, path in enumerate(args.upstream_mirror_dir)
    ]
    chain = mirrors + chain  # empty: import-only (`upstream = []`), not an error
    updates["upstreams"] = tuple(chain)
    if args.trust:
        bad = [p for p in args.trust if "/" not in p]
        if bad:
            raise ConfigError(FLAGS, "--trust", f"expected 'org/*' or 'org/name', got {bad[0]!r}")
        updates["trust_allow"] = (*cfg.trust_allow, *args.trust)
    if args.metrics_socket is not None:
        updates["metrics_socket"] = args.metrics_socket.absolute()
    if args.metrics_listen is not None:
        updates["metrics_listen"] = parse_listen(
            args.metrics_listen, source=FLAGS, key="--metrics-listen"
        )
    if args.hub_api_listen is not None:
        updates["hub_api_listen"] = parse_loopback(
            args.hub_api_listen, source=FLAGS, key="--hub-api-listen"
        )
    if args.log_level is not None:
        updates["log_level"] = args.log_level
    if args.drain_timeout is not None:
        if args.drain_timeout < 0:
            raise ConfigError(FLAGS, "--drain-timeout", "must be >= 0")
        updates["drain_timeout_s"] = args.drain_timeout
    out = replace(cfg, **updates)  # type: ignore[arg-type]
    check_metrics_listen(out, FLAGS, "--metrics-listen")
    return out


def resolve_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Config:
    return apply_flags(load_config(args.config, env=env, system=args.system), args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = resolve_config(args)
    except ConfigError as exc:
        print(f"kerneld: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    if args.check_config:
        from kerneld.pipeline.hardware import detect
        from kerneld.server.plumbing.sandbox import installed_sandbox

        sandbox = installed_sandbox() if cfg.system else None
        refusal = sandbox.refusal(cfg.store_path) if sandbox is not None else None
        if refusal is not None:
            print(f"kerneld: invalid configuration: [store] path: {refusal}", file=sys.stderr)
            return EXIT_CONFIG
        print(dump_config(cfg), end="")
        logging.disable(logging.CRITICAL)
        hw = detect(args.hardware_root)
        print(f"# hardware: {hw.summary()}")
        for note in hw.notes:
            print(f"#   {note}")
        return EXIT_OK

    from kerneld.server.plumbing import logs

    logs.setup(cfg.log_level)
    log = logging.getLogger("kerneld.daemon")
    log.info(
        "kerneld %s starting (pid %d) config=%s store=%s",
        __version__,
        os.getpid(),
        cfg.source,
        cfg.store_path,
    )
    code = _serve(cfg, args, log)
    logging.shutdown()
    return code


def unwritable_hint(exc: OSError) -> str | None:
    """What to do when the daemon may not write where it must (a fresh node's root-owned
    hostPath directories, a store made by another uid): name the directory, its owner and mode,
    and the fix; None for other errors."""
    if exc.errno not in (errno.EACCES, errno.EPERM) or not exc.filename:
        return None
    target = Path(os.fsdecode(exc.filename))
    if not (target.exists() and not target.is_dir()):
        target = target.parent
        while not target.exists() and target != target.parent:
            target = target.parent
    try:
        st = target.stat()
    except OSError:
        return None
    uid, gid = os.geteuid(), os.getegid()
    what = "directory" if target.is_dir() else "file"
    return (
        f"kerneld runs as uid {uid} (gid {gid}) and may not write the {what} {target} (owner "
        f"uid {st.st_uid} gid {st.st_gid}, mode {st.st_mode & 0o7777:04o}): give it to this "
        f"user (`chown {uid}:{gid} {target}`; in Kubernetes the DaemonSet's init container "
        "does this, under systemd the unit's StateDirectory=/RuntimeDirectory=) or configure a "
        "path it may write"
    )


def _serve(cfg: Config, args: argparse.Namespace, log: logging.Logger) -> int:
    import signal

    # Before anything can start a thread (see kerneld.server.app: signals are taken by the
    # main loop, never by a handler).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    from kerneld.server.app import Daemon
    from kerneld.server.plumbing.activation import listen_fds
    from kerneld.server.plumbing.sockets import SocketBusy, SocketSetupError
    from kerneld.store import StoreError, StoreLockedError

    try:  # first: the variables go from the environment before anything could pass them on
        inherited = listen_fds()
    except SocketSetupError as exc:
        log.error("cannot use the sockets systemd passed: %s", exc)
        return EXIT_CONFIG
    if inherited:
        log.info(
            "socket activation: %s",
            ", ".join(f"{item.name}={item.describe()}" for item in inherited),
        )
    daemon = Daemon(
        cfg,
        reload_config=lambda: resolve_config(args),
        hardware_root=args.hardware_root,
        inherited=inherited,
    )
    try:
        code = daemon.run()
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        code = EXIT_CONFIG
    except (SocketBusy, StoreLockedError) as exc:
        log.error("refusing to start: %s", exc)
        code = EXIT_BUSY
    except SocketSetupError as exc:
        log.error("cannot create sockets: %s", exc)
        code = EXIT_CONFIG
    except (StoreError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EROFS:
            from kerneld.server.plumbing.sandbox import readonly_by_sandbox

            cause = readonly_by_sandbox(Path(os.fsdecode(exc.filename or cfg.store_path)))
        else:
            cause = None
        if cause is not None:
            log.error("cannot start: %s; %s", exc, cause)
        elif isinstance(exc, OSError) and exc.errno == errno.EROFS:
            log.error(
                "cannot start: %s; the store's file system is read-only (a disk error can "
                "remount it so): check `dmesg`, repair it, then start kerneld again",
                exc,
            )
        elif isinstance(exc, OSError) and (hint := unwritable_hint(exc)):
            log.error("cannot start: %s; %s", exc, hint)
        else:
            log.error("cannot start: %s", exc)
        code = EXIT_FAILURE
    except Exception as exc:
        log.critical("crashed: %r", exc, exc_info=exc)
        code = EXIT_FAILURE
    if daemon.unclean:
        # Worker threads are still inside a download: do not wait for them at exit.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
