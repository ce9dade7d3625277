"""The upstream chain from config, each upstream wrapped to remember how it last answered.

`GetStatus` reports every upstream's reachability and last success/error; the wrapper records
them on the calls resolution already makes, so status costs no extra requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kerneld.config import Config, ConfigError, UpstreamConfig
from kerneld.upstream.base import Refs, RemoteFile, Upstream
from kerneld.upstream.errors import (
    EntryNotFound,
    RepoNotFound,
    RevisionNotFound,
    UpstreamError,
)
from kerneld.upstream.retry import RetryPolicy

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

T = TypeVar("T")

#: Answers that prove the upstream is up (it just has no such thing).
_ANSWERED = (RepoNotFound, RevisionNotFound, EntryNotFound)


class TrackedUpstream:
    """Delegates to `inner`, recording reachability for status reports."""

    def __init__(self, inner: Upstream, cfg: UpstreamConfig, priority: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.kind = cfg.kind
        self.location = cfg.location or getattr(inner, "endpoint", "")
        self.priority = priority
        self.last_success: float | None = None
        self.last_error = ""
        self.reachable = True
        self._lock = threading.Lock()

    def _ok(self) -> None:
        with self._lock:
            self.last_success = time.time()
            self.reachable = True

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            if isinstance(exc, _ANSWERED):
                self.last_success = time.time()
                self.reachable = True
            else:
                self.last_error = str(exc)
                self.reachable = False

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            value = fn()
        except Exception as exc:
            self._failed(exc)
            raise
        self._ok()
        return value

    def warm_up(self) -> None:
        """Let the upstream set up its client now, if it has anything to set up."""
        warm = getattr(self.inner, "warm_up", None)
        if callable(warm):
            warm()

    def publisher_trusted(self, org: str) -> bool:
        """The Hub's trusted-publisher answer for `org` (Hub upstreams only)."""
        ask = getattr(self.inner, "publisher_trusted", None)
        if ask is None:
            raise UpstreamError(f"upstream {self.name} is not a Hub: it cannot vouch for {org}")
        return self._call(lambda: bool(ask(org)))

    def list_refs(self, repo_id: str) -> Refs:
        return self._call(lambda: self.inner.list_refs(repo_id))

    def resolve_revision(self, repo_id: str, revision: str) -> str:
        return self._call(lambda: self.inner.resolve_revision(repo_id, revision))

    def list_variants(self, repo_id: str, commit: str) -> list[str]:
        return self._call(lambda: self.inner.list_variants(repo_id, commit))

    def list_files(self, repo_id: str, commit: str, variant: str) -> list[RemoteFile]:
        return self._call(lambda: self.inner.list_files(repo_id, commit, variant))

    def open_file(
        self, repo_id: str, commit: str, variant: str, file: RemoteFile, *, offset: int = 0
    ) -> AbstractContextManager[Iterator[bytes]]:
        return self._open(repo_id, commit, variant, file, offset)

    @contextmanager
    def _open(
        self, repo_id: str, commit: str, variant: str, file: RemoteFile, offset: int
    ) -> Iterator[Iterator[bytes]]:
        try:
            with self.inner.open_file(repo_id, commit, variant, file, offset=offset) as chunks:
                yield chunks
        except Exception as exc:
            self._failed(exc)
            raise
        self._ok()


def _token(cfg: UpstreamConfig, source: str, index: int) -> str | None:
    if cfg.token_file is None:
        return None
    try:
        return cfg.token_file.read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise ConfigError(
            source, f"upstream[{index}].token_file", f"cannot read: {exc.strerror or exc}"
        ) from exc


def _keys(cfg: Config, up: UpstreamConfig, index: int) -> dict[str, Ed25519PublicKey] | None:
    """The keys a mirror's signatures are checked against, if it requires signatures."""
    if not up.require_signatures:
        return None
    from kerneld.mirror.keys import KeyFileError, trusted_key_set

    where = f"upstream[{index}].require_signatures"
    if not cfg.trusted_keys:
        raise ConfigError(
            cfg.source, where, "no [mirror] trusted_keys to check this mirror's signatures with"
        )
    try:
        return trusted_key_set(cfg.trusted_keys)
    except KeyFileError as exc:
        raise ConfigError(cfg.source, "mirror.trusted_keys", str(exc)) from None


def build_upstreams(cfg: Config) -> list[TrackedUpstream]:
    """The configured chain, in priority order (the first upstream is asked first)."""
    policy = RetryPolicy(attempts=cfg.fetch_attempts, timeout=cfg.fetch_timeout_s)
    chain: list[TrackedUpstream] = []
    for i, up in enumerate(cfg.upstreams):
        inner: Upstream
        if up.kind == "hub":
            from kerneld.upstream.hub import HubUpstream  # imports huggingface_hub: only if used

            inner = HubUpstream(
                endpoint=up.location or None,
                token=_token(up, cfg.source, i),
                policy=policy,
                name=up.name,
            )
        elif up.kind == "mirror-dir":
            from kerneld.mirror.upstream import MirrorDirUpstream

            inner = MirrorDirUpstream(
                Path(up.location), name=up.name, policy=policy, trusted_keys=_keys(cfg, up, i)
            )
        else:
            from kerneld.mirror.upstream import MirrorHttpUpstream

            inner = MirrorHttpUpstream(
                up.location, name=up.name, policy=policy, trusted_keys=_keys(cfg, up, i)
            )
        chain.append(TrackedUpstream(inner, up, i))
    return chain
