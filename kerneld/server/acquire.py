"""The one gate every front end passes to get a kernel: each decision is taken here, once.

Front ends only translate: gRPC `Resolve` and `ListVariants` (`serving.py`), the Hub API
endpoint (`kerneld.server.hubapi.view`), `kerneldctl prefetch` and the configured prefetch
(`kerneld.pipeline.prefetch`, through `Core.prefetch`) and the scrub's re-fetch (`scrubber.py`) call
this service; the published index publishes only what it would answer (the store leaves out
what the provenance gate refuses, and `publishers.json` holds only the trust verdicts below).
The decisions, in the order a request meets them:

1. field bounds (`check_fields`): a repo id, revision, variant and path within the limits of
   `bounds.py`, the same on every route;
2. deny (`check_denied`): `kerneldctl deny` of the repo, the ref, or the commit it names;
3. publisher trust (`check_publisher`, `admitter`): asked of the Hub only once the repo is known
   to exist (its ref resolved, from the store or upstream), so a made-up name costs no Hub
   request and leaves no verdict behind; an organisation's overview alone (`org_verdict`) is
   charged to the caller's fetch budget;
4. provenance: the store's readers that hand out a tree (`store.catalog.lookup`, `published_files`)
   refuse an unverified one themselves while signatures are required, for every caller;
5. the fetch gate (`open_network`, `may_fetch`): `[fetch] allow`, `allow_groups` and the
   caller's per-uid budget, with one audit line per decision;
6. the fetch (`fetch_variant`): single-flight and verified (`kerneld.pipeline.fetch.Fetcher`,
   which only this service holds), recorded in the fetch history whoever asked.

Refs, variant choice, holds and dependencies are the resolver's (`kerneld.pipeline.resolve`);
it calls back here for 2-3 once it knows a kernel's commit (`admitter`) and for 6 (`fetch_variant`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from kerneld.config import Config
from kerneld.pipeline.fetch import Fetcher, FetchResult
from kerneld.pipeline.fetch_progress import FetchProgressFn
from kerneld.pipeline.resolve import Admit, FetchNotAllowed, KernelSpec
from kerneld.server.bounds import check_kernel_fields
from kerneld.server.fetch_history import FetchHistory
from kerneld.server.identity import Caller, FetchGate, audit
from kerneld.server.publisher_trust import PublisherTrust, UntrustedPublisher
from kerneld.server.statuses import RateLimited
from kerneld.store import ResolveTarget
from kerneld.upstream.base import Upstream

log = logging.getLogger("kerneld.acquire")


class AcquireHost(Protocol):
    """What the gate needs of the daemon (kerneld.server.core.Core implements it)."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> ResolveTarget: ...

    @property
    def trust(self) -> PublisherTrust: ...

    @property
    def fetch_gate(self) -> FetchGate: ...

    @property
    def fetches(self) -> FetchHistory: ...

    def work(self) -> AbstractContextManager[None]: ...


class Acquire:
    """The daemon's policy for getting a kernel, and the only holder of its fetcher."""

    def __init__(self, host: AcquireHost, fetcher: Fetcher) -> None:
        self.host = host
        self._fetcher = fetcher

    def reconfigure(self, upstreams: Sequence[Upstream]) -> None:
        """A reload changed the upstream chain: later fetches use the new one."""
        self._fetcher.upstreams = list(upstreams)

    # ---- 1-3: what may be asked for ---------------------------------------------------------

    @staticmethod
    def check_fields(repo_id: str, revision: str = "", variant: str = "", path: str = "") -> None:
        """RequestTooLarge (INVALID_ARGUMENT) for a field over its bound."""
        check_kernel_fields(repo_id, revision, variant, path)

    def check_denied(self, repo_id: str, ref: str, commit: str | None = None) -> None:
        """DeniedError when an admin denied the repo, the ref, or the commit it names."""
        self.host.store.names.check_denied(repo_id, ref, commit)

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

    def admitter(self, *, trust_remote_code: bool) -> Admit:
        """The check the resolver makes once it knows a kernel's commit (which proves the repo
        exists), before it lists or fetches anything of it: the deny of that commit, then
        publisher trust. Dependencies pass it too, before they are fetched."""

        def admit(spec: KernelSpec, commit: str, parents: Sequence[str]) -> None:
            self.check_denied(spec.repo_id, spec.ref, commit)
            self.check_publisher(spec.repo_id, trust_remote_code=trust_remote_code, parents=parents)

        return admit

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

    # ---- 5: who may make the daemon ask its upstreams -----------------------------------------

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

    # ---- 6: the fetch ---------------------------------------------------------------------------

    def fetch_variant(
        self,
        repo_id: str,
        commit: str,
        variant: str,
        *,
        progress: FetchProgressFn | None = None,
    ) -> FetchResult:
        """Download, verify and publish one variant (single-flight: concurrent callers share
        one download), counted as in-flight work and recorded in the fetch history."""
        host = self.host
        with host.work():
            try:
                result = self._fetcher.fetch_variant(repo_id, commit, variant, progress=progress)
            except Exception as exc:
                host.fetches.record(repo_id, commit, variant, None, exc)
                raise
        host.fetches.record(repo_id, commit, variant, result, None)
        return result
