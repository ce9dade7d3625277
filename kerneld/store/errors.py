"""Typed errors of the store.

Every error carries what is known of its context (repo_id, commit, variant, path: the
names the client's, the resolver's and the upstreams' errors use too) and a message that
says what was wrong and what to do about it. Callers branch on the class, never on the message.

    StoreError
    ├── StoreLockedError          another process owns the store
    ├── StoreOwnershipError       the store (or a directory above it) belongs to someone else,
    │                             or a step of opening it was refused by the file system
    ├── ReadOnlyStoreError        a mutation on a store opened read-only
    ├── SchemaError               the index was written by a newer kerneld, or is unreadable
    ├── InvalidInputError         untrusted input rejected before anything was written
    │   ├── InvalidPathError      absolute, "..", empty component, NUL, too long, ...
    │   ├── DuplicatePathError    the same path twice in one manifest
    │   ├── PathConflictError     a path is both a file and a directory
    │   ├── UnsupportedFileTypeError  symlink, device, fifo, submodule
    │   ├── InvalidRepoError / InvalidRevisionError / InvalidDigestError
    │   │   └── UnresolvedDenyError  a deny's ref or commit prefix names no one commit
    ├── IntegrityError            bytes do not match what the upstream promised
    │   ├── SizeMismatchError
    │   ├── DigestMismatchError
    │   └── MetadataDigestError   metadata.json "digest" disagrees with the files
    ├── MetadataError             metadata.json missing or unparsable
    ├── BlobMissingError          a tree refers to content that is not in the store
    ├── IngestInProgressError     another writer holds the same partial download
    ├── ResourceExhaustedError    the size cap or the free-space watermark would be crossed
    ├── DeniedError               an admin denied this repo/revision
    │   └── ProvenanceError       `[provenance] policy = "require"` and the variant is not
    │                             signed by a trusted identity
    ├── LeaseNotFoundError
    └── TreeNotFoundError
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kerneld.errors import ErrorKind, WireCode

#: Error context fields as log lines name them (every kerneld log line says `repo=`).
_LOG_NAMES = {"repo_id": "repo"}


def log_context(ctx: Mapping[str, str | None]) -> str:
    """The known fields of an error context, as a log line shows them."""
    return " ".join(f"{_LOG_NAMES.get(k, k)}={v}" for k, v in ctx.items() if v)


class StoreError(Exception):
    """Base class of every error raised by ``kerneld.store``."""

    kind = ErrorKind.INTERNAL  # a family: each member says more

    def __init__(
        self,
        message: str,
        *,
        repo_id: str | None = None,
        commit: str | None = None,
        variant: str | None = None,
        path: str | None = None,
    ) -> None:
        self.message = message
        self.repo_id = repo_id
        self.commit = commit
        self.variant = variant
        self.path = path
        super().__init__(self._render())

    def context(self) -> dict[str, str]:
        """The known context fields, for structured logs and RPC error details."""
        out: dict[str, str] = {}
        for key in ("repo_id", "commit", "variant", "path"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def _render(self) -> str:
        ctx = self.context()
        if not ctx:
            return self.message
        where = " ".join(f"{k}={v!r}" for k, v in ctx.items())
        return f"{self.message} [{where}]"


class StoreLockedError(StoreError):
    """Another process owns the store (holds the exclusive owner lock)."""

    kind = ErrorKind.INTERNAL

    def __init__(self, root: str, pid: int | None) -> None:
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "an unknown process"
        super().__init__(
            f"store {root} is owned by {holder}; stop that kerneld first, or open the store "
            "read-only for offline inspection"
        )


class StoreOwnershipError(StoreError):
    """The store cannot be opened by this process: its root is owned by another user, a
    directory above it lets others replace it, or the file system refused a step of the open.
    The message names the path, the operation and the command that fixes it."""

    kind = ErrorKind.INTERNAL


class ReadOnlyStoreError(StoreError):
    """A mutating call on a store opened with ``read_only=True``."""

    kind = ErrorKind.INTERNAL


class SchemaError(StoreError):
    """The index cannot be used by this version of kerneld."""

    kind = ErrorKind.INTERNAL


class InvalidInputError(StoreError):
    """Untrusted input (from an upstream manifest or a caller) was rejected; nothing was written."""

    kind = ErrorKind.INVALID


class InvalidPathError(InvalidInputError):
    """A relative path from an upstream manifest is unsafe or malformed."""

    def __init__(self, path: str, reason: str, **ctx: str | None) -> None:
        self.reason = reason
        super().__init__(
            f"rejected path {path!r}: {reason}; the upstream manifest is malformed or hostile, "
            "nothing was written",
            path=repr(path) if "\x00" in path else path,
            **ctx,
        )


class DuplicatePathError(InvalidInputError):
    """The same path appears twice in one manifest."""


class PathConflictError(InvalidInputError):
    """A path is used both as a file and as a directory."""


class UnsupportedFileTypeError(InvalidInputError):
    """A symlink, device, fifo, socket or git submodule where a regular file was expected."""


class InvalidRepoError(InvalidInputError):
    """A repo id that is not ``org/name``."""


class InvalidRevisionError(InvalidInputError):
    """A revision, ref or commit id that is malformed."""


class UnresolvedDenyError(InvalidRevisionError):
    """A deny by ref or commit prefix that cannot be turned into one full commit (unknown, too
    short, ambiguous): refused, since a deny that matches nothing protects nobody."""


class InvalidDigestError(InvalidInputError):
    """A digest string that is not the expected hex/base64 form."""


class IntegrityError(StoreError):
    """Bytes did not match what the upstream promised; the partial data was discarded."""

    kind = ErrorKind.CORRUPT


class SizeMismatchError(IntegrityError):
    def __init__(
        self, expected: int, actual: int, what: str | None = None, **ctx: str | None
    ) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{what or 'size'} mismatch: expected {expected} bytes, got {actual}"
            + (" or more" if actual > expected else "")
            + "; the upstream served different bytes than it announced, fetch again",
            **ctx,
        )


class DigestMismatchError(IntegrityError):
    def __init__(self, algorithm: str, expected: str, actual: str, **ctx: str | None) -> None:
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{algorithm} mismatch: expected {expected}, got {actual}; the download is corrupt "
            "or the upstream is inconsistent, it was discarded",
            **ctx,
        )


class MetadataDigestError(IntegrityError):
    """metadata.json's ``digest`` does not describe the variant's files."""

    def __init__(
        self,
        *,
        unknown: Sequence[str] | None = None,
        missing: Sequence[str] | None = None,
        mismatched: Sequence[str] | None = None,
        detail: str | None = None,
        **ctx: str | None,
    ) -> None:
        self.unknown = list(unknown or [])
        self.missing = list(missing or [])
        self.mismatched = list(mismatched or [])
        parts = []
        if self.unknown:
            parts.append(f"listed but not in the variant: {', '.join(self.unknown)}")
        if self.missing:
            parts.append(f"in the variant but not listed: {', '.join(self.missing)}")
        if self.mismatched:
            parts.append(f"content does not match: {', '.join(self.mismatched)}")
        if detail:
            parts.append(detail)
        super().__init__(
            "metadata.json digest check failed (" + "; ".join(parts) + "); the variant was "
            "not published — the build on the upstream is inconsistent or was tampered with. "
            "A kernel author who changed files after the build: re-run the build's hash step "
            "(the kernel builder writes the digest into metadata.json) and publish again",
            **ctx,
        )


class MetadataError(StoreError):
    """metadata.json is missing or cannot be parsed."""

    kind = ErrorKind.CORRUPT


class BlobMissingError(StoreError):
    """A tree refers to blobs that are not (or no longer) in the store."""

    kind = ErrorKind.CORRUPT

    def __init__(self, missing: Sequence[str], **ctx: str | None) -> None:
        self.missing = list(missing)
        shown = ", ".join(self.missing[:5]) + (" ..." if len(self.missing) > 5 else "")
        super().__init__(
            f"{len(self.missing)} blob(s) not in the store: {shown}; ingest them first "
            "(they may have been garbage-collected meanwhile)",
            **ctx,
        )


class IngestInProgressError(StoreError):
    """Another writer is filling the same partial download right now."""

    kind = ErrorKind.INTERNAL


class ResourceExhaustedError(StoreError):
    """Writing would cross the size cap or the free-space watermark."""

    kind = ErrorKind.EXHAUSTED

    def __init__(self, needed: int, available: int, limit: str, **ctx: str | None) -> None:
        self.needed = needed
        self.available = available
        self.limit = limit
        super().__init__(
            f"resource exhausted: need {needed} bytes but only {available} are available under "
            f"the {limit} (after garbage collection); raise the cap, free disk space, or unpin "
            "kernels",
            **ctx,
        )


class DeniedError(StoreError):
    """The repo (or this revision of it) is denied by an admin."""

    kind = ErrorKind.DENIED

    def __init__(self, reason: str, **ctx: str | None) -> None:
        self.reason = reason
        super().__init__(
            f"denied by the administrator: {reason or 'no reason given'}; ask an admin to "
            "`kerneldctl allow` it",
            **ctx,
        )


class ProvenanceError(DeniedError):
    """The site requires signed kernels and this variant's signature is missing or does not
    verify (a DeniedError: the same status for jobs, since the site's policy refuses it)."""

    def __init__(self, status: str, detail: str, **ctx: str | None) -> None:
        self.reason = detail
        self.status = status
        what = {
            "unsigned": "has no sigstore signature (metadata.json.sigstore)",
            "unchecked": "could not be checked",
        }.get(status, "has a signature that does not verify")
        StoreError.__init__(
            self,
            f"the variant {what}: {detail}; this site requires signed kernels "
            '([provenance] policy = "require"): ask the publisher for a signed build, or an '
            "admin to add its signer to [provenance] identities",
            **ctx,
        )


class LeaseNotFoundError(StoreError):
    """The lease id is unknown or has expired."""

    kind = ErrorKind.NOT_FOUND
    wire_code: WireCode = "INVALID_ARGUMENT"  # the lease id is not valid now


class TreeNotFoundError(StoreError):
    """No live tree with this digest (it may have been garbage-collected)."""

    kind = ErrorKind.NOT_FOUND
