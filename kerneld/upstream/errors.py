"""Typed upstream errors, mapped to gRPC status codes by the daemon."""

from __future__ import annotations

from kerneld.errors import ErrorKind, WireCode


class UpstreamError(Exception):
    """Base class; carries the upstream, repo and revision involved."""

    kind = ErrorKind.UNAVAILABLE

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

    kind = ErrorKind.NOT_FOUND


class OrgNotFound(RepoNotFound):
    """The Hub has no such organisation: nobody vouches for it, and nobody refuses it either
    (a publisher-trust question it cannot answer, not a "no")."""


class RevisionNotFound(UpstreamError):
    """The repository exists but the branch, tag or commit does not."""

    kind = ErrorKind.NOT_FOUND
    wire_code: WireCode = "REVISION_NOT_FOUND"


class EntryNotFound(UpstreamError):
    """A file or variant folder is missing at that commit."""

    kind = ErrorKind.NOT_FOUND


class UpstreamUnavailable(UpstreamError):
    """The upstream could not be reached or kept failing after retries (5xx, 429, resets)."""


class UpstreamProtocolError(UpstreamError):
    """The upstream answered with something malformed (bad JSON, impossible sizes)."""


class MalformedAnswer(UpstreamProtocolError):
    """The body did not parse (invalid JSON or UTF-8, a cut document): a proxy or the network
    may have mangled it, so it is asked again once before it counts."""


class UpstreamPending(UpstreamUnavailable):
    """The caller's deadline came before the upstreams answered; the fetch goes on without it,
    so a later call may find the kernel in the store."""


def said(exc: BaseException) -> str:
    """`name: what it said` for one upstream's failure (no repo prefix: the caller has it)."""
    if isinstance(exc, UpstreamError):
        return f"{exc.upstream}: {exc.message}" if exc.upstream else exc.message
    return str(exc)


def every_upstream(
    failures: list[UpstreamError], chosen: UpstreamError, *, repo_id: str, revision: str
) -> UpstreamError:
    """`chosen`'s kind of error, with a message naming every upstream tried and its answer.

    A job that falls back logs this message: with two upstreams, "the Hub is unreachable" alone
    would hide that the mirror had no such kernel (or the other way round).
    """
    if len(failures) == 1 and failures[0] is chosen and not chosen.upstream:
        return chosen
    tried = "; ".join(said(f) for f in failures)
    n = len(failures)
    out = type(chosen)(
        f"tried {n} upstream{'s' if n != 1 else ''}: {tried}",
        repo_id=repo_id or chosen.repo_id,
        revision=revision or chosen.revision,
    )
    out.__cause__ = chosen
    return out
