"""A Hugging Face Hub-compatible HTTP server over local git repositories, for tests and benchmarks.

It serves `<root>/kernels/<org>/<name>` (bare or non-bare git repos; LFS objects from the repo's
`lfs/objects`) with the routes `huggingface_hub` 2.4 and `kernels` 0.17.2 use, so the real clients
run unchanged against 127.0.0.1. Every request is counted (by kind and by path), so are the body
bytes sent (by kind), and faults can be injected per path pattern: latency, HTTP 500, 429,
connection reset, truncated or corrupted body. `set_rate_budget()` answers 429 with Retry-After
once a request budget per time window is spent, as the real Hub's rate limits do.

Run by hand: `python -m tests.support.hubserver ROOT [--port N] [--trust ORG]...`.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

HEX40 = re.compile(r"[0-9a-f]{40}")
LFS_POINTER = re.compile(
    rb"version https://git-lfs\.github\.com/spec/v1\noid sha256:([0-9a-f]{64})\nsize ([0-9]+)\n"
)
LFS_POINTER_MAX = 1024  # the git-lfs spec caps pointer files at 1024 bytes

if TYPE_CHECKING:
    from tests.support.cdn import Cdn

FaultKind = Literal["latency", "error", "rate_limit", "reset", "truncate", "corrupt"]
BODY_FAULTS = frozenset({"reset", "truncate", "corrupt"})

# Request kinds for the counters.
KINDS = (
    "refs",
    "info",
    "tree",
    "paths_info",
    "resolve_head",
    "resolve_get",
    "org_overview",
    "agent_harnesses",
    "other",
)


def hub_date(epoch: int) -> str:
    """The Hub's date format, exactly: `2026-01-01T00:00:00.000Z`."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# --- faults ---------------------------------------------------------------------------------------


@dataclass
class Fault:
    """One injected fault, for requests whose path matches `pattern`: a glob (fnmatch, where `*`
    also matches `/`) or, with `regex=True`, a regex searched in the path. The path is as sent:
    no query string, still percent-encoded (`/api/kernels/o/n/tree/refs%2Fheads%2Fv1`).
    `times=None` fires forever; `fired` counts how often it fired; `method` limits it to one method.

    Kinds: `latency` (sleep `latency_s`, then serve normally; combines with the others), `error`
    (HTTP `status`, default 500), `rate_limit` (429 with `Retry-After: retry_after`), and, on
    responses with a body only (never HEAD): `reset` (half the body, then a TCP RST), `truncate`
    (half the body, then a clean close: Content-Length promised more), `corrupt` (full length, the
    byte at `corrupt_offset` (default: the middle) XOR 0xFF).
    """

    pattern: str
    kind: FaultKind
    times: int | None = None
    latency_s: float = 0.0
    status: int = 500
    retry_after: int = 1
    method: str | None = None
    regex: bool = False
    corrupt_offset: int | None = None
    fired: int = field(default=0, init=False)

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method.upper() != method:
            return False
        if self.kind in BODY_FAULTS and method == "HEAD":
            return False
        if self.regex:
            return re.search(self.pattern, path) is not None
        return fnmatch.fnmatchcase(path, self.pattern)

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times


@dataclass
class RateBudget:
    """At most `requests` requests per fixed window of `window_s` seconds (the window opens with
    its first request); the rest get 429 with `Retry-After` = the seconds left in the window
    (rounded up). `exclude` kinds (default: the telemetry probe) pass and are not counted."""

    requests: int
    window_s: float
    exclude: tuple[str, ...] = ("agent_harnesses",)
    window_start: float | None = field(default=None, init=False)
    used: int = field(default=0, init=False)
    refused: int = field(default=0, init=False)

    def take(self, kind: str, now: float) -> int | None:
        """None if the request may pass, else the Retry-After seconds to answer with."""
        if kind in self.exclude:
            return None
        if self.window_start is None or now - self.window_start >= self.window_s:
            self.window_start, self.used = now, 0
        if self.used < self.requests:
            self.used += 1
            return None
        self.refused += 1
        return max(1, math.ceil(self.window_start + self.window_s - now))


@dataclass
class RequestRecord:
    """One request, recorded on arrival; `status` is set just before the response is sent, so a
    client always sees its own request counted (0 if no response was sent)."""

    method: str
    path: str
    kind: str
    status: int = 0
    authorization: str = ""  # the Authorization header as sent (tokens reach the Hub only)


# --- git access ---------------------------------------------------------------------------------


class NotFound(Exception):
    """An error response: status, X-Error-Code, message, extra headers."""

    def __init__(
        self, status: int, code: str | None, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class Entry:
    """One path of a commit's tree, with what the Hub reports about it."""

    path: str
    type: Literal["file", "directory"]
    oid: str  # git blob or tree id (sha1)
    size: int  # real size (LFS: the object's size)
    lfs_oid: str | None = None  # sha256 for LFS files
    pointer_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == "directory":
            return {"type": "directory", "oid": self.oid, "size": 0, "path": self.path}
        out: dict[str, Any] = {
            "type": "file",
            "oid": self.oid,
            "size": self.size,
            "path": self.path,
        }
        if self.lfs_oid is not None:
            out["lfs"] = {"oid": self.lfs_oid, "size": self.size, "pointerSize": self.pointer_size}
        return out


_GIT_ENV = {
    **{k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_INDEX_FILE")},
    "LC_ALL": "C",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


def _git(git_dir: Path, *args: str) -> bytes:
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", "--git-dir", str(git_dir), *args],
        capture_output=True,
        check=False,
        env=_GIT_ENV,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout


class GitBackend:
    """Read access to one repository: refs (fresh on every call), and per-commit data (cached,
    commits being immutable) through one long-lived `git cat-file --batch` process."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = git_dir
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._trees: dict[str, dict[str, Entry]] = {}
        self._dates: dict[str, int] = {}

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                with contextlib.suppress(OSError):
                    assert self._proc.stdin is not None
                    self._proc.stdin.close()
                self._proc.kill()
                self._proc.wait()
                self._proc = None

    # -- objects

    def _batch(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [
                    "git",
                    "-c",
                    "safe.directory=*",
                    "--git-dir",
                    str(self.git_dir),
                    "cat-file",
                    "--batch",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=_GIT_ENV,
            )
        return self._proc

    def read_object(self, name: str) -> tuple[str, bytes] | None:
        """(type, content) of object `name` (a full hex id), or None if missing. A miss is asked
        again of a fresh process, in case the repo was replaced under the running one."""
        with self._lock:
            for attempt in range(2):
                proc = self._batch()
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(name.encode() + b"\n")
                proc.stdin.flush()
                header = proc.stdout.readline().split()
                if len(header) == 3:
                    data = proc.stdout.read(int(header[2]))
                    proc.stdout.read(1)
                    return header[1].decode(), data
                if attempt == 0:
                    proc.kill()
                    proc.wait()
            return None

    # -- refs

    def refs(self) -> dict[str, str]:
        """refname -> commit id, for branches, tags (peeled), converts and PRs."""
        out = _git(
            self.git_dir,
            "for-each-ref",
            "--format=%(refname)%00%(objectname)%00%(objecttype)%00%(*objectname)%00%(*objecttype)",
            "refs/heads",
            "refs/tags",
            "refs/convert",
            "refs/pr",
        )
        refs: dict[str, str] = {}
        for line in out.decode().splitlines():
            name, oid, otype, peeled, ptype = line.split("\0")
            if peeled:
                oid, otype = peeled, ptype
            if otype == "commit":
                refs[name] = oid
        return refs

    def default_ref(self) -> str:
        head = (self.git_dir / "HEAD").read_text().strip()
        return head[len("ref: ") :] if head.startswith("ref: ") else head

    def resolve(self, rev: str) -> str | None:
        """Commit id for a branch, tag, full ref name or 40-hex commit id; None if unknown."""
        if HEX40.fullmatch(rev):
            obj = self.read_object(rev)
            return rev if obj is not None and obj[0] == "commit" else None
        refs = self.refs()
        candidates = [rev] if rev.startswith("refs/") else [f"refs/heads/{rev}", f"refs/tags/{rev}"]
        for cand in candidates:
            if cand in refs:
                return refs[cand]
        return None

    def commit_epoch(self, commit: str) -> int:
        if commit not in self._dates:
            obj = self.read_object(commit)
            assert obj is not None
            for line in obj[1].split(b"\n"):
                if line.startswith(b"committer "):
                    self._dates[commit] = int(line.rsplit(b" ", 2)[1])
                    break
                if not line:
                    break
        return self._dates.get(commit, 0)

    def tree(self, commit: str) -> dict[str, Entry]:
        """Every path of `commit` (directories included) in git's order, LFS pointers parsed."""
        cached = self._trees.get(commit)
        if cached is not None:
            return cached
        out = _git(self.git_dir, "ls-tree", "-r", "-t", "-l", "-z", commit)
        entries: dict[str, Entry] = {}
        for rec in out.split(b"\0"):
            if not rec:
                continue
            meta, _, raw_path = rec.partition(b"\t")
            _mode, otype, oid, size = meta.decode().split()
            path = raw_path.decode()
            if otype == "tree":
                entries[path] = Entry(path=path, type="directory", oid=oid, size=0)
            elif otype == "blob":
                entries[path] = self._blob_entry(path, oid, int(size))
        self._trees[commit] = entries
        return entries

    def _blob_entry(self, path: str, oid: str, size: int) -> Entry:
        if size <= LFS_POINTER_MAX:
            obj = self.read_object(oid)
            m = LFS_POINTER.fullmatch(obj[1]) if obj is not None else None
            if m is not None:
                return Entry(
                    path=path,
                    type="file",
                    oid=oid,
                    size=int(m.group(2)),
                    lfs_oid=m.group(1).decode(),
                    pointer_size=size,
                )
        return Entry(path=path, type="file", oid=oid, size=size)

    def lfs_object_path(self, oid: str) -> Path:
        return self.git_dir / "lfs" / "objects" / oid[:2] / oid[2:4] / oid

    def last_commit(self, commit: str, path: str) -> dict[str, str]:
        out = _git(self.git_dir, "log", "-1", "--format=%H%x00%ct%x00%s", commit, "--", path)
        sha, ts, title = out.decode().strip().split("\0", 2)
        return {"id": sha, "title": title, "date": hub_date(int(ts))}


def find_git_dir(repo_dir: Path) -> Path | None:
    """The git directory of a non-bare (`repo/.git`) or bare (`repo/` itself) repository."""
    if (repo_dir / ".git").is_dir():
        return repo_dir / ".git"
    if (repo_dir / "HEAD").is_file() and (repo_dir / "objects").is_dir():
        return repo_dir
    return None


# --- the server -----------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    hub: HubServer


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
    ) -> None:
        self.root = Path(root)
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
        self._httpd: _Server | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self.start_seconds: float | None = None

    # -- lifecycle

    def start(self) -> HubServer:
        t0 = time.perf_counter()
        httpd = _Server((self.host, self.requested_port), _Handler)
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


# --- request handling -----------------------------------------------------------------------------


def _param(params: Mapping[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[0] if values else None


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "kerneld-testhub/1"
    server: _Server

    # quiet
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.hub._lock:
            self.server.hub._conns.add(self.connection)

    def finish(self) -> None:
        with self.server.hub._lock:
            self.server.hub._conns.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # -- dispatch

    def _dispatch(self, method: str) -> None:
        hub = self.server.hub
        split = urlsplit(self.path)
        raw_path, query = split.path, parse_qs(split.query)
        body = b""
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            body = self.rfile.read(length)
        self._record = RequestRecord(
            method,
            raw_path,
            _kind(method, raw_path),
            authorization=self.headers.get("Authorization", ""),
        )
        hub._record(self._record)
        self._fault: Fault | None = None
        try:
            delay, fault = hub._take_faults(method, raw_path, self._record.kind)
            if delay > 0:
                time.sleep(delay)
            self._fault = fault
            if fault is not None and fault.kind == "error":
                raise NotFound(fault.status, None, "injected fault")
            if fault is not None and fault.kind == "rate_limit":
                raise NotFound(
                    429, None, "injected rate limit", {"Retry-After": str(fault.retry_after)}
                )
            self._route(method, raw_path, query, body)
        except NotFound as err:
            self._send_error(err, method)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a server bug: report it to the client and to the test
            hub.errors.append(f"{method} {self.path}: {exc!r}")
            with contextlib.suppress(OSError):
                self._send_error(NotFound(500, None, f"server error: {exc!r}"), method)

    def _route(self, method: str, raw_path: str, query: dict[str, list[str]], body: bytes) -> None:
        parts = raw_path.split("/")
        # parts[0] == "" since paths start with "/"
        if method == "GET" and raw_path == "/api/agent-harnesses":
            raise NotFound(404, None, "Not Found")
        if parts[1:3] == ["api", "organizations"] and len(parts) == 5 and parts[4] == "overview":
            if method not in ("GET", "HEAD"):
                raise NotFound(405, None, "Method Not Allowed")
            self._org_overview(unquote(parts[3]))
            return
        if parts[1:3] == ["api", "kernels"] and len(parts) >= 5:
            org, name = unquote(parts[3]), unquote(parts[4])
            rest = parts[5:]
            # HEAD as GET without the body, as the real Hub answers it (olah probes repos so).
            get = method in ("GET", "HEAD")
            if not rest and get:
                self._info(org, name, None)
                return
            if rest == ["refs"] and get:
                self._refs(org, name, query)
                return
            if rest and rest[0] == "revision" and len(rest) >= 2 and get:
                self._info(org, name, unquote("/".join(rest[1:])))
                return
            if rest and rest[0] == "tree" and len(rest) >= 2 and get:
                path = unquote("/".join(rest[2:]))
                self._tree(org, name, unquote(rest[1]), path, query, raw_path)
                return
            if rest and rest[0] == "paths-info" and len(rest) >= 2 and method == "POST":
                self._paths_info(org, name, unquote("/".join(rest[1:])), body)
                return
        if parts[1:2] == ["kernels"] and len(parts) >= 7 and parts[4] == "resolve":
            if method not in ("GET", "HEAD"):
                raise NotFound(405, None, "Method Not Allowed")
            org, name = unquote(parts[2]), unquote(parts[3])
            self._resolve(method, org, name, unquote(parts[5]), unquote("/".join(parts[6:])))
            return
        raise NotFound(404, None, "Not Found")

    # -- routes

    def _org_overview(self, org: str) -> None:
        hub = self.server.hub
        with hub._lock:
            trusted = hub.trusted_orgs.get(org)
        if trusted is None:
            if not hub.org_exists(org):
                raise NotFound(404, None, "Organization not found")
            trusted = False
        self._send_json(
            {
                "name": org,
                "fullname": org,
                "isVerified": False,
                "numModels": 0,
                "numKernels": 0,
                "trustedKernelPublisher": trusted,
            }
        )

    def _refs(self, org: str, name: str, query: dict[str, list[str]]) -> None:
        backend = self.server.hub.backend(org, name)
        groups = {
            "refs/heads/": "branches",
            "refs/tags/": "tags",
            "refs/convert/": "converts",
            "refs/pr/": "pullRequests",
        }
        out: dict[str, list[dict[str, str]]] = {"branches": [], "tags": [], "converts": []}
        include_prs = _flag(_param(query, "include_prs"))
        if include_prs:
            out["pullRequests"] = []
        for ref, commit in sorted(backend.refs().items()):
            for prefix, group in groups.items():
                if ref.startswith(prefix) and group in out:
                    item = {"name": ref[len(prefix) :], "ref": ref, "targetCommit": commit}
                    out[group].append(item)
        self._send_json(out)

    def _commit_or_404(self, backend: GitBackend, rev: str) -> str:
        commit = backend.resolve(rev)
        if commit is None:
            raise NotFound(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return commit

    def _check_gated(self, org: str, name: str) -> None:
        if f"{org}/{name}" in self.server.hub.gated:
            raise NotFound(401, "GatedRepo", "Access to this repository is restricted.")

    def _info(self, org: str, name: str, rev: str | None) -> None:
        backend = self.server.hub.backend(org, name)
        commit = self._commit_or_404(backend, rev if rev is not None else backend.default_ref())
        tree = backend.tree(commit)
        epoch = backend.commit_epoch(commit)
        repo_id = f"{org}/{name}"
        self._send_json(
            {
                "_id": commit[:24],
                "id": repo_id,
                "author": org,
                "sha": commit,
                "lastModified": hub_date(epoch),
                "createdAt": hub_date(epoch),
                "private": False,
                "gated": "auto" if repo_id in self.server.hub.gated else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": [{"rfilename": p} for p, e in tree.items() if e.type == "file"],
            }
        )

    def _entry_json(
        self, backend: GitBackend, commit: str, entry: Entry, expand: bool
    ) -> dict[str, Any]:
        out = entry.to_json()
        if expand:
            out["lastCommit"] = backend.last_commit(commit, entry.path)
            if entry.type == "file":
                out["securityFileStatus"] = {
                    "status": "safe",
                    "avScan": {"virusFound": False, "virusNames": None},
                    "pickleImportScan": None,
                }
        return out

    def _tree(
        self,
        org: str,
        name: str,
        rev: str,
        path: str,
        query: dict[str, list[str]],
        raw_path: str,
    ) -> None:
        hub = self.server.hub
        backend = hub.backend(org, name)
        self._check_gated(org, name)
        commit = self._commit_or_404(backend, rev)
        tree = backend.tree(commit)
        path = path.strip("/")
        if path and (path not in tree or tree[path].type != "directory"):
            raise NotFound(
                404, "EntryNotFound", f"{path} does not exist on {rev}", {"X-Repo-Commit": commit}
            )
        recursive = _flag(_param(query, "recursive"))
        expand = _flag(_param(query, "expand"))
        prefix = f"{path}/" if path else ""
        selected = [
            e
            for p, e in tree.items()
            if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])
        ]
        cursor = int(_param(query, "cursor") or 0)
        size = hub.expand_page_size if expand else hub.page_size
        page = selected[cursor : cursor + size]
        headers: dict[str, str] = {"X-Repo-Commit": commit}
        if cursor + size < len(selected):
            params = {
                "recursive": str(recursive).lower(),
                "expand": str(expand).lower(),
                "cursor": str(cursor + size),
            }
            host = self.headers.get("Host") or f"{hub.host}:{hub.port}"
            headers["Link"] = f'<http://{host}{raw_path}?{urlencode(params)}>; rel="next"'
        self._send_json([self._entry_json(backend, commit, e, expand) for e in page], headers)

    def _paths_info(self, org: str, name: str, rev: str, body: bytes) -> None:
        backend = self.server.hub.backend(org, name)
        self._check_gated(org, name)
        commit = self._commit_or_404(backend, rev)
        form = parse_qs(body.decode(), keep_blank_values=True)
        expand = _flag(_param(form, "expand"))
        tree = backend.tree(commit)
        out = []
        for path in form.get("paths", []):
            entry = tree.get(path.strip("/"))
            if entry is not None:
                out.append(self._entry_json(backend, commit, entry, expand))
        self._send_json(out, {"X-Repo-Commit": commit})

    def _resolve(self, method: str, org: str, name: str, rev: str, path: str) -> None:
        backend = self.server.hub.backend(org, name)
        self._check_gated(org, name)
        commit = self._commit_or_404(backend, rev)
        entry = backend.tree(commit).get(path)
        if entry is None or entry.type != "file":
            raise NotFound(
                404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": commit}
            )
        headers = {
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}",
        }
        if entry.lfs_oid is not None:
            headers["ETag"] = f'"{entry.lfs_oid}"'
            headers["X-Linked-Etag"] = f'"{entry.lfs_oid}"'
            headers["X-Linked-Size"] = str(entry.size)
            cdn = self.server.hub.cdn
            if cdn is not None:  # the real Hub: a redirect to a signed URL on another origin
                location = cdn.url(entry.lfs_oid, backend.lfs_object_path(entry.lfs_oid))
                headers.update({"Location": location, "Content-Length": "0"})
                self._send(302, b"", headers, head=True)
                return
        else:
            headers["ETag"] = f'"{entry.oid}"'
        start, end = 0, entry.size  # [start, end)
        status = 200
        rng = self.headers.get("Range")
        if rng is not None:
            parsed = _parse_range(rng, entry.size)
            if parsed == "unsatisfiable":
                raise NotFound(
                    416, None, "Range Not Satisfiable", {"Content-Range": f"bytes */{entry.size}"}
                )
            if parsed is not None:
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
        if method == "HEAD":
            headers["Content-Length"] = str(end - start)
            self._send(status, b"", headers, head=True)
            return
        data = self._content(backend, entry)
        self._send(status, data[start:end], headers)

    def _content(self, backend: GitBackend, entry: Entry) -> bytes:
        if entry.lfs_oid is not None:
            obj_path = backend.lfs_object_path(entry.lfs_oid)
            if not obj_path.is_file():
                raise NotFound(500, None, f"LFS object {entry.lfs_oid} missing on the server")
            return obj_path.read_bytes()
        obj = backend.read_object(entry.oid)
        if obj is None:
            raise NotFound(500, None, f"blob {entry.oid} missing on the server")
        return obj[1]

    # -- responses

    def _send_json(self, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._send(
            200, data, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
        )

    def _send_error(self, err: NotFound, method: str) -> None:
        headers = {"Content-Type": "application/json; charset=utf-8", **err.headers}
        if err.code is not None:
            headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message.encode("ascii", "replace").decode()
        data = json.dumps({"error": err.message}).encode()
        self._send(err.status, data, headers, head=method == "HEAD")

    def _send(
        self, status: int, body: bytes, headers: Mapping[str, str], *, head: bool = False
    ) -> None:
        self._record.status = status
        head = head or self.command == "HEAD"  # a HEAD gets the GET's headers, no body
        fault = self._fault if not head and body else None
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if not head or "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if fault is None or fault.kind not in BODY_FAULTS:
            self._write_body(body)
            return
        if fault.kind == "corrupt":
            pos = fault.corrupt_offset if fault.corrupt_offset is not None else len(body) // 2
            pos = min(max(pos, 0), len(body) - 1)
            flipped = bytearray(body)
            flipped[pos] ^= 0xFF
            self._write_body(bytes(flipped))
            return
        self._write_body(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True
        if fault.kind == "reset":  # RST instead of FIN: SO_LINGER with a zero timeout
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_WR)

    def _write_body(self, data: bytes) -> None:
        # Counted before the write: once a client has the bytes, the count must already hold
        # them (a test that reads the counters, or resets them for the next test, right after
        # its last response would otherwise race this thread).
        self.server.hub._count_bytes(self._record.kind, len(data))
        self.wfile.write(data)


def _kind(method: str, raw_path: str) -> str:
    parts = raw_path.split("/")
    if raw_path == "/api/agent-harnesses":
        return "agent_harnesses"
    if parts[1:3] == ["api", "organizations"]:
        return "org_overview"
    if parts[1:3] == ["api", "kernels"] and len(parts) >= 5:
        rest = parts[5:]
        if not rest or rest[0] == "revision":
            return "info"
        if rest[0] in ("refs", "tree"):
            return rest[0]
        if rest[0] == "paths-info":
            return "paths_info"
    if parts[1:2] == ["kernels"] and len(parts) >= 7 and parts[4] == "resolve":
        return "resolve_head" if method == "HEAD" else "resolve_get"
    return "other"


def _parse_range(header: str, size: int) -> tuple[int, int] | Literal["unsatisfiable"] | None:
    """[start, end) for a single `bytes=` range; None to ignore the header (serve it all)."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if not first:  # suffix range: the last N bytes
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return max(size - n, 0), size
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, end


def main(argv: list[str] | None = None) -> int:
    """Serve ROOT until interrupted; prints the URL on the first line."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.hubserver", description=__doc__)
    parser.add_argument("root", type=Path, help="directory holding kernels/<org>/<name> git repos")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--trust", action="append", default=[], metavar="ORG")
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    args = parser.parse_args(argv)
    server = HubServer(
        args.root,
        host=args.host,
        port=args.port,
        trusted_orgs={org: True for org in args.trust},
        page_size=args.page_size,
        latency_s=args.latency_ms / 1000,
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
