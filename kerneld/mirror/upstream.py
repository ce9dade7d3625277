"""Mirror upstreams: the static layout of `kerneld.mirror.documents`, from a directory or over HTTP.

A cluster puts one mirror between its daemons and the Hub; the directory reader serves local disks
and NFS, the HTTP reader any web server, object store or CDN. Both read the same files.

With `trusted_keys` (the upstream's `require_signatures`), every refs file and manifest must carry
a valid Ed25519 signature (`kerneldctl mirror export --sign-key`) by one of those keys. Manifests
name every file's sha256, which the store checks on ingest, so signed refs and manifests make
the whole mirror tamper-evident: whoever controls the mirror's disk or the network to a plain
`http://` mirror can then withhold kernels, but not substitute them.
"""

from __future__ import annotations

import http.client
import logging
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from threading import Lock
from typing import TYPE_CHECKING

from kerneld.errors import ErrorKind
from kerneld.mirror.documents import (
    INFO,
    Manifest,
    MirrorFormatError,
    blob_path,
    manifest_path,
    parse_info,
    parse_refs,
    refs_path,
)
from kerneld.mirror.keys import SignatureError, sig_path, verify_signature
from kerneld.upstream.base import Refs, RemoteFile, check_repo_id
from kerneld.upstream.errors import (
    EntryNotFound,
    RepoNotFound,
    RevisionNotFound,
    UpstreamProtocolError,
    UpstreamUnavailable,
)
from kerneld.upstream.retry import (
    RetryPolicy,
    TransientError,
    parse_retry_after,
    request_timeout,
    with_retries,
)
from kerneld_client.vocabulary import is_commit

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

log = logging.getLogger("kerneld.upstream.mirror")
CHUNK = 1 << 20
#: Refs and manifests are small; anything bigger is refused before it is parsed.
MAX_DOC_BYTES = 16 << 20


class _Missing(Exception):
    """The mirror has no file at that path."""

    kind = ErrorKind.NOT_FOUND


class _MirrorBase:
    """Shared logic; subclasses supply `_read` and `_stream` for one transport."""

    name: str
    policy: RetryPolicy

    def __init__(self, trusted_keys: Mapping[str, Ed25519PublicKey] | None = None) -> None:
        self._info_checked = False
        self._lock = Lock()
        self._trusted = dict(trusted_keys or {})

    # transport hooks
    def _read(self, rel: str) -> bytes:
        raise NotImplementedError

    def _stream(self, rel: str, offset: int) -> AbstractContextManager[Iterator[bytes]]:
        raise NotImplementedError

    def _get(self, rel: str, *, repo_id: str = "", revision: str = "") -> bytes | None:
        """Read a small document; None when absent; retry transient failures."""
        try:
            return with_retries(
                lambda: self._read(rel),
                policy=self.policy,
                what=f"read {rel}",
                upstream=self.name,
                repo_id=repo_id,
                revision=revision,
            )
        except _Missing:
            return None

    def _signed(self, rel: str, data: bytes, *, repo_id: str, revision: str = "") -> bytes:
        """`data` if signatures are not required or it carries a trusted one; else an integrity
        failure (the next upstream is asked; nothing is cached as "not found")."""
        if not self._trusted:
            return data
        sig = self._get(sig_path(rel), repo_id=repo_id, revision=revision)
        try:
            verify_signature(rel, data, sig, self._trusted)
        except SignatureError as exc:
            raise UpstreamProtocolError(
                f"refused {rel}: {exc} (this upstream requires signatures by "
                f"{', '.join(sorted(self._trusted))})",
                upstream=self.name,
                repo_id=repo_id,
                revision=revision,
            ) from None
        return data

    def _check_info(self) -> None:
        with self._lock:
            if self._info_checked:
                return
            data = self._get(INFO)
            if data is None:
                raise UpstreamUnavailable(
                    f"no {INFO} file: not a kerneld mirror (or not exported yet)",
                    upstream=self.name,
                )
            try:
                parse_info(data)
            except MirrorFormatError as exc:
                raise UpstreamProtocolError(str(exc), upstream=self.name) from exc
            self._info_checked = True

    # Upstream protocol
    def list_refs(self, repo_id: str) -> Refs:
        check_repo_id(repo_id)
        self._check_info()
        data = self._get(refs_path(repo_id), repo_id=repo_id)
        if data is None:
            raise RepoNotFound("not in this mirror", upstream=self.name, repo_id=repo_id)
        data = self._signed(refs_path(repo_id), data, repo_id=repo_id)
        try:
            branches, tags = parse_refs(data, repo_id)
        except MirrorFormatError as exc:
            raise UpstreamProtocolError(str(exc), upstream=self.name, repo_id=repo_id) from exc
        return Refs(branches=branches, tags=tags)

    def resolve_revision(self, repo_id: str, revision: str) -> str:
        if is_commit(revision):
            self._manifest(repo_id, revision)
            return revision
        refs = self.list_refs(repo_id)
        name = revision
        for prefix, table in (("refs/heads/", refs.branches), ("refs/tags/", refs.tags)):
            if revision.startswith(prefix):
                name = revision[len(prefix) :]
                if name in table:
                    return table[name]
                break
        else:
            if name in refs.branches:
                return refs.branches[name]
            if name in refs.tags:
                return refs.tags[name]
        raise RevisionNotFound(
            "no such branch or tag in this mirror",
            upstream=self.name,
            repo_id=repo_id,
            revision=revision,
        )

    def _manifest(self, repo_id: str, commit: str) -> Manifest:
        check_repo_id(repo_id)
        self._check_info()
        data = self._get(manifest_path(repo_id, commit), repo_id=repo_id, revision=commit)
        if data is None:
            raise RevisionNotFound(
                "commit not in this mirror", upstream=self.name, repo_id=repo_id, revision=commit
            )
        data = self._signed(manifest_path(repo_id, commit), data, repo_id=repo_id, revision=commit)
        try:
            return Manifest.from_json(data, repo_id=repo_id, commit=commit)
        except MirrorFormatError as exc:
            raise UpstreamProtocolError(
                str(exc), upstream=self.name, repo_id=repo_id, revision=commit
            ) from exc

    def list_variants(self, repo_id: str, commit: str) -> list[str]:
        return sorted(self._manifest(repo_id, commit).variants)

    def list_files(self, repo_id: str, commit: str, variant: str) -> list[RemoteFile]:
        files = self._manifest(repo_id, commit).variants.get(variant)
        if files is None:
            raise EntryNotFound(
                f"variant {variant} not in this mirror",
                upstream=self.name,
                repo_id=repo_id,
                revision=commit,
            )
        return files

    def open_file(
        self, repo_id: str, commit: str, variant: str, file: RemoteFile, *, offset: int = 0
    ) -> AbstractContextManager[Iterator[bytes]]:
        if file.sha256 is None:
            raise UpstreamProtocolError(
                f"{file.path}: mirror files are addressed by sha256", upstream=self.name
            )
        return self._open_blob(blob_path(file.sha256), offset, repo_id, commit)

    @contextmanager
    def _open_blob(
        self, rel: str, offset: int, repo_id: str, commit: str
    ) -> Iterator[Iterator[bytes]]:
        try:
            cm = with_retries(
                lambda: self._enter(rel, offset),
                policy=self.policy,
                what=f"read {rel}",
                upstream=self.name,
                repo_id=repo_id,
                revision=commit,
            )
        except _Missing as exc:
            raise EntryNotFound(
                f"blob {rel} missing from mirror",
                upstream=self.name,
                repo_id=repo_id,
                revision=commit,
            ) from exc
        try:
            yield cm[1]
        finally:
            cm[0].__exit__(None, None, None)

    def _enter(
        self, rel: str, offset: int
    ) -> tuple[AbstractContextManager[Iterator[bytes]], Iterator[bytes]]:
        cm = self._stream(rel, offset)
        return cm, cm.__enter__()


class MirrorDirUpstream(_MirrorBase):
    """A mirror on a local or network file system."""

    def __init__(
        self,
        root: Path,
        *,
        name: str = "",
        policy: RetryPolicy | None = None,
        trusted_keys: Mapping[str, Ed25519PublicKey] | None = None,
    ) -> None:
        super().__init__(trusted_keys)
        self.root = Path(root)
        self.name = name or f"mirror-dir:{self.root}"
        self.policy = policy or RetryPolicy(attempts=2)

    def _path(self, rel: str) -> Path:
        # rel is built from validated parts only; resolve() guards against symlinks out of root.
        path = (self.root / rel).resolve()
        root = self.root.resolve()
        if path != root and root not in path.parents:
            raise UpstreamProtocolError(f"{rel} resolves outside the mirror", upstream=self.name)
        return path

    def _read(self, rel: str) -> bytes:
        try:
            path = self._path(rel)
            if path.stat().st_size > MAX_DOC_BYTES:
                raise UpstreamProtocolError(f"{rel} is larger than {MAX_DOC_BYTES} bytes")
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise _Missing(rel) from exc
        except OSError as exc:
            raise TransientError(f"{rel}: {exc}") from exc

    @contextmanager
    def _stream(self, rel: str, offset: int) -> Iterator[Iterator[bytes]]:
        try:
            fh = self._path(rel).open("rb")
        except FileNotFoundError as exc:
            raise _Missing(rel) from exc
        except OSError as exc:
            raise TransientError(f"{rel}: {exc}") from exc
        with fh:
            fh.seek(offset)
            yield iter(lambda: fh.read(CHUNK), b"")


class MirrorHttpUpstream(_MirrorBase):
    """A mirror served over HTTP(S) by any static file server."""

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "",
        policy: RetryPolicy | None = None,
        trusted_keys: Mapping[str, Ed25519PublicKey] | None = None,
    ) -> None:
        super().__init__(trusted_keys)
        self.base_url = base_url.rstrip("/") + "/"
        self.name = name or f"mirror-http:{self.base_url}"
        self.policy = policy or RetryPolicy()

    def _request(self, rel: str, offset: int = 0) -> urllib.request.Request:
        url = urllib.parse.urljoin(self.base_url, urllib.parse.quote(rel))
        headers = {"User-Agent": "kerneld"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        return urllib.request.Request(url, headers=headers)

    def _urlopen(self, rel: str, offset: int = 0) -> object:
        try:
            return urllib.request.urlopen(
                self._request(rel, offset), timeout=request_timeout(self.policy.timeout)
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise _Missing(rel) from exc
            if exc.code in (408, 425, 429) or exc.code >= 500:
                raise TransientError(
                    f"GET {rel}: HTTP {exc.code}",
                    retry_after=parse_retry_after(exc.headers.get("Retry-After")),
                ) from exc
            raise UpstreamProtocolError(f"GET {rel}: HTTP {exc.code}", upstream=self.name) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            # Name resolution failed or nobody listens: known at once, not worth many tries.
            unreachable = isinstance(reason, socket.gaierror | ConnectionRefusedError)
            raise TransientError(f"GET {rel}: {exc}", unreachable=unreachable) from exc

    def _read(self, rel: str) -> bytes:
        response = self._urlopen(rel)
        with response as fh:  # type: ignore[attr-defined]
            try:
                data: bytes = fh.read(MAX_DOC_BYTES + 1)
            except (OSError, http.client.HTTPException) as exc:
                raise TransientError(f"GET {rel}: {exc!r}") from exc
        if len(data) > MAX_DOC_BYTES:
            raise UpstreamProtocolError(f"{rel} is larger than {MAX_DOC_BYTES} bytes")
        return data

    @contextmanager
    def _stream(self, rel: str, offset: int) -> Iterator[Iterator[bytes]]:
        response = self._urlopen(rel, offset)
        with response as fh:  # type: ignore[attr-defined]
            skip = offset if (offset and fh.status == 200) else 0

            def chunks() -> Iterator[bytes]:
                nonlocal skip
                while True:
                    try:
                        chunk: bytes = fh.read(CHUNK)
                    except (OSError, http.client.HTTPException) as exc:
                        raise TransientError(f"GET {rel}: connection lost: {exc!r}") from exc
                    if not chunk:
                        return
                    if skip:
                        cut = min(skip, len(chunk))
                        chunk, skip = chunk[cut:], skip - cut
                        if not chunk:
                            continue
                    yield chunk

            yield chunks()
