"""The daemon's front ends: where requests come in and are turned into calls on the services.

`rpc/`: the gRPC servicers of the two unix sockets (`Kernels`, `Admin`, the mirror RPCs, the
ReportSuspect desk) and the wire conversions; `httpfront/`: the HTTP front (accept loop with
identity at accept, h11 parsing, per-uid shares) that `hubapi/` (the Hub-compatible endpoint)
and `metrics_endpoint` (the Prometheus exposition) are served by. Each front takes a host
protocol of its own (what it uses of the daemon), never `Core`; the wiring (`app.py`) hands it
the daemon (`tests/test_structure.py`).
"""
