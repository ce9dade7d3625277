"""The kerneld daemon: gRPC services on two unix sockets over the store.

Modules, one job each:
    main             `kerneld` command line, exit codes, `--check-config`
    app              lifecycle: socket locks, bind, store open, readiness, signals, drain
    core             shared state: policy, warm-path memory, leases, prefetch timer, reload
    kernels_service  `Kernels` (user socket): Resolve, ResolveMany, ListVariants, leases, status
    admin_service    `Admin` (admin socket): prefetch, list, pin, deny, GC, verify, reload
    mirror_rpc       MirrorExport/MirrorImport over `kerneld.mirror`
    errors           typed errors -> gRPC status + ErrorDetail trailer
    convert          wire <-> domain conversions
    sockets          single-instance socket locks, umask/chmod/chown, the advert file
    leases           leases and resolve times written behind in batches
    upstreams        the configured upstream chain, with reachability for status
    notify           sd_notify READY/STATUS/STOPPING and the watchdog
    metrics          Prometheus metrics on a unix socket or loopback port
    logs             one line per event, journald priorities under systemd
"""
