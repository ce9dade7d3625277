"""Typed upstream errors, mapped to gRPC status codes by the daemon."""

from __future__ import annotations


class UpstreamError(Exception):
    """Base class; carries the upstream, repo and revision involved."""

    def __init__(
        self, message: str, *, upstream: str = "", repo_id: str = "", revision: str = ""
    ) -> None:
        self.message = message
        self.upstream = upstream
        self.repo_id = repo_id
        self.revision = revision
        where = "@".join(p for p in (repo_id, revision) if p)
        prefix = f"[{upstream}] " if upstream else ""
        super().__init__(f"{prefix}{where}: {message}" if where else f"{prefix}{message}")


class RepoNotFound(UpstreamError):
    """The upstream has no such kernel repository (or it is private/gated to us)."""


class RevisionNotFound(UpstreamError):
    """The repository exists but the branch, tag or commit does not."""


class EntryNotFound(UpstreamError):
    """A file or variant folder is missing at that commit."""


class UpstreamUnavailable(UpstreamError):
    """The upstream could not be reached or kept failing after retries (5xx, 429, resets)."""


class UpstreamProtocolError(UpstreamError):
    """The upstream answered with something malformed (bad JSON, impossible sizes)."""
