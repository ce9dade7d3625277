"""The kerneld daemon: gRPC services on two unix sockets over the store, split by role.

The wiring, here:
    main      `kerneld` command line, exit codes, `--check-config`
    app       lifecycle: socket locks, bind, store open, readiness, signals, drain; the only
              module that builds `Core` (tests/test_layers.py)
    core      the daemon's components, opened, reconfigured and closed together
    reload    what a config reload applies now, and what waits for a restart
    statuses  typed errors -> gRPC status + ErrorDetail trailer (the one table)

The layers, each importing only those below it:
    fronts/    where requests come in: rpc/ (Kernels, Admin, mirror RPCs, ReportSuspect),
               httpfront/ (the HTTP front), hubapi/ (the Hub endpoint), metrics_endpoint
    services/  serving, the acquire gate, leases, fetch history, the background threads
    plumbing/  sockets, activation, identity, peers, access, exposure, notify, sandbox, logs,
               the metrics registry
"""
