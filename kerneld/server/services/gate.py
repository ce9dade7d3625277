"""The daemon's side of the acquire path: what it decides around the sequence, and for whom.

The sequence itself (deny, ref, deny, names, trust, hold, lookup, fetch, lookup again,
dependencies) is `kerneld.pipeline.acquire`'s, the same for every front end and for the store
tools; `DaemonGate` is the `AcquireGate` the daemon gives it, and the caller-facing half of
its policy that the front ends apply before they let a request reach the upstreams:

1. field bounds (`check_fields`): a repo id, revision, variant and path within the limits of
   `bounds.py`, the same on every route;
2. publisher trust (`check_publisher`): asked of the Hub only once the repo is known to exist
   (the acquire path asks once a kernel's commit is listed), so a made-up name costs no Hub
   request and leaves no verdict behind; an organisation's overview alone (`org_verdict`) is
   charged to the caller's fetch budget;
3. the fetch gate (`open_network`, `may_fetch`): `[fetch] allow`, `allow_groups` and the
   caller's per-uid budget, with one audit line per decision;
4. every fetch counted as in-flight work (`work`) and recorded in the fetch history
   (`fetched`), whoever asked.

Denies are the store's rows, checked by the acquire path; provenance is the store's readers'
(`store.catalog.lookup`, `published_files`), which refuse an unverified tree while signatures are
required.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from kerneld.config import Config
from kerneld.pipeline.fetch import FetchResult
from kerneld.pipeline.publisher_trust import PublisherTrust, UntrustedPublisher
from kerneld.pipeline.request import FetchNotAllowed
from kerneld.server.plumbing.identity import Caller, FetchGate, audit
from kerneld.server.services.bounds import check_kernel_fields
from kerneld.server.services.fetch_history import FetchHistory
from kerneld.server.statuses import RateLimited

log = logging.getLogger("kerneld.acquire")


class GateHost(Protocol):
    """What the gate needs of the daemon (kerneld.server.core.Core implements it)."""

    @property
    def config(self) -> Config: ...

    @property
    def trust(self) -> PublisherTrust: ...

    @property
    def fetch_gate(self) -> FetchGate: ...

    @property
    def fetches(self) -> FetchHistory: ...

    def work(self) -> AbstractContextManager[None]: ...


class DaemonGate:
    """The daemon's policy for getting a kernel (`kerneld.pipeline.acquire.AcquireGate`, and
    the front ends' fetch gate)."""

    def __init__(self, host: GateHost) -> None:
        self.host = host

    # ---- 1-2: what may be asked for ---------------------------------------------------------

    @staticmethod
    def check_fields(repo_id: str, revision: str = "", variant: str = "", path: str = "") -> None:
        """RequestTooLarge (INVALID_ARGUMENT) for a field over its bound."""
        check_kernel_fields(repo_id, revision, variant, path)

    def check_publisher(
        self, repo_id: str, *, trust_remote_code: bool, parents: Sequence[str] = ()
    ) -> None:
        """UntrustedPublisher (or PublisherUnverified) unless jobs may run `repo_id`'s code.
        Call it only for a repo known to exist: it may ask the Hub about its organisation."""
        try:
            self.host.trust.check(repo_id, trust_remote_code=trust_remote_code)
        except UntrustedPublisher as exc:
            if not parents:
                raise
            raise UntrustedPublisher(
                f"dependency {repo_id} of {parents[0]}: {exc.message}",
                repo_id=parents[0],
                hint=exc.hint,
            ) from exc

    def org_verdict(self, org: str, caller: Caller | None) -> bool:
        """Does this host trust every kernel of `org` (a Hub client's organisation overview)?
        A remembered verdict costs nothing; asking the Hub costs the caller one fetch of its
        budget. PublisherUnknown when the Hub has no such organisation, PublisherUnverified
        when it cannot be asked."""
        remembered = self.host.trust.remembered(org)
        if remembered is not None:
            return remembered
        self._charge(caller, f"org={org}", "overview", f"overview:{org}")
        try:
            self.host.trust.check(f"{org}/*", trust_remote_code=False)
        except UntrustedPublisher:
            return False
        return True

    # ---- 3: who may make the daemon ask its upstreams -----------------------------------------

    def may_fetch(self, caller: Caller | None, repo_id: str) -> bool:
        """Would `open_network` admit this caller for this repo (nothing spent, nothing logged)?"""
        cfg = self.host.config
        if not cfg.fetch_allowed(repo_id):
            return False
        return caller is None or self.host.fetch_gate.may_fetch(caller, cfg.fetch_allow_gids())

    def open_network(self, caller: Caller | None, repo_id: str, what: str, route: str) -> None:
        """Admit a request that makes the daemon ask its upstreams (a download, a ref or a
        listing it does not have), or raise FetchNotAllowed / RateLimited. A caller's
        decision is one audit line either way; the daemon's own work (caller None) passes
        `[fetch] allow` only."""
        cfg = self.host.config
        if not cfg.fetch_allowed(repo_id):
            raise FetchNotAllowed(
                "not in this host's store, and the fetch policy ([fetch] allow) does not let "
                "clients download this kernel",
                repo_id=repo_id,
            )
        if caller is None:
            return
        if not self.host.fetch_gate.may_fetch(caller, cfg.fetch_allow_gids()):
            refusal = FetchNotAllowed(
                "not in this host's store, and the fetch policy ([fetch] allow_groups = "
                f"{list(cfg.fetch_allow_groups)}) lets only members of those groups download; "
                f"the caller ({caller}) is not one",
                repo_id=repo_id,
            )
            audit(caller, route, what, f"fetch refused ({type(refusal).__name__})")
            raise refusal
        self._charge(caller, what, route, what)
        audit(caller, route, what, "fetch allowed")

    def _charge(self, caller: Caller | None, what: str, route: str, key: str) -> None:
        """Spend one of the caller's fetches (RateLimited, audited, when none is left)."""
        if caller is None:
            return
        cfg = self.host.config
        try:
            self.host.fetch_gate.take(
                caller,
                per_minute=cfg.fetch_per_uid_rate,
                burst=cfg.fetch_per_uid_burst,
                what=key,
            )
        except RateLimited as exc:
            audit(caller, route, what, f"fetch refused ({type(exc).__name__})")
            raise

    # ---- 4: in-flight work and the fetch history ----------------------------------------------

    def work(self) -> AbstractContextManager[None]:
        """A fetch is in-flight work: a shutdown waits for it."""
        return self.host.work()

    def fetched(
        self,
        repo_id: str,
        commit: str,
        variant: str,
        result: FetchResult | None,
        error: BaseException | None,
    ) -> None:
        """One fetch ended, whoever asked for it: the fetch history and its metrics."""
        self.host.fetches.record(repo_id, commit, variant, result, error)
