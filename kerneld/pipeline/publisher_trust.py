"""Publisher trust: may jobs on this host run a kernel published by this organisation?

`kernels` refuses a kernel unless the Hub lists its organisation as a trusted kernel publisher
(`GET /api/organizations/{org}/overview` -> `trustedKernelPublisher`) or the caller passes
`trust_remote_code`. The daemon applies the same rule to every job on the host (`[trust]` in
kerneld.toml), with an allow-list for sites whose daemon cannot ask the Hub.

The Hub's "trusted" answers are remembered for `[trust] ttl` and written to the published index
(`index/v1/publishers.json`), for two reasons: the warm path reads the index and never asks the
daemon, so it must see the same verdicts; and a restart during a Hub outage must not stop
cached kernels of trusted publishers (the file is read back at start, and an answer past its
TTL is still used while the Hub cannot be asked, as a stale ref is).

What a caller can make the daemon remember is bounded: only trusted organisations are
published (at most `MAX_TRUSTED` of them, each one the Hub vouches for), a "no" is kept in a
small in-memory LRU (`MAX_REFUSED`) that is never published, and callers ask about an
organisation only through the acquire path and its gate, which ask for a repo that exists (in
the store, or resolved upstream) or charge the question to the caller's fetch budget. An
organisation the Hub does not know reads as "could not verify", not as "untrusted".

publishers.json, format version 1::

    {"format": "kerneld-publishers", "version": 1,
     "policy": "hub" | "allow-list" | "any",
     "allow": ["org/*", "org/name"],            # [trust] allow
     "honor_trust_remote_code": true,
     "orgs": {"org": {"trusted": true, "checked_at": 1767225600.0}},   # the Hub's "yes"es
     "repos": {"org/name": {"trusted": true, "imported_at": 1767225600.0, "by": "import"}}}

`repos` are the verdicts signed mirror imports carried (kerneld/mirror/verdicts.py): the
exporting site trusted these repos' publisher. Under policy "hub" they count like the Hub's
answers, for their repo only, and never expire or get re-asked: the next import is their
authority (an import-only host has no Hub to ask). `[trust] allow`, policy "allow-list"/"any"
and denies decide as before.

A reader trusts a repo if the policy is "any", a pattern of `allow` matches it, or `orgs` says
its organisation is trusted; anything else (no file, an unknown format) is a question for the
daemon.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kerneld.config import Config
from kerneld.errors import ErrorKind, WireCode
from kerneld.mirror.verdicts import imported_repos, repos_entry
from kerneld.pipeline.resolve import ResolveError
from kerneld.upstream.errors import OrgNotFound, UpstreamError, UpstreamUnavailable
from kerneld_client.vocabulary import repo_key

log = logging.getLogger("kerneld.trust")

FORMAT = "kerneld-publishers"
VERSION = 1
FILE_NAME = "publishers.json"

FAILED_RETRY_S = 30.0
"""After the Hub could not be asked about an organisation, it is not asked again for this
long: an outage costs each organisation one slow request per half minute, not one per job."""

MAX_TRUSTED = 4096
"""Trusted organisations kept (and published); past it the oldest answer is dropped (a job of
that organisation then asks the daemon, which asks the Hub again)."""
MAX_REFUSED = 256
"""Organisations the Hub said "no" about, or does not know, or could not be asked about: kept
in memory only (LRU), so that made-up names can neither grow publishers.json nor the daemon."""
_LOCKS = 64

HINT_UNTRUSTED = (
    "pass trust_remote_code=True (or list the repo in trust_remote_code) if you trust its "
    "code, or ask an admin to add it to [trust] allow in kerneld.toml"
)
HINT_NO_OVERRIDE = "ask an admin to add it to [trust] allow in kerneld.toml"


def allow_hint(hint: str, org: str) -> str:
    """`hint` with the exact line an admin adds (a refused prefetch is the admin's own)."""
    return (
        f'{hint} (`allow = ["{org}/*"]` under [trust] in /etc/kerneld/kerneld.toml, then '
        "`systemctl reload kerneld`)"
    )


class NoHubUpstream(UpstreamError):
    """The daemon has no Hub upstream, so only `[trust] allow` can vouch for a publisher."""


class PublisherUnverified(UpstreamUnavailable):
    """The Hub could not be asked whether the publisher is trusted, and it never answered
    before: not a refusal, an outage (UNAVAILABLE: the job falls back and may try again)."""

    hint = (
        "the Hub could not be reached to check the publisher; retry later, or ask an admin to "
        "add it to [trust] allow in kerneld.toml"
    )


class PublisherUnknown(PublisherUnverified):
    """The Hub has no such organisation: it can neither vouch for it nor refuse it, so the
    kernel reads as "could not verify" (what `kernels` says when the overview fails)."""

    hint = "ask an admin to add it to [trust] allow in kerneld.toml if you trust its code"


class UntrustedPublisher(ResolveError):
    """The kernel's publisher is not trusted by this host's `[trust]` policy."""

    kind = ErrorKind.DENIED
    wire_code: WireCode = "UNTRUSTED_PUBLISHER"

    def __init__(self, message: str, *, repo_id: str, hint: str) -> None:
        super().__init__(message, repo_id=repo_id)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Verdict:
    trusted: bool
    checked_at: float


AskHub = Callable[[str], bool]
"""The Hub's answer for an organisation: is it a trusted kernel publisher? (OrgNotFound when
the Hub does not know it, another UpstreamError when it cannot be asked.)"""


def org_of(repo_id: str) -> str:
    """The organisation a verdict is kept under: in lower case, as the Hub's organisation
    names are unique case-insensitively (`GoodCorp/x` is goodcorp's), so a case variant is
    neither a second question to the Hub nor a second entry in the bounded tables."""
    return repo_key(repo_id.split("/", 1)[0])


class PublisherTrust:
    """The `[trust]` policy with the Hub's remembered answers; thread-safe."""

    def __init__(
        self,
        config: Config,
        ask_hub: AskHub | None,
        publish: Callable[[dict[str, Any]], None],
        *,
        saved: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.ask_hub = ask_hub
        self._publish = publish
        self._clock = clock
        self._lock = threading.Lock()
        self._asking = tuple(threading.Lock() for _ in range(_LOCKS))
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict(
            sorted(_read_verdicts(saved).items(), key=lambda kv: kv[1].checked_at)[-MAX_TRUSTED:]
        )
        """Trusted organisations (published), oldest answer first."""
        self._imported: dict[str, float] = imported_repos(saved)
        """Repos signed mirror imports vouched for (repo_key form) -> when."""
        self._refused: OrderedDict[str, Verdict] = OrderedDict()
        """The Hub's "no"s (LRU, not published)."""
        self._failed: OrderedDict[str, tuple[float, str]] = OrderedDict()
        """Organisations the Hub could not be asked about (or does not know: reason "unknown"),
        and when (LRU)."""

    # ---- the check ------------------------------------------------------------------------

    def known(self, repo_id: str, *, trust_remote_code: bool) -> bool:
        """Trusted without asking anyone (the warm path's question; False: ask `check`)."""
        cfg = self.config
        if self._overridden(repo_id, trust_remote_code):
            return True
        if self._vouched_by_import(repo_id):
            return True
        with self._lock:
            verdict = self._verdicts.get(org_of(repo_id))
        return (
            cfg.trust_publishers == "hub"
            and verdict is not None
            and self._clock() < verdict.checked_at + cfg.trust_ttl_s
        )

    def _vouched_by_import(self, repo_id: str) -> bool:
        with self._lock:
            return self.config.trust_publishers == "hub" and repo_key(repo_id) in self._imported

    def record_imported(self, vouched: Mapping[str, str]) -> None:
        """A signed mirror import's verdicts: the exporting site trusted these repos'
        publishers (repo -> how: "hub", "allow", "any"). Kept and published until replaced."""
        if not vouched:
            return
        now = self._clock()
        with self._lock:
            for repo in vouched:
                self._imported[repo_key(repo)] = now
        for repo, by in sorted(vouched.items()):
            log.info(
                "publisher trusted repo=%s (a signed mirror import: %s at the exporting site)",
                repo,
                by,
            )
        self.publish()

    def remembered(self, org: str) -> bool | None:
        """The verdict for a whole organisation without asking anyone: True or False while an
        answer is within its TTL (or the Hub is failing), None when only the Hub can say."""
        cfg = self.config
        if cfg.trust_publishers == "any" or cfg.publisher_allowed(f"{org}/*"):
            return True
        if cfg.trust_publishers == "allow-list":
            return False
        org = repo_key(org)
        now = self._clock()
        with self._lock:
            verdict = self._verdicts.get(org) or self._refused.get(org)
            failed = self._failed.get(org)
        if verdict is not None and (
            now < verdict.checked_at + cfg.trust_ttl_s
            or (failed is not None and now < failed[0] + FAILED_RETRY_S)
        ):
            return verdict.trusted
        return None

    def check(self, repo_id: str, *, trust_remote_code: bool) -> None:
        """Return if jobs may run `repo_id`'s code; UntrustedPublisher otherwise, or
        PublisherUnverified when the Hub cannot say (an outage, or no such organisation)."""
        cfg = self.config
        if self._overridden(repo_id, trust_remote_code):
            return
        org = org_of(repo_id)
        hint = allow_hint(HINT_UNTRUSTED if cfg.trust_honor_remote_code else HINT_NO_OVERRIDE, org)
        if self._vouched_by_import(repo_id):
            return
        if cfg.trust_publishers == "allow-list":
            raise UntrustedPublisher(
                f"not from a trusted publisher: {org} is not a trusted kernel publisher on this "
                "host: it is not in [trust] "
                "allow (this host trusts no other publishers: [trust] publishers = "
                '"allow-list")',
                repo_id=repo_id,
                hint=hint,
            )
        verdict = self._hub_verdict(org, repo_id, hint)
        if not verdict.trusted:
            raise UntrustedPublisher(
                f"not from a trusted publisher: {org} is not a trusted kernel publisher (the "
                "Hub's organisation overview says trustedKernelPublisher: false)",
                repo_id=repo_id,
                hint=hint,
            )

    def _overridden(self, repo_id: str, trust_remote_code: bool) -> bool:
        cfg = self.config
        return (
            cfg.trust_publishers == "any"
            or cfg.publisher_allowed(repo_id)
            or (trust_remote_code and cfg.trust_honor_remote_code)
        )

    def _remembered_verdict(self, org: str) -> tuple[Verdict | None, tuple[float, str] | None]:
        with self._lock:
            verdict = self._verdicts.get(org) or self._refused.get(org)
            if org in self._refused:
                self._refused.move_to_end(org)
            return verdict, self._failed.get(org)

    def _hub_verdict(self, org: str, repo_id: str, hint: str) -> Verdict:
        now = self._clock()
        verdict, failed = self._remembered_verdict(org)
        if verdict is not None and now < verdict.checked_at + self.config.trust_ttl_s:
            return verdict
        # One question per organisation at a time (striped: a bounded set of locks whatever
        # the names asked about); the others wait for its answer.
        with self._asking[zlib.crc32(org.encode()) % _LOCKS]:
            newer, failed = self._remembered_verdict(org)
            if newer is not None and newer is not verdict:
                return newer
            if failed is None or now >= failed[0] + FAILED_RETRY_S:
                try:
                    return self._ask(org)
                except NoHubUpstream:
                    failed = (now, "")
                except OrgNotFound:
                    failed = (now, "unknown")
                    self._remember_failure(org, failed)
                except UpstreamError as exc:
                    failed = (now, str(exc))
                    self._remember_failure(org, failed)
                    log.warning("trust check failed org=%s repo=%s: %s", org, repo_id, exc)
        if verdict is not None:  # the Hub cannot be asked: its last answer stands, as a stale ref
            return verdict
        if failed and failed[1] == "unknown":
            raise PublisherUnknown(
                f"could not verify that {org} is a trusted kernel publisher: the Hub has no "
                f"organisation {org}",
                repo_id=repo_id,
            )
        if failed and failed[1]:
            raise PublisherUnverified(
                f"could not verify that {org} is a trusted kernel publisher: the Hub could not "
                f"be asked ({failed[1]})",
                repo_id=repo_id,
            )
        raise UntrustedPublisher(
            f"not from a trusted publisher: could not verify that {org} is a trusted kernel "
            "publisher: this daemon has no Hub upstream to ask, and [trust] allow does not list it",
            repo_id=repo_id,
            hint=hint,
        )

    def _remember_failure(self, org: str, failed: tuple[float, str]) -> None:
        with self._lock:
            self._failed[org] = failed
            self._failed.move_to_end(org)
            while len(self._failed) > MAX_REFUSED:
                self._failed.popitem(last=False)

    def _ask(self, org: str) -> Verdict:
        if self.ask_hub is None:
            raise NoHubUpstream("no Hub upstream is configured")
        verdict = Verdict(bool(self.ask_hub(org)), self._clock())
        with self._lock:
            previous = self._verdicts.pop(org, None) or self._refused.pop(org, None)
            self._failed.pop(org, None)
            if verdict.trusted:
                self._verdicts[org] = verdict
                while len(self._verdicts) > MAX_TRUSTED:
                    self._verdicts.popitem(last=False)
            else:
                self._refused[org] = verdict
                while len(self._refused) > MAX_REFUSED:
                    self._refused.popitem(last=False)
        if previous is None or previous.trusted != verdict.trusted:
            log.info("publisher org=%s trusted=%s (the Hub's answer)", org, verdict.trusted)
        if verdict.trusted or (previous is not None and previous.trusted):
            self.publish()  # only the trusted set is published: a "no" changes nothing there
        return verdict

    def recheck_due(self) -> float:
        """Ask the Hub again about every trusted organisation whose answer is past its TTL:
        jobs on the warm path use the published answer without asking the daemon, so nothing
        else would notice a publisher losing the Hub's trust. Seconds until the next is due."""
        cfg = self.config
        if cfg.trust_publishers != "hub":
            return cfg.trust_ttl_s
        now = self._clock()
        with self._lock:
            trusted = {o: v.checked_at + cfg.trust_ttl_s for o, v in self._verdicts.items()}
            retry = {o: f[0] + FAILED_RETRY_S for o, f in self._failed.items()}
        next_at = now + cfg.trust_ttl_s
        for org, expires in trusted.items():
            due_at = max(expires, retry.get(org, 0.0))
            if due_at > now:
                next_at = min(next_at, due_at)
                continue
            try:
                self._ask(org)
            except NoHubUpstream:  # mirrors only: nobody to ask; the last answer stands
                next_at = now + cfg.trust_ttl_s
                break
            except UpstreamError as exc:  # its last answer stands meanwhile
                self._remember_failure(org, (now, str(exc)))
                log.warning("trust re-check failed org=%s: %s; asked again later", org, exc)
                next_at = min(next_at, now + FAILED_RETRY_S)
        return max(0.0, next_at - self._clock())

    # ---- the published verdicts -----------------------------------------------------------

    def document(self) -> dict[str, Any]:
        cfg = self.config
        with self._lock:
            orgs = {
                org: {"trusted": True, "checked_at": v.checked_at}
                for org, v in sorted(self._verdicts.items())
            }
            imported = dict(self._imported)
        return {
            "format": FORMAT,
            "version": VERSION,
            "policy": cfg.trust_publishers,
            "allow": list(cfg.trust_allow),
            "honor_trust_remote_code": cfg.trust_honor_remote_code,
            "orgs": orgs if cfg.trust_publishers == "hub" else {},
            "repos": repos_entry(imported) if cfg.trust_publishers == "hub" else {},
        }

    def publish(self) -> None:
        """Write the policy and the Hub's answers for the warm path (best effort: a job that
        cannot read them asks the daemon)."""
        try:
            self._publish(self.document())
        except OSError as exc:
            log.warning("could not publish the trusted publishers: %s", exc)

    def reconfigure(self, config: Config) -> None:
        self.config = config
        self.publish()


def _read_verdicts(saved: Mapping[str, Any] | None) -> dict[str, Verdict]:
    """The Hub's "yes"es from a previous run's publishers.json (nothing if it is not ours; a
    "no" written by an older kerneld is asked again)."""
    if not saved or saved.get("format") != FORMAT or saved.get("version") != VERSION:
        return {}
    out: dict[str, Verdict] = {}
    orgs = saved.get("orgs")
    if isinstance(orgs, dict):
        for org, raw in orgs.items():
            if isinstance(raw, dict) and raw.get("trusted") is True:
                checked = raw.get("checked_at")
                if isinstance(checked, int | float):
                    out[repo_key(str(org))] = Verdict(raw["trusted"], float(checked))
    return out
