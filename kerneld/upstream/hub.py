"""The Hugging Face Hub as an upstream, through the real `huggingface_hub` client.

Metadata calls (refs, revision, tree) go through `HfApi`, so `HF_ENDPOINT`, `HF_TOKEN`, proxies
and the client's own headers behave as users expect. File bytes are streamed with the client's
HTTP session straight into the store's verified ingest: they never pass through the
`huggingface_hub` cache (which would keep a second, unverified copy on disk).

`huggingface_hub` checks sizes but not content hashes; the store re-hashes every byte.

Inside a kerneld upstream call, `huggingface_hub`'s own HTTP retries are switched off (see
`_BoundedClient`): its `http_backoff` retries a DNS failure 5 times over ~23 s, and under
kerneld's own attempts that multiplied into minutes a job waited for nothing. kerneld's
`with_retries` is the one retry loop, bounded in attempts and time.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import httpx2
from huggingface_hub import HfApi
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils import (
    build_hf_headers,
    get_session,
    hf_raise_for_status,
    set_client_factory,
)
from huggingface_hub.utils._http import hf_request_event_hook

from kerneld import __version__
from kerneld.upstream.base import Refs, RemoteFile, check_repo_id, skipped
from kerneld.upstream.errors import (
    EntryNotFound,
    MalformedAnswer,
    OrgNotFound,
    RepoNotFound,
    RevisionNotFound,
    UpstreamProtocolError,
)
from kerneld.upstream.retry import (
    RetryPolicy,
    TransientError,
    in_upstream_call,
    parse_retry_after,
    request_timeout,
    with_retries,
)
from kerneld_client.vocabulary import is_commit, is_hex

T = TypeVar("T")

# kerneld talks to its configured upstreams and nothing else (an air-gapped site must see no
# other attempt). huggingface_hub's user-agent telemetry fetches `/api/agent-harnesses` from
# its *default* endpoint (the public Hub unless HF_ENDPOINT is set), whatever endpoint HfApi
# was given, and looks up the torch version; both are off in a process that uses this module.
hf_constants.HF_HUB_DISABLE_TELEMETRY = True
log = logging.getLogger("kerneld.upstream.hub")

REPO_TYPE = "kernel"
CHUNK = 1 << 20
#: A variant folder holds a handful of files; a listing this long is broken or hostile.
MAX_TREE_ENTRIES = 10_000
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class _BoundedClient(httpx2.Client):
    """`huggingface_hub`'s shared HTTP client, made to fail fast inside kerneld's calls.

    Within `with_retries` (and only there: anything else in the process keeps the library's
    behaviour) every request gets a timeout cut to the call's remaining budget (`HfApi` passes
    `timeout=None`, "wait forever", for refs and tree listings), and connection errors and
    retryable statuses are raised as `TransientError`, which `huggingface_hub`'s `http_backoff`
    does not catch: the failure reaches kerneld's retry loop at once instead of being retried
    (and slept on) underneath it.
    """

    def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        if not in_upstream_call():
            return super().send(request, **kwargs)
        given = request.extensions.get("timeout") or {}
        default = request_timeout(RetryPolicy.timeout)
        request.extensions["timeout"] = {
            key: min(default, value) if isinstance(value, int | float) else default
            for key in ("connect", "read", "write", "pool")
            for value in (given.get(key),)
        }
        where = f"{request.method} {request.url.copy_with(query=None)}"
        try:
            response = super().send(request, **kwargs)
        except httpx2.ConnectError as exc:
            # DNS failure or connection refused: nobody to talk to (a timeout is not this).
            raise TransientError(f"{where}: cannot connect: {exc}", unreachable=True) from exc
        except httpx2.TimeoutException as exc:
            raise TransientError(f"{where}: no answer in time ({type(exc).__name__})") from exc
        except (httpx2.TransportError, httpx2.StreamError) as exc:
            raise TransientError(f"{where}: {exc!r}") from exc
        if response.status_code in TRANSIENT_STATUS:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            response.close()
            raise TransientError(f"{where}: HTTP {response.status_code}", retry_after=retry_after)
        return response


def _client_factory() -> httpx2.Client:
    """`huggingface_hub`'s default client (its request hook, redirects, no client-wide
    timeout), as a `_BoundedClient`."""
    return _BoundedClient(
        event_hooks={"request": [hf_request_event_hook]}, follow_redirects=True, timeout=None
    )


def _install() -> None:
    """Once per process, at import: the bounded client, and `huggingface_hub`'s log records
    sent to the root logger only. The library adds its own stderr handler *and* propagates, so
    under kerneld's handler every one of its lines reached the journal twice."""
    set_client_factory(_client_factory)
    library = logging.getLogger("huggingface_hub")
    for handler in list(library.handlers):
        library.removeHandler(handler)
    library.propagate = True


_install()


def _size(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _remote_file(rel: str, entry: RepoFile) -> RemoteFile | None:
    """A listing entry as a RemoteFile, or None when its size or content id is impossible."""
    if entry.lfs is not None:
        # An LFS file's git oid is the pointer's, not the content's: only sha256 counts.
        size, sha256 = _size(entry.lfs.size), entry.lfs.sha256
        if size is None or not isinstance(sha256, str) or not is_hex(sha256, 64):
            return None
        return RemoteFile(rel, size, sha256=sha256)
    size, blob_id = _size(entry.size), entry.blob_id
    if size is None or not isinstance(blob_id, str) or not is_commit(blob_id):
        return None
    return RemoteFile(rel, size, git_sha1=blob_id)


def _joined(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The body in chunks of about `size` bytes, each joined once from the pieces the HTTP
    client reads (64 KiB): `iter_bytes(size)` copies every byte twice more through a BytesIO,
    which on a 2-core host cost as much CPU as hashing the file."""
    held: list[bytes] = []
    count = 0
    for piece in pieces:
        held.append(piece)
        count += len(piece)
        if count >= size:
            yield held[0] if len(held) == 1 else b"".join(held)
            held, count = [], 0
    if held:
        yield b"".join(held)


class HubUpstream:
    """Kernel repositories on a Hub (huggingface.co, or any Hub-compatible `endpoint`)."""

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        token: str | bool | None = None,
        policy: RetryPolicy | None = None,
        name: str = "hub",
    ) -> None:
        self.name = name
        self.policy = policy or RetryPolicy()
        self._token = token
        self._api = HfApi(
            endpoint=endpoint, token=token, library_name="kerneld", library_version=__version__
        )
        self.endpoint: str = self._api.endpoint

    # -- metadata -------------------------------------------------------------------------------

    def list_refs(self, repo_id: str) -> Refs:
        check_repo_id(repo_id)
        refs = self._call(
            lambda: self._api.list_repo_refs(repo_id, repo_type=REPO_TYPE),
            what="list refs",
            repo_id=repo_id,
        )
        return Refs(
            branches={b.name: b.target_commit for b in refs.branches},
            tags={t.name: t.target_commit for t in refs.tags},
        )

    def resolve_revision(self, repo_id: str, revision: str) -> str:
        check_repo_id(repo_id)
        info = self._call(
            lambda: self._api.repo_info(repo_id, revision=revision, repo_type=REPO_TYPE),
            what="resolve revision",
            repo_id=repo_id,
            revision=revision,
        )
        sha = getattr(info, "sha", None)
        if not isinstance(sha, str) or not is_commit(sha):
            raise UpstreamProtocolError(
                f"revision answer carries no commit sha (got {sha!r})",
                upstream=self.name,
                repo_id=repo_id,
                revision=revision,
            )
        return sha

    def publisher_trusted(self, org: str) -> bool:
        """Does the Hub list `org` as a trusted kernel publisher (`kernels`' check)?"""
        check_repo_id(f"{org}/kernel")

        def overview() -> bool:
            try:
                info = self._api.get_organization_overview(org)
            except HfHubHTTPError as exc:
                status = exc.response.status_code if exc.response is not None else 0
                if status == 404:
                    raise OrgNotFound(
                        f"the Hub has no organisation {org}", upstream=self.name, repo_id=f"{org}/*"
                    ) from None
                if status in (401, 403):  # a Hub mirror without the route (olah answers 401)
                    raise UpstreamProtocolError(
                        f"GET /api/organizations/{org}/overview answered HTTP {status}: this "
                        "endpoint cannot say who is a trusted kernel publisher (a Hub mirror such "
                        "as olah has no such route); list the publishers in [trust] allow",
                        upstream=self.name,
                        repo_id=f"{org}/*",
                    ) from None
                raise
            return getattr(info, "trustedKernelPublisher", False) is True

        return self._call(overview, what="organisation overview", repo_id=f"{org}/*")

    def list_variants(self, repo_id: str, commit: str) -> list[str]:
        check_repo_id(repo_id)
        try:
            entries = self._call(
                lambda: self._bounded(
                    self._api.list_repo_tree(
                        repo_id, "build", revision=commit, repo_type=REPO_TYPE, recursive=False
                    ),
                    f"{repo_id}@{commit}: build/",
                ),
                what="list variants",
                repo_id=repo_id,
                revision=commit,
            )
        except EntryNotFound:  # huggingface_hub's words are "404 Client Error."
            raise EntryNotFound(
                "build does not exist on this revision: it has no kernel builds (build/<variant>/)",
                upstream=self.name,
                repo_id=repo_id,
                revision=commit,
            ) from None
        names: list[str] = []
        for entry in entries:
            if not isinstance(entry, RepoFolder):
                continue
            path = entry.path
            folder = path if isinstance(path, str) else ""
            name = folder[len("build/") :]
            if not folder.startswith("build/") or name in ("", ".", "..") or "/" in name:
                raise UpstreamProtocolError(
                    f"tree listing of build/ returned the folder {path!r}",
                    upstream=self.name,
                    repo_id=repo_id,
                    revision=commit,
                )
            names.append(name)
        return sorted(names)

    def list_files(self, repo_id: str, commit: str, variant: str) -> list[RemoteFile]:
        check_repo_id(repo_id)
        prefix = f"build/{variant}/"
        entries = self._call(
            lambda: self._bounded(
                self._api.list_repo_tree(
                    repo_id,
                    prefix.rstrip("/"),
                    revision=commit,
                    repo_type=REPO_TYPE,
                    recursive=True,
                ),
                f"{repo_id}@{commit}: {prefix}",
            ),
            what="list files",
            repo_id=repo_id,
            revision=commit,
        )
        files: list[RemoteFile] = []
        for entry in entries:
            if not isinstance(entry, RepoFile):
                continue
            if not isinstance(entry.path, str) or not entry.path.startswith(prefix):
                raise UpstreamProtocolError(
                    f"tree listing of {prefix} returned {entry.path!r}",
                    upstream=self.name,
                    repo_id=repo_id,
                    revision=commit,
                )
            rel = entry.path[len(prefix) :]
            if skipped(rel):
                continue
            remote = _remote_file(rel, entry)
            if remote is None:
                shown = f"size {entry.size!r}, oid {entry.blob_id!r}, lfs {entry.lfs!r}"
                raise UpstreamProtocolError(
                    f"tree listing of {prefix} has an impossible size or content id for "
                    f"{rel[:200]!r} ({shown[:300]})",
                    upstream=self.name,
                    repo_id=repo_id,
                    revision=commit,
                )
            files.append(remote)
        return files

    # -- content --------------------------------------------------------------------------------

    def file_url(self, repo_id: str, commit: str, variant: str, path: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(
            repo_id,
            f"build/{variant}/{path}",
            repo_type=REPO_TYPE,
            revision=commit,
            endpoint=self.endpoint,
        )

    def open_file(
        self, repo_id: str, commit: str, variant: str, file: RemoteFile, *, offset: int = 0
    ) -> AbstractContextManager[Iterator[bytes]]:
        return self._open(repo_id, commit, variant, file, offset)

    @contextmanager
    def _open(
        self, repo_id: str, commit: str, variant: str, file: RemoteFile, offset: int
    ) -> Iterator[Iterator[bytes]]:
        check_repo_id(repo_id)
        url = self.file_url(repo_id, commit, variant, file.path)
        headers = build_hf_headers(
            token=self._token, library_name="kerneld", library_version=__version__
        )
        if offset:
            headers["Range"] = f"bytes={offset}-"

        def start() -> tuple[Any, httpx2.Response]:
            cm = get_session().stream(
                "GET", url, headers=headers, follow_redirects=True, timeout=self.policy.timeout
            )
            try:
                response = cm.__enter__()
            except httpx2.TransportError as exc:
                raise TransientError(f"GET {url}: {exc!r}") from exc
            if response.status_code in TRANSIENT_STATUS:
                cm.__exit__(None, None, None)
                raise TransientError(
                    f"GET {url}: HTTP {response.status_code}",
                    retry_after=parse_retry_after(response.headers.get("Retry-After")),
                )
            if response.status_code >= 400:
                try:
                    response.read()
                    hf_raise_for_status(response)
                except Exception as exc:
                    cm.__exit__(None, None, None)
                    raise self._translate(exc, repo_id, commit) from exc
            return cm, response

        cm, response = with_retries(
            start,
            policy=self.policy,
            what=f"download {file.path}",
            upstream=self.name,
            repo_id=repo_id,
            revision=commit,
        )
        skip = offset if (offset and response.status_code == 200) else 0

        def chunks() -> Iterator[bytes]:
            nonlocal skip
            try:
                for chunk in _joined(response.iter_bytes(), CHUNK):
                    if skip:
                        cut = min(skip, len(chunk))
                        skip -= cut
                        if cut == len(chunk):
                            continue
                        yield chunk[cut:]
                    else:
                        yield chunk
            except (httpx2.TransportError, httpx2.StreamError) as exc:
                raise TransientError(f"GET {url}: connection lost mid-body: {exc!r}") from exc

        try:
            yield chunks()
        finally:
            cm.__exit__(None, None, None)

    def _bounded(self, entries: Iterable[T], what: str) -> list[T]:
        """A tree listing, refused past MAX_TREE_ENTRIES: a hostile or broken server could
        otherwise page (`Link: next`) forever and hold a fetch and its memory."""
        out = list(itertools.islice(entries, MAX_TREE_ENTRIES + 1))
        if len(out) > MAX_TREE_ENTRIES:
            raise UpstreamProtocolError(
                f"tree listing of {what} has more than {MAX_TREE_ENTRIES} entries; "
                "not a kernel build variant",
                upstream=self.name,
            )
        return out

    def warm_up(self) -> None:
        """Pay the HTTP client's one-time set-up now rather than in the first client's fetch.

        `huggingface_hub` builds its session (loading the CA bundle) and its user agent (which
        looks up the agent-harness registry, once a day, from the Hub) on first use: ~70-100 ms
        that the first cold Resolve after a start would otherwise wait for. Best effort.
        """
        try:
            build_hf_headers(token=self._token, library_name="kerneld", library_version=__version__)
            get_session()
        except Exception as exc:  # the first real request reports real problems
            log.debug("hub %s: warm-up failed: %r", self.name, exc)

    # -- plumbing -------------------------------------------------------------------------------

    def _call(self, fn: Callable[[], T], *, what: str, repo_id: str, revision: str = "") -> T:
        def attempt() -> T:
            try:
                return fn()
            except TransientError:
                raise
            except Exception as exc:
                raise self._translate(exc, repo_id, revision) from exc

        def retried() -> T:
            return with_retries(
                attempt,
                policy=self.policy,
                what=what,
                upstream=self.name,
                repo_id=repo_id,
                revision=revision,
            )

        try:
            return retried()
        except MalformedAnswer as exc:
            log.info(
                "asking again after a malformed answer upstream=%s repo=%s rev=%s what=%s: %s",
                self.name,
                repo_id,
                revision,
                what,
                exc,
            )
            return retried()

    def _translate(self, exc: Exception, repo_id: str, revision: str) -> Exception:
        """Map `huggingface_hub`/httpx errors onto ours; transient ones become retryable."""
        ctx = {"upstream": self.name, "repo_id": repo_id, "revision": revision}
        if isinstance(exc, RevisionNotFoundError):
            return RevisionNotFound("no such branch, tag or commit", **ctx)
        if isinstance(exc, RepositoryNotFoundError):
            return RepoNotFound("no such kernel repository (or it is private or gated)", **ctx)
        if isinstance(exc, EntryNotFoundError):
            return EntryNotFound(str(exc).splitlines()[0], **ctx)
        if isinstance(exc, HfHubHTTPError):
            response = exc.response
            status = response.status_code if response is not None else 0
            if status in TRANSIENT_STATUS or status == 0:
                retry_after = (
                    parse_retry_after(response.headers.get("Retry-After"))
                    if response is not None
                    else None
                )
                return TransientError(f"HTTP {status}: {exc}", retry_after=retry_after)
            return UpstreamProtocolError(f"HTTP {status}: {exc}", **ctx)
        if isinstance(exc, httpx2.TransportError | ConnectionError | TimeoutError):
            return TransientError(repr(exc))
        if isinstance(exc, ValueError | KeyError | TypeError):
            return MalformedAnswer(f"malformed answer: {exc!r}", **ctx)
        if isinstance(exc, RecursionError):
            return MalformedAnswer("malformed answer: JSON nested too deeply", **ctx)
        return exc
