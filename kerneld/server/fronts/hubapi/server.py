"""The Hub's HTTP API, read-only, for kernel repositories: what `huggingface_hub` (and so every
`kernels` release) asks when `HF_ENDPOINT` points here.

Routes: the Hub's own for `repo_type="kernel"`, one table (`ROUTES`: method, path, handler,
metrics label) that both dispatch and the metrics label use, and that docs/hub-api.md's route
table lists row for row (tests/hubapi/test_routes.py). Anything else gets the Hub's 404 or 405.
Errors carry the Hub's `X-Error-Code` where the Hub has one (RepoNotFound, RevisionNotFound,
EntryNotFound), so `huggingface_hub` raises the same exception types; the daemon's own refusals
(a denied kernel, an untrusted publisher, a fetch the policy forbids) are 403s whose message
says what to do. Every connection is checked against the user socket's permissions when it is
accepted, before a byte of it is read (`peers.py`, `kerneld/server/fronts/httpfront/httpd.py`): a
refused one gets a 403 that says why, and is closed.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from kerneld.config import SocketConfig
from kerneld.errors import ErrorKind
from kerneld.pipeline.publisher_trust import PublisherUnknown
from kerneld.server.fronts.httpfront.httpexchange import Exchange
from kerneld.server.fronts.httpfront.httplisteners import HttpListeners
from kerneld.server.fronts.hubapi.view import HubFile, HubHost, HubView, git_blob_id
from kerneld.server.plumbing.activation import Inherited
from kerneld.server.plumbing.identity import Caller
from kerneld.server.plumbing.peers import admit, identify_peer
from kerneld.server.statuses import STATUSES, classify
from kerneld.upstream.base import check_repo_id
from kerneld_client.proto import kerneld_pb2 as pb

log = logging.getLogger("kerneld.hubapi")
Code = pb.ErrorCode

#: The Hub's X-Error-Code for the daemon's error codes it has a name for (the HTTP status is
#: the kind's, from the one table in `statuses`).
_HUB_CODES: dict[int, str] = {
    Code.KERNEL_NOT_FOUND: "RepoNotFound",
    Code.REVISION_NOT_FOUND: "RevisionNotFound",
}
COPY_CHUNK = 1 << 20
_TRUE = {"1", "true", "True"}


class HubError(Exception):
    """An answer in the Hub's error shape. Its HTTP status is its kind's (`STATUSES`), or
    `status` where HTTP says more than a kind does (405: the method, 416: the range); the
    keywords are its headers."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        code: str | None = None,
        status: int | None = None,
        /,
        **headers: str,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = STATUSES[kind].http if status is None else status
        self.message = message
        self.code = code
        self.headers = headers


def _flag(query: Mapping[str, list[str]], name: str) -> bool:
    return any(v in _TRUE for v in query.get(name, ()))


def _repo(org: str, name: str) -> str:
    try:
        return check_repo_id(f"{org}/{name}")
    except ValueError as exc:
        raise HubError(ErrorKind.INVALID, str(exc)) from None


def _entry(file: HubFile) -> dict[str, Any]:
    """A tree listing entry, as the Hub writes it."""
    out: dict[str, Any] = {"type": "file", "oid": file.oid, "size": file.size, "path": file.path}
    if file.sha256 is not None:
        out["lfs"] = {"oid": file.sha256, "size": file.size, "pointerSize": file.pointer_size}
    return out


def _folder(path: str, files: list[HubFile]) -> dict[str, Any]:
    """A folder entry. Its `oid` is a digest of what the folder holds, not git's tree id
    (which needs every file's mode; no client of kernels reads it)."""
    listing = "".join(f"{f.path}\0{f.oid}\n" for f in files if f.path.startswith(path + "/"))
    return {"type": "directory", "oid": git_blob_id(listing.encode()), "size": 0, "path": path}


def _listing(files: list[HubFile], path: str, recursive: bool) -> list[dict[str, Any]]:
    """The entries under `path` ('' for the root): files and folders, as `list_repo_tree`."""
    prefix = f"{path}/" if path else ""
    under = [f for f in files if f.path.startswith(prefix)]
    if path and not under:
        raise HubError(ErrorKind.NOT_FOUND, f"{path} does not exist", "EntryNotFound")
    folders: dict[str, None] = {}
    out: list[dict[str, Any]] = []
    for f in under:
        rest = f.path[len(prefix) :].split("/")
        depth = len(rest) if recursive else 1
        for i in range(1, min(depth, len(rest) - 1) + 1):
            folders.setdefault(prefix + "/".join(rest[:i]), None)
        if recursive or len(rest) == 1:
            out.append(_entry(f))
    entries = [_folder(p, under) for p in folders] + out
    return sorted(entries, key=lambda e: str(e["path"]))


class HubApiEndpoint:
    """The endpoint's handler for the HTTP front
    (`kerneld.server.fronts.httpfront.httpexchange.HttpHandler`): each request is answered by its
    own `HubApiHandler`. Methods the Hub API does not know get the front's 501; PUT, DELETE, PATCH
    and OPTIONS the Hub's 405."""

    methods = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})

    def __init__(self, view: HubView) -> None:
        self.view = view

    def __call__(self, exchange: Exchange) -> None:
        HubApiHandler(self.view, exchange).dispatch()


class HubApiHandler:
    """One request."""

    def __init__(self, view: HubView, exchange: Exchange) -> None:
        self.view = view
        self.exchange = exchange
        #: Identified and admitted at accept, before a byte of the connection was read.
        self.caller = exchange.caller
        # (metrics route label, counted yet) of the request being answered
        self._counted: tuple[str, bool] = ("", True)

    # -- dispatch -------------------------------------------------------------------------------

    def dispatch(self) -> None:
        ex = self.exchange
        method = ex.method if ex.method in ("GET", "HEAD", "POST") else "OTHER"
        split = urlsplit(ex.target)
        parts = split.path.split("/")
        self._counted = (route_label(split.path), False)
        status = 500
        try:
            status = self._route(method, split.path, parse_qs(split.query), ex.body)
        except HubError as err:
            status = err.status
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            ex.close = True
        except Exception as exc:  # every failure becomes an answer in the Hub's shape
            answer = _hub_error(exc, parts)
            status = answer.status
            self._send_error(answer)
        self._count(status)  # a request that got no answer (the peer went away)
        log.debug("hub api %s %s %s: %d", ex.peer, ex.method, ex.target, status)

    def _count(self, status: int) -> None:
        """Count the request once, before its answer goes out: a client that reads the metrics
        right after its answer sees it counted."""
        route, done = self._counted
        if not done:
            self._counted = (route, True)
            self.view.core.metrics.hub_api_requests.labels(route, str(status)).inc()

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> int:
        """Answer by the route `ROUTES` gives the method and path; else the Hub's 404 or 405."""
        for route in ROUTES:
            if method in route.methods and (match := route.pattern.fullmatch(path)):
                params = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                asked = _Asked(method, params, query, body, self.caller)
                return route.handler(self, asked)
        parts = path.split("/")
        if parts[1:3] in (["api", "models"], ["api", "datasets"], ["api", "spaces"]):
            raise HubError(
                ErrorKind.NOT_FOUND,
                "kerneld serves kernel repositories only (repo_type='kernel')",
                "RepoNotFound",
            )
        if method not in READ:
            raise HubError(
                ErrorKind.INVALID, "Method Not Allowed: this endpoint is read-only", None, 405
            )
        raise HubError(ErrorKind.NOT_FOUND, "Not Found")

    # -- what the routes ask for --------------------------------------------------------------

    def _route_info(self, a: _Asked) -> int:
        repo_id = _repo(a.params["org"], a.params["name"])
        return self._info(repo_id, a.params.get("rev", "main"), a.query, a.caller)

    def _route_refs(self, a: _Asked) -> int:
        return self._refs(_repo(a.params["org"], a.params["name"]), a.caller)

    def _route_tree(self, a: _Asked) -> int:
        repo_id = _repo(a.params["org"], a.params["name"])
        path = a.params.get("path", "").strip("/")
        return self._tree(repo_id, a.params["rev"], path, a.query, a.caller)

    def _route_paths_info(self, a: _Asked) -> int:
        repo_id = _repo(a.params["org"], a.params["name"])
        return self._paths_info(repo_id, a.params["rev"], a.body, a.caller)

    def _route_file(self, a: _Asked) -> int:
        repo_id = _repo(a.params["org"], a.params["name"])
        return self._file(a.method, repo_id, a.params["rev"], a.params["path"], a.caller)

    def _route_overview(self, a: _Asked) -> int:
        return self._overview(a.params["org"], a.caller)

    # -- routes ---------------------------------------------------------------------------------

    def _info(
        self, repo_id: str, revision: str, query: dict[str, list[str]], caller: Caller
    ) -> int:
        view = self.view
        commit = view.commit(repo_id, revision, caller)
        files = view.files(repo_id, commit, caller)
        blobs = _flag(query, "blobs")
        siblings: list[dict[str, Any]] = []
        for f in files:
            sib: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sib.update({"size": f.size, "blobId": f.oid})
                if f.sha256 is not None:
                    sib["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            siblings.append(sib)
        org = repo_id.split("/", 1)[0]
        return self._send_json(
            {
                "_id": commit[:24],
                "id": repo_id,
                "author": org,
                "sha": commit,
                "private": False,
                "gated": False,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
            },
            {"X-Repo-Commit": commit},
        )

    def _overview(self, org: str, caller: Caller) -> int:
        """An organisation as `kernels` asks about it: `trustedKernelPublisher` is this host's
        `[trust]` verdict for the whole organisation (the Hub's answer, or an `org/*` allow).
        An organisation the Hub does not know is a 404, as on the Hub: `kernels` then says it
        "could not verify publisher trust status", not that the publisher is untrusted."""
        _repo(org, "x")  # the same grammar as a repo's org
        try:
            trusted = self.view.org_trusted(org, caller)
        except PublisherUnknown as exc:
            raise HubError(ErrorKind.NOT_FOUND, f"kerneld: {exc.message}", "RepoNotFound") from None
        return self._send_json(
            {
                "name": org,
                "fullname": org,
                "isVerified": False,
                "numModels": 0,
                "numKernels": 0,
                "trustedKernelPublisher": trusted,
            }
        )

    def _refs(self, repo_id: str, caller: Caller) -> int:
        self.view.check(repo_id, "main")
        refs = self.view.refs(repo_id, caller)
        return self._send_json(
            {
                "branches": [
                    {"name": n, "ref": f"refs/heads/{n}", "targetCommit": c}
                    for n, c in sorted(refs.branches.items())
                ],
                "tags": [
                    {"name": n, "ref": f"refs/tags/{n}", "targetCommit": c}
                    for n, c in sorted(refs.tags.items())
                ],
                "converts": [],
            }
        )

    def _tree(
        self,
        repo_id: str,
        revision: str,
        path: str,
        query: dict[str, list[str]],
        caller: Caller,
    ) -> int:
        commit = self.view.commit(repo_id, revision, caller)
        files = self.view.files(repo_id, commit, caller)
        try:
            entries = _listing(files, path, _flag(query, "recursive"))
        except HubError as err:
            err.message = f"{path} does not exist on {revision}"
            err.headers["X-Repo-Commit"] = commit
            raise
        return self._send_json(entries, {"X-Repo-Commit": commit})

    def _paths_info(self, repo_id: str, revision: str, body: bytes, caller: Caller) -> int:
        commit = self.view.commit(repo_id, revision, caller)
        files = self.view.files(repo_id, commit, caller)
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        if not form and body.strip().startswith(b"{"):
            try:
                doc = json.loads(body)
            except ValueError:
                raise HubError(
                    ErrorKind.INVALID, "paths-info: the body is neither a form nor JSON"
                ) from None
            paths = doc.get("paths", []) if isinstance(doc, dict) else []
        else:
            paths = form.get("paths", [])
        by_path = {f.path: f for f in files}
        out: list[dict[str, Any]] = []
        for raw in paths if isinstance(paths, list) else []:
            p = str(raw).strip("/")
            if p in by_path:
                out.append(_entry(by_path[p]))
            elif any(f.path.startswith(p + "/") for f in files):
                out.append(_folder(p, files))
        return self._send_json(out, {"X-Repo-Commit": commit})

    def _file(self, method: str, repo_id: str, revision: str, path: str, caller: Caller) -> int:
        view = self.view
        commit = view.commit(repo_id, revision, caller)
        missing = HubError(
            ErrorKind.NOT_FOUND,
            f"Entry not found: {path}",
            "EntryNotFound",
            **{"X-Repo-Commit": commit},
        )
        if not path.startswith("build/"):
            raise missing  # kerneld keeps only the build tree of a kernel repository
        file = next((f for f in view.files(repo_id, commit, caller) if f.path == path), None)
        if file is None:
            raise missing
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{file.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}",
        }
        if file.sha256 is not None:
            headers["X-Linked-Etag"] = f'"{file.sha256}"'
            headers["X-Linked-Size"] = str(file.size)
        start, end, status = 0, file.size, 200
        rng = self.exchange.header("Range")
        if rng is not None:
            parsed = parse_range(rng, file.size)
            if parsed is None:
                raise HubError(
                    ErrorKind.INVALID,
                    "Range Not Satisfiable",
                    None,
                    416,
                    **{"Content-Range": f"bytes */{file.size}"},
                )
            if parsed != "all":
                start, end = parsed
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{file.size}"
        headers["Content-Length"] = str(end - start)
        if method == "HEAD":
            if view.requires_signatures():  # answer what the GET would: the bytes' own gate
                with view.open(repo_id, commit, file, caller):
                    pass
            self._send_head(status, headers)
            return status
        with view.open(repo_id, commit, file, caller) as fh:
            self._send_head(status, headers)
            fh.seek(start)
            remaining = end - start
            while remaining > 0:
                chunk = fh.read(min(COPY_CHUNK, remaining))
                if not chunk:
                    break  # the store verified the size: only a failing disk gets here
                self.exchange.write(chunk)
                remaining -= len(chunk)
            if remaining:
                self.exchange.close = True
        return status

    # -- answers --------------------------------------------------------------------------------

    def _send_head(self, status: int, headers: Mapping[str, str]) -> None:
        self._count(status)
        self.exchange.start(status, headers)

    def _send_json(self, payload: Any, headers: Mapping[str, str] | None = None) -> int:
        data = json.dumps(payload, separators=(",", ":")).encode()
        self._send_head(
            200,
            {
                "Content-Type": "application/json; charset=utf-8",
                "Content-Length": str(len(data)),
                **(headers or {}),
            },
        )
        self.exchange.write(data)  # (nothing for a HEAD)
        return 200

    def _send_error(self, err: HubError) -> None:
        data = json.dumps({"error": err.message}).encode()
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "Content-Length": str(len(data)),
            "X-Error-Message": err.message.encode("ascii", "replace").decode().replace("\n", " "),
            **err.headers,
        }
        if err.code is not None:
            headers["X-Error-Code"] = err.code
        if err.status == 503:
            headers.setdefault("Retry-After", "5")
        try:
            self._send_head(err.status, headers)
            self.exchange.write(data)
        except OSError:
            self.exchange.close = True


READ = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class _Asked:
    """What a route's handler gets: the method, the path's parameters (percent-decoded), the
    query, the body, the caller named at accept."""

    method: str
    params: dict[str, str]
    query: dict[str, list[str]]
    body: bytes
    caller: Caller


def _path_pattern(path: str) -> re.Pattern[str]:
    """A route's path as docs/hub-api.md writes it, as a regular expression: `{name}` is one
    segment, except the last parameter, which takes the rest of the path (a revision or a file
    path may hold slashes); `[...]` is optional."""
    last = re.findall(r"\{(\w+)\}", path)[-1]
    out = ""
    for piece in re.split(r"(\{\w+\}|\[|\])", path):
        if piece == "[":
            out += "(?:"
        elif piece == "]":
            out += ")?"
        elif piece.startswith("{"):
            name = piece[1:-1]
            out += f"(?P<{name}>{'.*' if name == last else '[^/]*'})"
        else:
            out += re.escape(piece)
    return re.compile(out)


@dataclass(frozen=True)
class Route:
    """One route of the endpoint: the methods it answers, its path (`_path_pattern`), the
    `HubApiHandler` method that answers it, and its label in `kerneld_hub_api_requests`."""

    methods: frozenset[str]
    path: str
    handler: Callable[[HubApiHandler, _Asked], int]
    label: str
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", _path_pattern(self.path))


#: Every route of the endpoint (docs/hub-api.md, "What it serves", lists the same rows).
ROUTES: tuple[Route, ...] = (
    Route(READ, "/api/kernels/{org}/{name}[/revision/{rev}]", HubApiHandler._route_info, "info"),
    Route(READ, "/api/kernels/{org}/{name}/refs", HubApiHandler._route_refs, "refs"),
    Route(READ, "/api/kernels/{org}/{name}/tree/{rev}[/{path}]", HubApiHandler._route_tree, "tree"),
    Route(
        frozenset({"POST"}),
        "/api/kernels/{org}/{name}/paths-info/{rev}",
        HubApiHandler._route_paths_info,
        "paths_info",
    ),
    Route(READ, "/kernels/{org}/{name}/resolve/{rev}/{path}", HubApiHandler._route_file, "file"),
    Route(READ, "/api/organizations/{org}/overview", HubApiHandler._route_overview, "org_overview"),
)
#: The label of a request no route's path matches.
OTHER = "other"


def route_label(path: str) -> str:
    """The metrics label of a request path: its route's, whatever the method (a POST to a
    file's path is counted as `file`, and answered 405)."""
    for route in ROUTES:
        if route.pattern.fullmatch(path):
            return route.label
    return OTHER


def _hub_error(exc: BaseException, parts: list[str]) -> HubError:
    """The Hub answer for a failure: the daemon's one classification (`classify`), as HTTP."""
    failure = classify(exc)
    detail = failure.detail
    message = f"kerneld: {detail.message}"
    if failure.kind is ErrorKind.RATE_LIMITED:  # the Hub's own "too many requests": 429
        wait = str(max(1, math.ceil(getattr(exc, "retry_after_s", 0.0))))
        return HubError(failure.kind, message, None, **{"Retry-After": wait})
    if detail.hint and "kerneldctl" not in message:  # a store error already says what to do
        message += f" ({detail.hint})"
    if failure.http >= 500:
        log.warning("hub api %s: %s", "/".join(parts), message)
    return HubError(failure.kind, message, _HUB_CODES.get(detail.code))


def parse_range(header: str, size: int) -> tuple[int, int] | Literal["all"] | None:
    """[start, end) of a single `bytes=` range; "all" for a header not honoured (several
    ranges, another unit: answered with the whole file, as the Hub does); None when the range
    cannot be satisfied (416)."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return "all"
    first, _, last = spec.strip().partition("-")
    try:
        if not first:
            n = int(last)  # a suffix: the last n bytes (none of an empty file: 416)
            return (max(size - n, 0), size) if n > 0 and size > 0 else None
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return "all"
    if start >= size or end <= start:
        return None
    return start, end


class HubApiServer:
    """The endpoint's listeners (`[hub_api] listen`, `socket`) over one `HubView`."""

    def __init__(
        self,
        core: HubHost,
        *,
        listen: str,
        socket_path: Path | None,
        inherited: Sequence[Inherited] = (),
        refused: Sequence[tuple[Inherited, str]] = (),
    ) -> None:
        """`inherited`: the Hub API sockets systemd passed (kerneld.socket), served instead of
        binding `listen` and `socket_path` (`kerneld.server.plumbing.activation.hub_api_sockets`);
        `refused`: passed ones held but answered with a 503 saying why
        (`kerneld.server.plumbing.exposure`)."""
        user = core.config.user_socket
        handler = HubApiEndpoint(HubView(core))

        def admit_member(caller: Caller) -> tuple[bool, str]:
            verdict = admit(caller, user.path)
            return verdict.allowed, verdict.reason

        self._listeners = HttpListeners(
            "hub-api",
            handler,
            socket_path=socket_path,
            listen=listen,
            socket=None
            if socket_path is None
            else SocketConfig(socket_path, user.mode, user.group),
            identify=identify_peer,
            admit=admit_member,
            inherited=inherited,
            refused=refused,
        )
        self.where = self._listeners.where
        self.failed = self._listeners.failed

    def start(self) -> None:
        self._listeners.start()
        for where in self.where:
            log.info("hub api on %s (HF_ENDPOINT for unmodified kernels)", where)

    def quiesce(self) -> None:
        """No new connections (they wait in the backlog), idle ones closed."""
        self._listeners.quiesce()

    def stop(self, grace: float = 0.0) -> None:
        """Stop; accepted requests get up to `grace` seconds."""
        self._listeners.stop(grace)
