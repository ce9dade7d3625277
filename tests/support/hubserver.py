"""A Hugging Face Hub-compatible HTTP server over local git repositories, for tests and benchmarks.

It serves `<root>/kernels/<org>/<name>` (bare or non-bare git repos; LFS objects from the repo's
`lfs/objects`) with the routes `huggingface_hub` 2.4 and `kernels` 0.17.2 use, so the real clients
run unchanged against 127.0.0.1. Every request is counted (by kind and by path), so are the body
bytes sent (by kind), and faults can be injected per path pattern: latency, HTTP 500, 429,
connection reset, truncated or corrupted body. `set_rate_budget()` answers 429 with Retry-After
once a request budget per time window is spent, as the real Hub's rate limits do.
`case_insensitive=True` resolves repo ids and organisations as the real Hub does: `Org/Name`
is the repo `org/name` on disk (info, refs, tree, paths-info, resolve and overviews), and the
info answer's `id` is the canonical one.

This module holds the server's state and configuration; requests are answered in hubhandler.py,
from git through hubgit.py, with the faults, counters and rate budget of hubtraffic.py.

Run by hand: `python -m tests.support.hubserver ROOT [--port N] [--trust ORG]...`.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.hubgit import GitBackend, find_git_dir
from tests.support.hubhandler import HubHandler, HubHTTPServer, NotFound
from tests.support.hubtraffic import Fault, RateBudget, RequestRecord

if TYPE_CHECKING:
    from tests.support.cdn import Cdn


class HubServer:
    """The Hub-compatible server; see the module docstring. Start with `start()` or `with`."""

    def __init__(
        self,
        root: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        trusted_orgs: Mapping[str, bool] | None = None,
        page_size: int = 1000,
        expand_page_size: int = 50,
        latency_s: float = 0.0,
        case_insensitive: bool = False,
    ) -> None:
        self.root = Path(root)
        self.case_insensitive = case_insensitive
        self.host = host
        self.requested_port = port
        self._initial = (dict(trusted_orgs or {}), page_size, expand_page_size, latency_s)
        self.trusted_orgs: dict[str, bool] = dict(trusted_orgs or {})
        self.page_size = page_size
        self.expand_page_size = expand_page_size
        self.latency_s = latency_s
        self.gated: set[str] = set()
        self.cdn: Cdn | None = None  # set: LFS files redirect there, as the real Hub's do
        self.errors: list[str] = []  # unexpected handler exceptions (server bugs)
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._kind_counts: Counter[str] = Counter()
        self._path_counts: Counter[str] = Counter()
        self._kind_bytes: Counter[str] = Counter()
        self.budget: RateBudget | None = None
        self._records: list[RequestRecord] = []
        self._backends: dict[str, GitBackend] = {}
        self._conns: set[socket.socket] = set()
        self._httpd: HubHTTPServer | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self.start_seconds: float | None = None

    # -- lifecycle

    def start(self) -> HubServer:
        t0 = time.perf_counter()
        httpd = HubHTTPServer((self.host, self.requested_port), HubHandler)
        httpd.hub = self
        self._httpd = httpd
        self._port = int(httpd.server_address[1])
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="hubserver",
            daemon=True,
        )
        self._thread.start()
        self.start_seconds = time.perf_counter() - t0
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # close keep-alive connections so their threads end
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for backend in list(self._backends.values()):
            backend.close()
        self._backends.clear()

    def __enter__(self) -> HubServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (still readable after stop(), for tests that check it is closed)."""
        assert self._port is not None, "server not started"
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- configuration

    def inject(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def set_trusted(self, org: str, trusted: bool | None) -> None:
        """Answer `trustedKernelPublisher: trusted` for `org` (None: back to the default, which is
        false for an org with a directory under the root and 404 for any other)."""
        with self._lock:
            if trusted is None:
                self.trusted_orgs.pop(org, None)
            else:
                self.trusted_orgs[org] = trusted

    def set_rate_budget(
        self, requests: int | None, window_s: float = 300.0, **kw: Any
    ) -> RateBudget | None:
        """Serve at most `requests` requests per `window_s` window, then 429 (None: no limit).
        The returned RateBudget counts what it refused."""
        with self._lock:
            self.budget = None if requests is None else RateBudget(requests, window_s, **kw)
            return self.budget

    def reset(self) -> None:
        """Back to the state after construction: counters, faults, rate budget, errors, gating,
        trust, page sizes and latency (a session-wide server is reset between tests)."""
        self.reset_counts()
        self.clear_faults()
        self.set_rate_budget(None)
        trusted, self.page_size, self.expand_page_size, self.latency_s = self._initial
        with self._lock:
            self.trusted_orgs = dict(trusted)
        self.gated.clear()
        self.cdn = None
        self.errors.clear()

    # -- counters

    def reset_counts(self) -> None:
        with self._lock:
            self._kind_counts.clear()
            self._path_counts.clear()
            self._kind_bytes.clear()
            self._records.clear()

    @property
    def counts(self) -> Counter[str]:
        """Requests by kind (see KINDS)."""
        with self._lock:
            return Counter(self._kind_counts)

    @property
    def bytes_sent(self) -> Counter[str]:
        """Response body bytes written, by request kind (headers not included)."""
        with self._lock:
            return Counter(self._kind_bytes)

    def total_bytes(self, *, exclude: tuple[str, ...] = ("agent_harnesses",)) -> int:
        with self._lock:
            return sum(n for kind, n in self._kind_bytes.items() if kind not in exclude)

    def _count_bytes(self, kind: str, n: int) -> None:
        with self._lock:
            self._kind_bytes[kind] += n

    @property
    def path_counts(self) -> Counter[str]:
        """Requests by `METHOD path` (path without query)."""
        with self._lock:
            return Counter(self._path_counts)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def total(self, *, exclude: tuple[str, ...] = ("agent_harnesses",)) -> int:
        """Requests counted but `exclude` kinds (default: the once-per-process telemetry probe)."""
        with self._lock:
            return sum(n for kind, n in self._kind_counts.items() if kind not in exclude)

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self._kind_counts[record.kind] += 1
            self._path_counts[f"{record.method} {record.path}"] += 1
            self._records.append(record)

    def _take_faults(
        self, method: str, path: str, kind: str = "other"
    ) -> tuple[float, Fault | None]:
        """Latency to add and the first non-latency fault that fires for this request (the rate
        budget's 429 first)."""
        delay = self.latency_s
        chosen: Fault | None = None
        with self._lock:
            if self.budget is not None:
                retry_after = self.budget.take(kind, time.monotonic())
                if retry_after is not None:
                    chosen = Fault(path, "rate_limit", retry_after=retry_after)
            for fault in self._faults:
                if fault.exhausted or not fault.matches(method, path):
                    continue
                if fault.kind == "latency":
                    fault.fired += 1
                    delay += fault.latency_s
                elif chosen is None:
                    fault.fired += 1
                    chosen = fault
        return delay, chosen

    # -- repositories

    def backend(self, org: str, name: str) -> GitBackend:
        """The repo `org/name`, looked up on every call: repos created after start() are served,
        and a deleted repo's cat-file process is dropped."""
        if ".." in (org, name) or not org or not name:
            raise NotFound(401, "RepoNotFound", "Repository not found")
        repo_id = f"{org}/{name}"
        with self._lock:
            backend = self._backends.get(repo_id)
            if backend is not None and backend.git_dir.is_dir():
                return backend
            stale = self._backends.pop(repo_id, None)
            git_dir = find_git_dir(self.root / "kernels" / org / name)
            if git_dir is not None:
                backend = self._backends[repo_id] = GitBackend(git_dir)
        if stale is not None:
            stale.close()
        if git_dir is None:
            raise NotFound(401, "RepoNotFound", "Repository not found")
        assert backend is not None
        return backend

    def org_exists(self, org: str) -> bool:
        return bool(org) and ".." not in org and (self.root / "kernels" / org).is_dir()

    def canonical_org(self, org: str) -> str:
        """`org` as the Hub names it: in case-insensitive mode the directory (or trusted_orgs
        key) that matches in any case; else, or with no match, `org` as asked."""
        if not self.case_insensitive or self.org_exists(org):
            return org
        with self._lock:
            known = list(self.trusted_orgs)
        base = self.root / "kernels"
        if base.is_dir():
            known += [child.name for child in base.iterdir() if child.is_dir()]
        return next((k for k in known if k.lower() == org.lower()), org)

    def canonical(self, org: str, name: str) -> tuple[str, str]:
        """The repo `org/name` as the Hub names it (see `canonical_org`)."""
        if not self.case_insensitive:
            return org, name
        org = self.canonical_org(org)
        base = self.root / "kernels" / org
        if ".." in name or (base / name).is_dir() or not base.is_dir():
            return org, name
        return org, next((c.name for c in base.iterdir() if c.name.lower() == name.lower()), name)


def main(argv: list[str] | None = None) -> int:
    """Serve ROOT until interrupted; prints the URL on the first line."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.hubserver", description=__doc__)
    parser.add_argument("root", type=Path, help="directory holding kernels/<org>/<name> git repos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--trust", action="append", default=[], metavar="ORG")
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    parser.add_argument(
        "--case-insensitive", action="store_true", help="resolve Org/Name as the Hub does"
    )
    args = parser.parse_args(argv)
    server = HubServer(
        args.root,
        host=args.host,
        port=args.port,
        trusted_orgs={org: True for org in args.trust},
        page_size=args.page_size,
        latency_s=args.latency_ms / 1000,
        case_insensitive=args.case_insensitive,
    ).start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
