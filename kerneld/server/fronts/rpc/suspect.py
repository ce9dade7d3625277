"""ReportSuspect: a job says a tree of the store looks damaged; the daemon checks for itself.

Why: a job under `KERNELD_VERIFY=1` that finds a tree whose bytes no longer match refuses it and
falls back, but the tree stayed in service until the next scrub (weekly by default) or an
admin's `kerneldctl verify --repair`, so every other job on the host met the same damage.

A report is a hint, never evidence: anyone who can reach the user socket can send one, for any
digest, with any reason. So the daemon

- bounds the request (`convert.check_report`) and rate-limits reports per caller uid with the
  token buckets of fetches (`identity.FetchGate`, a set of buckets of its own, so reports do
  not spend a user's download budget): a check may re-hash a whole tree;
- re-hashes the tree itself against its own manifest, at full speed, as the scrub confirms a
  finding (`store.scrub.check_tree`). A tree checked within `RECHECK_AFTER_S` is
  not hashed again (the ranks of one job find the same damage together): the answer is that
  check's verdict. One check per tree at a time, at most `MAX_CHECKS` trees at once;
- only for damage it confirmed takes the tree out of service (`store.repair.invalidate`: the rows go
  dead, the files go into the quarantine, nothing is deleted) and hands the invalidated
  variants to the scrubber's `heal` (re-fetch from the upstreams, then drop the quarantined
  copies they replaced), on a thread of its own so the caller's answer never waits for a
  download. The quarantine entry records who reported it and why (forensics).

One audit line per report names the caller (uid from the kernel, not the request), what it
said (repo, commit, variant, tree, reason) and the verdict; `kerneld_suspect_reports_total`
counts reports by verdict.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from kerneld.server.fronts.rpc import convert
from kerneld.server.plumbing.identity import Caller, FetchGate, audit
from kerneld.server.plumbing.metrics import Metrics
from kerneld.server.services.bounds import clip
from kerneld.server.statuses import RateLimited, ReportsRateLimited
from kerneld.store import InvalidInputError, ReportTarget
from kerneld.store.scrub import Damage, ScrubReport
from kerneld_client.proto import kerneld_pb2 as pb

log = logging.getLogger("kerneld.report")

#: Reports one uid may send at once, and per minute after that (anonymous callers share one
#: budget; root and the daemon's own uid are not limited, as for fetches).
REPORT_BURST = 10
REPORTS_PER_MINUTE = 10.0
#: A tree checked this recently is not hashed again for a report: its verdict is the answer.
RECHECK_AFTER_S = 60.0
#: Trees checked at once for reports (each check reads a whole tree from disk).
MAX_CHECKS = 2
#: How long a report waits for a free check slot before it is refused (RESOURCE_EXHAUSTED).
SLOT_WAIT_S = 5.0
#: How long a report waits for another report's check of the same tree to end (a large tree on
#: a slow disk), before it is refused (RESOURCE_EXHAUSTED) rather than hold an RPC thread.
FLIGHT_WAIT_S = 30.0
#: Verdicts remembered (one per tree digest).
MAX_REMEMBERED = 4096

_VERDICTS = {
    "intact": pb.ReportSuspectResponse.INTACT,
    "damaged": pb.ReportSuspectResponse.DAMAGED,
    "unknown": pb.ReportSuspectResponse.UNKNOWN_TREE,
}


@dataclass(frozen=True)
class Finding:
    """What the daemon's own check of a reported tree found."""

    verdict: str
    """intact, damaged or unknown (the store serves no such tree)."""
    digest: str
    """Tree digest, hex."""
    detail: str
    variants: tuple[tuple[str, str, str], ...] = ()
    """(repo, commit, variant) published from the tree; for damaged, those invalidated."""
    quarantined: tuple[str, ...] = ()
    refetch_scheduled: bool = False
    checked_at: float = field(default_factory=time.time)
    remembered: bool = False
    """The verdict of an earlier check (within RECHECK_AFTER_S): not hashed for this report."""


@dataclass(frozen=True)
class _Memo:
    finding: Finding
    at: float
    """Monotonic time of the check."""
    created_at: float | None
    """The checked tree row's creation time (None: not live): a tree published again since
    (the re-fetch of a damaged one has the same digest) is a different tree to check."""


class _Flight:
    """One check of one tree at a time; the others wait for it and take its verdict."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


def _shown(text: str, limit: int = 96) -> str:
    """A caller's string for a log line: control characters replaced, clipped."""
    return clip("".join(c if c.isprintable() else "?" for c in text[: limit * 4]), limit)


def to_proto(finding: Finding) -> pb.ReportSuspectResponse:
    out = pb.ReportSuspectResponse(
        verdict=_VERDICTS[finding.verdict],
        tree_digest=f"sha256:{finding.digest}",
        detail=finding.detail,
        refetch_scheduled=finding.refetch_scheduled,
        quarantine_entries=list(finding.quarantined),
        remembered=finding.remembered,
        checked_at=convert.ts(finding.checked_at),
    )
    out.variants.extend(
        pb.VariantRef(repo_id=r, commit=c, variant=v) for r, c, v in finding.variants
    )
    return out


class Healer(Protocol):
    """The scrubber's half of a confirmed finding: count it, and re-fetch what it took out."""

    def record_damage(self, damage: Damage) -> None: ...

    def heal(self, report: ScrubReport) -> int: ...


class SuspectHost(Protocol):
    """What the desk uses of the daemon (the wiring's `Core` implements it)."""

    @property
    def metrics(self) -> Metrics: ...

    @property
    def store(self) -> ReportTarget: ...

    @property
    def scrubber(self) -> Healer: ...


class SuspectDesk:
    """Answers ReportSuspect for one daemon (see the module docstring)."""

    def __init__(self, core: SuspectHost, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = core
        self.clock = clock
        self.gate = FetchGate(clock)
        self._lock = threading.Lock()
        self._memo: OrderedDict[str, _Memo] = OrderedDict()
        self._flights: dict[str, _Flight] = {}
        self._slots = threading.BoundedSemaphore(MAX_CHECKS)

    # ---- the RPC ---------------------------------------------------------------------------

    def handle(self, caller: Caller, request: pb.ReportSuspectRequest) -> Finding:
        """Check, count and log one report; errors (bounds, rate limit, store) propagate to the
        service, which maps them (server/statuses.py)."""
        what = (
            f"repo={_shown(request.repo_id) or '-'} commit={_shown(request.commit) or '-'} "
            f"variant={_shown(request.variant) or '-'} tree={_shown(request.tree_digest) or '-'} "
            f"reason={_shown(request.reason, 300)!r}"
        )
        try:
            hexd = convert.check_report(request)
            finding = self.report(caller, hexd, reason=request.reason)
        except Exception as exc:
            label = (
                "rate_limited"
                if isinstance(exc, RateLimited)
                else "invalid"
                if isinstance(exc, ValueError | InvalidInputError)
                else "error"
            )
            self.core.metrics.suspect_reports.labels(label).inc()
            outcome = label.replace("_", "-")
            audit(caller, "ReportSuspect", what, f"{outcome} ({_shown(str(exc), 200)})")
            raise
        self.core.metrics.suspect_reports.labels(finding.verdict).inc()
        serves = ",".join(f"{r}@{c[:12]}/{v}" for r, c, v in finding.variants) or "-"
        outcome = finding.verdict + (" (remembered)" if finding.remembered else "")
        if finding.quarantined:
            outcome += f" quarantined={','.join(finding.quarantined)}"
        if finding.refetch_scheduled:
            outcome += " refetch=scheduled"
        audit(caller, "ReportSuspect", f"{what} serves={serves}", f"{outcome}: {finding.detail}")
        return finding

    def report(self, caller: Caller, hexd: str, *, reason: str = "") -> Finding:
        """The verdict on tree `hexd`: remembered, or checked now (one check per tree)."""
        try:
            self.gate.take(caller, per_minute=REPORTS_PER_MINUTE, burst=REPORT_BURST)
        except RateLimited as exc:
            who = f"uid {caller.uid}" if caller.known else "anonymous callers (no token)"
            raise ReportsRateLimited(
                f"too many ReportSuspect calls from {who}: at most {REPORT_BURST} at once and "
                f"{REPORTS_PER_MINUTE:g} per minute; retry in {exc.retry_after_s:.1f}s",
                retry_after_s=exc.retry_after_s,
            ) from None
        store = self.core.store
        remembered = self._recall(store, hexd)
        if remembered is not None:
            return remembered
        with self._lock:
            flight = self._flights.setdefault(hexd, _Flight())
            flight.users += 1
        try:
            if not flight.lock.acquire(timeout=FLIGHT_WAIT_S):
                raise ReportsRateLimited(
                    "this tree is being checked for another report and the check is still "
                    "running; retry in a while for its verdict",
                    retry_after_s=FLIGHT_WAIT_S,
                )
            try:
                remembered = self._recall(store, hexd)  # the check this one waited for
                if remembered is not None:
                    return remembered
                if not self._slots.acquire(timeout=SLOT_WAIT_S):
                    raise ReportsRateLimited(
                        f"the daemon is already checking {MAX_CHECKS} reported trees; retry in "
                        "a few seconds",
                        retry_after_s=SLOT_WAIT_S,
                    )
                try:
                    finding, created_at = self._check(store, hexd, caller, reason)
                finally:
                    self._slots.release()
                with self._lock:
                    self._memo[hexd] = _Memo(finding, self.clock(), created_at)
                    self._memo.move_to_end(hexd)
                    while len(self._memo) > MAX_REMEMBERED:
                        self._memo.popitem(last=False)
                return finding
            finally:
                flight.lock.release()
        finally:
            with self._lock:
                flight.users -= 1
                if flight.users == 0:
                    self._flights.pop(hexd, None)

    # ---- checking --------------------------------------------------------------------------

    def _recall(self, store: ReportTarget, hexd: str) -> Finding | None:
        """The verdict of a recent check of this very tree, if it still holds."""
        with self._lock:
            memo = self._memo.get(hexd)
        if memo is None or self.clock() - memo.at >= RECHECK_AFTER_S:
            return None
        row = store.catalog.tree(hexd)
        live = row is not None and row.state == "live"
        if live and (row is None or memo.created_at != row.created_at):
            return None  # published (again) since: a tree nobody has checked yet
        if not live and memo.finding.verdict == "intact":
            return None  # gone since the check: say what it is now
        return replace(memo.finding, remembered=True)

    def _check(
        self, store: ReportTarget, hexd: str, caller: Caller, reason: str
    ) -> tuple[Finding, float | None]:
        """Re-hash the tree; on confirmed damage take it out of service and start the heal."""
        row = store.catalog.tree(hexd)
        if row is None or row.state != "live":
            return self._unknown(store, hexd), None
        variants = tuple(
            (v.repo, v.commit, v.variant) for v in store.catalog.variants_of_tree(hexd)
        )
        # The scrubber logs and counts each confirmed problem, as for damage a pass finds.
        report = store.scrub.check_tree(hexd, on_damage=self.core.scrubber.record_damage)
        if report.trees_checked == 0:  # collected between the lookup and the check
            return self._unknown(store, hexd), None
        if not report.damage:
            return (
                Finding(
                    "intact",
                    hexd,
                    f"re-hashed {report.bytes_hashed} bytes: every file matches the tree's "
                    "manifest (content, size, mode, owner; none missing, none extra)",
                    variants,
                ),
                row.created_at,
            )
        problems = [d.problem for d in report.damage]
        first = problems[0]
        detail = f"{first.kind} {first.object}: {first.path}: {first.detail}"
        if len(problems) > 1:
            detail += f" (+{len(problems) - 1} more)"
        now = time.time()
        names = []
        for q in report.quarantined:
            names.append(q.name)
            try:  # who told, and why: read with the entry before it is restored or dropped
                store.quarantine.annotate(
                    q.name,
                    {
                        "by": "report",
                        "reported_by": str(caller),
                        "report_reason": reason,
                        "reported_at": now,
                    },
                )
            except Exception as exc:  # replaced and dropped meanwhile, or the store closing
                log.debug("report: could not annotate %s: %r", q.name, exc)
        invalidated = tuple(dict.fromkeys(report.invalidated))
        scheduled = bool(invalidated)
        if scheduled:
            self._heal_later(report, hexd)
        else:
            detail += "; nothing was taken out of service (it was no longer live)"
        finding = Finding(
            "damaged", hexd, detail, invalidated or variants, tuple(names), scheduled, now
        )
        return finding, row.created_at

    def _unknown(self, store: ReportTarget, hexd: str) -> Finding:
        held = tuple(
            q.name for q in store.quarantine.entries() if q.object == "tree" and q.id == hexd
        )
        if held:
            detail = (
                f"not served: taken out of service earlier (quarantine entry {held[-1]}); its "
                "variants are fetched again where an upstream has them"
            )
        else:
            detail = (
                "this daemon's store serves no tree with this digest (never published here, "
                "or collected since)"
            )
        return Finding("unknown", hexd, detail, (), held)

    def _heal_later(self, report: ScrubReport, hexd: str) -> None:
        """Re-fetch the invalidated variants and settle the quarantine, off the RPC thread."""

        def run() -> None:
            try:
                refetched = self.core.scrubber.heal(report)
            except Exception as exc:  # the store closing: the next scrub or Resolve heals it
                log.error("report: re-fetch after tree sha256:%s failed: %r", hexd, exc)
                return
            kept = [q.name for q in report.quarantined if q.path.exists()]
            log.info(
                "report: tree sha256:%s healed: %d/%d variant(s) re-fetched; quarantine %s",
                hexd,
                refetched,
                len(dict.fromkeys(report.invalidated)),
                f"keeps {', '.join(kept)}" if kept else "entries dropped (served again)",
            )

        threading.Thread(target=run, name="report-heal", daemon=True).start()
