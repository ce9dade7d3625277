"""Fetch a variant from the upstream chain into the store: verified, resumable, single-flight.

The same variant, or the same file, is never downloaded twice at once: concurrent callers share
one download and get the same result or error; a variant's files download in parallel. Upstreams
are tried in priority order; a file whose bytes do not match the upstream's digest is retried
once, then the next upstream is asked.
Nothing unverified reaches a published tree: the store checks every byte on ingest and the
variant's `metadata.json` digest at publish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kerneld.pipeline.fetch_progress import FetchProgress, FetchProgressFn
from kerneld.pipeline.read_ahead import ReadAhead
from kerneld.store import (
    BlobInfo,
    Expected,
    FetchTarget,
    IntegrityError,
    SizeMismatchError,
    TreeFile,
    TreeInfo,
)
from kerneld.store.paths import check_unique_paths, validate_relpath, validate_variant
from kerneld.upstream.base import RemoteFile, Upstream
from kerneld.upstream.errors import (
    EntryNotFound,
    RepoNotFound,
    RevisionNotFound,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamUnavailable,
    every_upstream,
)
from kerneld.upstream.retry import TransientError
from kerneld_client.single_flight import SingleFlight

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
log = logging.getLogger("kerneld.fetch")

#: Files of one variant downloaded at once: a variant is a handful of files, so on a link with
#: real round trips the wait is one file's, not the sum (huggingface_hub's snapshot uses 8).
PARALLEL_FILES = 8
#: Files at least this large are read ahead in a thread (`kerneld.pipeline.read_ahead`).
READ_AHEAD_MIN_SIZE = 8 << 20


@dataclass(frozen=True)
class FetchResult:
    tree: TreeInfo
    upstream: str
    bytes_downloaded: int
    files_downloaded: int
    seconds: float


class VariantFetcher(Protocol):
    """What the acquire path needs of a download: one verified variant in the store (a
    `Fetcher`; `kerneld.pipeline.acquire` is the only caller, the structure test checks)."""

    def fetch_variant(
        self, repo_id: str, commit: str, variant: str, *, progress: FetchProgressFn | None = None
    ) -> FetchResult: ...


class Fetcher:
    """Moves variants from upstreams into a store."""

    def __init__(
        self,
        store: FetchTarget,
        upstreams: Sequence[Upstream],
        *,
        attempts_per_file: int = 3,
        parallel_files: int = PARALLEL_FILES,
        read_ahead_min_size: int = READ_AHEAD_MIN_SIZE,
    ) -> None:
        self.store = store
        self.upstreams = list(upstreams)
        self.attempts_per_file = attempts_per_file
        self.parallel_files = parallel_files
        self.read_ahead_min_size = read_ahead_min_size
        self._variants: SingleFlight[tuple[str, str, str], FetchResult] = SingleFlight()
        self._blobs: SingleFlight[tuple[str, str], tuple[BlobInfo, int]] = SingleFlight()

    def fetch_variant(
        self, repo_id: str, commit: str, variant: str, *, progress: FetchProgressFn | None = None
    ) -> FetchResult:
        result = self._variants.do(
            (repo_id, commit, variant),
            lambda: self._fetch_variant(repo_id, commit, variant, progress),
        )
        return result

    def _fetch_variant(
        self, repo_id: str, commit: str, variant: str, progress: FetchProgressFn | None
    ) -> FetchResult:
        failures: list[UpstreamError | IntegrityError] = []
        if not self.upstreams:  # import-only (`upstream = []`): nothing to ask, no connection
            raise UpstreamUnavailable(
                f"variant {variant} is not in the store, and this host is import-only (no "
                "upstream): bring it with `kerneldctl mirror import`",
                repo_id=repo_id,
                revision=commit,
            )
        for upstream in self.upstreams:
            start = time.monotonic()
            try:
                files = upstream.list_files(repo_id, commit, variant)
                _check_listing(files, repo_id, commit, variant)
                downloaded, nbytes = self._ingest_all(
                    upstream, repo_id, commit, variant, files, progress
                )
                tree = self.store.trees.publish_tree(
                    repo_id,
                    commit,
                    variant,
                    [
                        TreeFile(
                            path=f.path,
                            sha256=sha,
                            size=f.size,
                            upstream_id=f.sha256 or f.git_sha1,
                        )
                        for f, sha in downloaded
                    ],
                )
            except (EntryNotFound, RevisionNotFound, RepoNotFound, UpstreamUnavailable) as exc:
                log.info(
                    "fetch miss upstream=%s repo=%s commit=%s variant=%s reason=%s",
                    upstream.name,
                    repo_id,
                    commit,
                    variant,
                    exc,
                )
                failures.append(exc)
                continue
            except (IntegrityError, UpstreamProtocolError) as exc:
                log.warning(
                    "integrity failure upstream=%s repo=%s commit=%s variant=%s error=%s; "
                    "trying the next upstream",
                    upstream.name,
                    repo_id,
                    commit,
                    variant,
                    exc,
                )
                failures.append(exc)
                continue
            seconds = time.monotonic() - start
            log.info(
                "fetched repo=%s commit=%s variant=%s upstream=%s files=%d bytes=%d "
                "seconds=%.3f tree=%s",
                repo_id,
                commit,
                variant,
                upstream.name,
                sum(1 for _ in downloaded),
                nbytes,
                seconds,
                tree.digest,
            )
            if progress:
                progress(
                    FetchProgress(
                        "variant-done",
                        repo_id,
                        commit,
                        variant,
                        upstream=upstream.name,
                        files_done=len(downloaded),
                        files_total=len(downloaded),
                    )
                )
            return FetchResult(tree, upstream.name, nbytes, len(downloaded), seconds)
        raise _summarise(failures, repo_id, commit, variant)

    def _ingest_all(
        self,
        upstream: Upstream,
        repo_id: str,
        commit: str,
        variant: str,
        files: list[RemoteFile],
        progress: FetchProgressFn | None,
    ) -> tuple[list[tuple[RemoteFile, str]], int]:
        total = sum(f.size for f in files)
        if progress:
            progress(
                FetchProgress(
                    "variant-started",
                    repo_id,
                    commit,
                    variant,
                    upstream=upstream.name,
                    bytes_total=total,
                    files_total=len(files),
                )
            )
        done: list[tuple[RemoteFile, str] | None] = [None] * len(files)
        tally = {"bytes": 0, "files": 0, "downloaded": 0}
        tally_lock = threading.Lock()

        def one(i: int, f: RemoteFile) -> None:
            key = ("sha256", f.sha256) if f.sha256 else ("gitsha1", f.git_sha1 or "")
            info, fresh_bytes = self._blobs.do(
                key, lambda: self._ingest_file(upstream, repo_id, commit, variant, f)
            )
            with tally_lock:  # progress callbacks are called one at a time
                done[i] = (f, info.sha256)
                tally["downloaded"] += fresh_bytes
                tally["bytes"] += f.size
                tally["files"] += 1
                if progress:
                    progress(
                        FetchProgress(
                            "file-done",
                            repo_id,
                            commit,
                            variant,
                            upstream=upstream.name,
                            path=f.path,
                            bytes_done=tally["bytes"],
                            bytes_total=total,
                            files_done=tally["files"],
                            files_total=len(files),
                        )
                    )

        workers = min(self.parallel_files, len(files))
        if workers <= 1:
            for i, f in enumerate(files):
                one(i, f)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="fetch-file") as pool:
                futures = [pool.submit(one, i, f) for i, f in enumerate(files)]
                try:
                    for future in as_completed(futures):
                        future.result()
                except BaseException:
                    for future in futures:
                        future.cancel()  # files not started yet; running ones finish
                    raise
        return [d for d in done if d is not None], tally["downloaded"]

    def _ingest_file(
        self, upstream: Upstream, repo_id: str, commit: str, variant: str, f: RemoteFile
    ) -> tuple[BlobInfo, int]:
        """Download one file unless present; returns (blob, bytes downloaded)."""
        found = (
            self.store.blobs.find_blob(sha256=f.sha256)
            if f.sha256
            else self.store.blobs.find_blob(git_sha1=f.git_sha1)
        )
        if found is not None:
            return found, 0
        ctx = {"repo_id": repo_id, "commit": commit, "variant": variant}
        expected = Expected(f.size, sha256=f.sha256, git_sha1=f.git_sha1)
        last: Exception | None = None
        corrupt_seen = False
        for _attempt in range(self.attempts_per_file):
            writer = self.store.blobs.open_writer(expected, **ctx)
            with writer:
                start = writer.offset
                try:
                    with self._stream(upstream, repo_id, commit, variant, f, start) as chunks:
                        for chunk in chunks:
                            writer.write(chunk)
                    info = writer.commit()
                    return info, f.size - start
                except TransientError as exc:
                    writer.close()  # keep the partial file: the next attempt resumes it
                    last = exc
                    log.info(
                        "resuming download upstream=%s repo=%s commit=%s variant=%s file=%s "
                        "at=%d error=%s",
                        upstream.name,
                        repo_id,
                        commit,
                        variant,
                        f.path,
                        writer.offset,
                        exc,
                    )
                except SizeMismatchError as exc:
                    last = exc  # a short body: start over
                except IntegrityError as exc:
                    if corrupt_seen:
                        raise
                    corrupt_seen, last = True, exc  # retry once from scratch, then give up
        if isinstance(last, IntegrityError):
            raise last
        raise UpstreamUnavailable(
            f"downloading {f.path} failed {self.attempts_per_file} times: {last}",
            upstream=upstream.name,
            repo_id=repo_id,
            revision=commit,
        )

    def _stream(
        self,
        upstream: Upstream,
        repo_id: str,
        commit: str,
        variant: str,
        f: RemoteFile,
        offset: int,
    ) -> AbstractContextManager[Iterable[bytes]]:
        """The file's bytes from `offset`: a large file's read ahead in a thread of its own, so
        the download overlaps the store's hashing and writing; a small one's (most of a cold
        start's) straight from the upstream, with no thread to start."""
        if f.size - offset < self.read_ahead_min_size:
            return upstream.open_file(repo_id, commit, variant, f, offset=offset)
        return ReadAhead(
            lambda: upstream.open_file(repo_id, commit, variant, f, offset=offset),
            name="kerneld-fetch-read",
        )


def _check_listing(files: Sequence[RemoteFile], repo_id: str, commit: str, variant: str) -> None:
    """The checks publish_tree makes on names, made before any byte is downloaded: a hostile
    listing (`../x`, duplicates, ...) is refused with nothing written."""
    ctx = {"repo_id": repo_id, "commit": commit}
    validate_variant(variant, **ctx)
    ctx["variant"] = variant
    for f in files:
        validate_relpath(f.path, **ctx)
    check_unique_paths((f.path for f in files), **ctx)


def _summarise(
    failures: list[UpstreamError | IntegrityError], repo_id: str, commit: str, variant: str
) -> Exception:
    """The most useful error across upstreams (integrity > unavailable > not found); its
    message names every upstream tried and what each said."""
    for exc in failures:
        if isinstance(exc, IntegrityError):
            return exc
    answers = [f for f in failures if isinstance(f, UpstreamError)]
    for kind in (UpstreamProtocolError, UpstreamUnavailable, UpstreamError):
        for chosen in answers:
            if isinstance(chosen, kind):
                return every_upstream(answers, chosen, repo_id=repo_id, revision=commit)
    return EntryNotFound(
        f"variant {variant} not found in any upstream", repo_id=repo_id, revision=commit
    )
