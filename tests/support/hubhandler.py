"""The test Hub's request handling: routing the Hub's URLs to answers from git, error responses
as the Hub sends them (status, X-Error-Code, X-Error-Message), ranges, and the body faults
(reset, truncate, corrupt) applied as the body goes out.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from tests.support.hubgit import Entry, GitBackend, hub_date
from tests.support.hubtraffic import BODY_FAULTS, Fault, RequestRecord, request_kind

if TYPE_CHECKING:
    from tests.support.hubserver import HubServer


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


class HubHTTPServer(ThreadingHTTPServer):
    """The listening server; `hub` is the HubServer whose state the handlers read and count in."""

    daemon_threads = True
    request_queue_size = 128
    hub: HubServer


def _param(params: Mapping[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[0] if values else None


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


class HubHandler(BaseHTTPRequestHandler):
    """One request: recorded, delayed or failed by the faults that match it, routed, answered."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "kerneld-testhub/1"
    server: HubHTTPServer

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
            request_kind(method, raw_path),
            authorization=self.headers.get("Authorization", ""),
            user_agent=self.headers.get("User-Agent", ""),
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
            self._org_overview(self.server.hub.canonical_org(unquote(parts[3])))
            return
        if parts[1:3] == ["api", "kernels"] and len(parts) >= 5:
            org, name = self.server.hub.canonical(unquote(parts[3]), unquote(parts[4]))
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
            org, name = self.server.hub.canonical(unquote(parts[2]), unquote(parts[3]))
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
