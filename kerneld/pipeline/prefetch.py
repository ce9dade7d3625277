"""Prefetch: fetch the variants this host will be asked for before anyone asks.

Which variants ("auto" mode), per kernel revision:
- for each torch version wanted (the configured `prefetch.torch`, plus those clients have shown;
  when neither names one, the newest torch version the revision has builds for) and each backend
  the host can run (CPU always; CUDA for every CUDA version in the revision that the NVIDIA
  driver runs; ROCm/XPU for the host's exact version when it is known): the variant a process
  with those facts would load (`kerneld_client.variants.decide`, the client's own rules);
- for each backend, the noarch variant a process without a matching arch build falls back to;
- for each platform a client has actually shown in `Resolve`: the variant it would load.
"all" fetches every variant; explicit names fetch exactly those.

A failure in one kernel (or one variant) never stops the others. Refs are refreshed from the
upstreams (ignoring the TTL), so a `vN` branch that moved is fetched before clients need it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kerneld.errors import ErrorKind
from kerneld.pipeline.acquire import Acquire
from kerneld.pipeline.fetch_progress import FetchProgress, FetchProgressFn
from kerneld.pipeline.hardware import Hardware
from kerneld.pipeline.plans import Listed, Listing
from kerneld.pipeline.request import KernelSpec, NoVariantFits
from kerneld.pipeline.resolve import Resolver
from kerneld.store import Hold, PrefetchTarget
from kerneld_client.variants import (
    Backend,
    BackendType,
    PlatformFacts,
    Variant,
    VariantKind,
    decide,
    parse_variant,
)
from kerneld_client.vocabulary import is_commit

log = logging.getLogger("kerneld.prefetch")

PLATFORMS_FORMAT = "kerneld-client-platforms"
MAX_PLATFORMS = 64


# ---- platforms clients have shown --------------------------------------------------------------


def _normalise(facts: PlatformFacts) -> PlatformFacts:
    """Drop what does not change the variant choice (devices, Python micro version)."""
    py = facts.python_version
    return replace(facts, device_capabilities=(), python_version=(py[0], py[1], 0))


def platforms_file(store_root: Path) -> Path:
    """Where the daemon keeps the platforms its clients showed (inside its store directory)."""
    return store_root / "daemon" / "platforms.json"


def saved_client_platforms(store_root: Path) -> list[PlatformFacts]:
    """The platforms the store's daemon saved: a tool that opens the store while the daemon
    is stopped republishes the index with their picks, as the daemon would."""
    return ClientPlatforms(platforms_file(store_root)).all()


class ClientPlatforms:
    """The distinct platforms clients showed in `Resolve`, most recent first, kept on disk so a
    restarted daemon still prefetches for them. Bounded (`limit`), cheap to record."""

    def __init__(
        self,
        path: Path | None,
        *,
        limit: int = MAX_PLATFORMS,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.limit = limit
        self.on_change = on_change
        """Called (on the recording thread) after a platform not seen before was saved."""
        self._lock = threading.Lock()
        self._seen: dict[PlatformFacts, float] = {}
        self._keys: dict[PlatformFacts, PlatformFacts] = {}
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable client platforms file %s: %s", path, exc)
            return
        if not isinstance(doc, dict) or doc.get("format") != PLATFORMS_FORMAT:
            log.warning("ignoring client platforms file %s: unknown format", path)
            return
        for item in doc.get("platforms", []):
            try:
                facts = _normalise(PlatformFacts.from_dict(item["facts"]))
                self._seen[facts] = float(item.get("last_seen", 0.0))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignoring a client platform in %s: %s", path, exc)

    def record(self, facts: PlatformFacts) -> bool:
        """Remember `facts`; True when it is a platform not seen before (then saved)."""
        now = time.time()
        with self._lock:
            key = self._keys.get(facts)
            if key is not None and key in self._seen:  # the warm path: a known platform
                self._seen[key] = now
                return False
        key = _normalise(facts)
        with self._lock:
            if len(self._keys) > 4 * self.limit:
                self._keys.clear()
            self._keys[facts] = key
            new = key not in self._seen
            self._seen[key] = now
            if not new:
                return False
            if len(self._seen) > self.limit:
                oldest = min(self._seen, key=self._seen.__getitem__)
                del self._seen[oldest]
            snapshot = dict(self._seen)
        log.info("new client platform: %s", key.describe())
        self._save(snapshot)
        if self.on_change is not None:
            self.on_change()
        return True

    def _save(self, seen: dict[PlatformFacts, float]) -> None:
        if self.path is None:
            return
        doc = {
            "format": PLATFORMS_FORMAT,
            "version": 1,
            "platforms": [
                {"facts": f.to_dict(), "last_seen": t}
                for f, t in sorted(seen.items(), key=lambda kv: -kv[1])
            ],
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot save client platforms to %s: %s", self.path, exc)
            tmp.unlink(missing_ok=True)

    def all(self) -> list[PlatformFacts]:
        with self._lock:
            return [f for f, _ in sorted(self._seen.items(), key=lambda kv: -kv[1])]

    def torch_versions(self) -> set[tuple[int, int]]:
        return {f.torch_version for f in self.all() if f.torch_version is not None}


# ---- which variants ----------------------------------------------------------------------------


def _parsed(names: Iterable[str]) -> list[Variant]:
    return [v for v in (parse_variant(n) for n in names) if isinstance(v, Variant)]


def _best(names: Sequence[str], facts: PlatformFacts) -> str | None:
    for decision in decide(names, facts):
        return decision.variant if decision.accepted else None
    return None


def host_backends(hardware: Hardware, names: Sequence[str]) -> list[Backend]:
    """Backends (with versions) whose arch variants can run here, given the revision's names."""
    out: list[Backend] = []
    for backend in hardware.backends():
        if backend.type is BackendType.CUDA:
            driver = backend.version
            if driver is None:
                continue
            versions = {
                v.backend.version
                for v in _parsed(names)
                if v.backend is not None
                and v.backend.type is BackendType.CUDA
                and v.backend.version is not None
                and v.backend.version <= driver
            }
            out.extend(Backend(BackendType.CUDA, ver) for ver in sorted(versions))
        elif backend.type is BackendType.CPU or backend.version is not None:
            out.append(backend)
    return out


def plan_variants(
    names: Sequence[str],
    *,
    hardware: Hardware,
    torch_versions: Iterable[tuple[int, int]] = (),
    client_platforms: Sequence[PlatformFacts] = (),
    platforms: Sequence[PlatformFacts] = (),
) -> dict[str, str]:
    """The variants to prefetch ("auto" mode), each with why. `platforms`, when given, replaces
    host detection and client platforms."""
    chosen: dict[str, str] = {}

    def take(facts: PlatformFacts, why: str) -> None:
        best = _best(names, facts)
        if best is not None:
            chosen.setdefault(best, why)

    if platforms:
        for facts in platforms:
            take(facts, f"requested platform ({facts.describe()})")
        return chosen

    torch = set(torch_versions)
    if not torch:
        arch = [v.torch_version for v in _parsed(names) if v.kind is VariantKind.TORCH_ARCH]
        if arch:
            torch = {max(t for t in arch if t is not None)}
    caps = {"cuda": hardware.capabilities("nvidia"), "rocm": hardware.capabilities("amd")}
    # kernels 0.19 builds name a minimum Python (`cpython-3.12`): a job's Python decides, not
    # the daemon's; the Pythons clients showed, else the daemon's own as the best guess.
    pythons = sorted({(*f.python_version[:2], 0) for f in client_platforms}) or [
        (*sys.version_info[:2], 0)
    ]
    for backend in host_backends(hardware, names):
        base = PlatformFacts(
            cpu=hardware.cpu,
            os=hardware.os,
            backend=backend,
            device_capabilities=caps.get(backend.type.value, ()),
        )
        for version in sorted(torch):
            for python in pythons:
                facts = replace(
                    base,
                    torch_version=version,
                    cxx11_abi=True if hardware.os == "linux" else None,
                    python_version=python,
                )
                take(facts, f"host {backend.label}, torch {version[0]}.{version[1]}")
    for backend in hardware.backends():  # noarch fallbacks, whatever the versions
        for python in pythons:
            take(
                PlatformFacts(
                    cpu=hardware.cpu, os=hardware.os, backend=backend, python_version=python
                ),
                f"noarch for {backend.label}",
            )
    for facts in client_platforms:
        take(facts, f"client platform ({facts.describe()})")
    return chosen


# ---- running -----------------------------------------------------------------------------------


@dataclass
class PrefetchSummary:
    kernels_ok: int = 0
    kernels_failed: int = 0
    variants_fetched: int = 0
    variants_present: int = 0
    bytes: int = 0
    errors: list[tuple[str, BaseException]] = field(default_factory=list)


Emit = Callable[[FetchProgress], None]


class Cancelled(Exception):
    """The caller went away (the RPC was cancelled, or the daemon is stopping)."""

    kind = ErrorKind.INTERNAL


class Prefetcher:
    """Runs prefetches over one store and resolver; safe to run from several threads (the
    fetcher's single-flight keeps any variant from being downloaded twice at once).

    Every kernel goes through `acquire` (`kerneld.pipeline.acquire`) with a `Listed` plan: in
    the daemon with its gate, so a prefetch passes the same denies and publisher trust as a
    job's Resolve (and so records the publisher's verdict, which the published index needs for
    the first job to load without asking the daemon); in a store tool (`kerneldctl prefetch
    --store`) with the allow-all gate."""

    def __init__(
        self,
        store: PrefetchTarget,
        resolver: Resolver,
        acquire: Acquire,
        *,
        hardware: Callable[[], Hardware],
        client_platforms: ClientPlatforms,
        configured_torch: Iterable[tuple[int, int]] = (),
    ) -> None:
        self.store = store
        #: `prefetch.torch`; the daemon replaces it on reload.
        self.configured_torch = tuple(configured_torch)
        self.resolver = resolver
        self.acquire = acquire
        self.hardware = hardware
        self._said_no_gpu = False
        self.client_platforms = client_platforms

    def reconfigure(self, *, configured_torch: Iterable[tuple[int, int]]) -> None:
        """A reload's `prefetch.torch`."""
        self.configured_torch = tuple(configured_torch)

    def run(
        self,
        specs: Sequence[KernelSpec],
        *,
        variants: Sequence[str] = (),
        torch_versions: Iterable[tuple[int, int]] = (),
        platforms: Sequence[PlatformFacts] = (),
        refresh: bool = True,
        emit: Emit | None = None,
        cancel: threading.Event | None = None,
        quiet: bool = False,
    ) -> PrefetchSummary:
        """Prefetch `specs` (and their kernel-depends); `variants` is empty/["auto"], ["all"]
        or names. `torch_versions` adds to (or, if given, replaces) the configured set.
        `quiet`: failures are only in the summary, for a caller that reports them itself (an
        import-only host's timer: once, not a warning per kernel per tick)."""
        summary = PrefetchSummary()
        send = emit or (lambda _u: None)
        queue = list(dict.fromkeys(specs))
        seen = set(queue)
        torch = set(torch_versions)
        # Everything this prefetch fetched or found stays held until it ends: a later variant's
        # reservation may not evict an earlier one. What does not fit under the cap beside the
        # rest fails with ResourceExhaustedError (RESOURCE_EXHAUSTED), never silently.
        with self.store.holds.hold() as hold:
            while queue:
                if cancel is not None and cancel.is_set():
                    raise Cancelled("prefetch cancelled")
                spec = queue.pop(0)
                try:
                    deps = self._one(
                        spec,
                        variants,
                        torch,
                        platforms,
                        refresh,
                        send,
                        summary,
                        cancel,
                        hold,
                        quiet,
                    )
                except Cancelled:
                    raise
                except Exception as exc:
                    summary.kernels_failed += 1
                    summary.errors.append((str(spec), exc))
                    if not quiet:
                        log.warning(
                            "prefetch failed repo=%s ref=%s error=%s", spec.repo_id, spec.ref, exc
                        )
                    send(FetchProgress.failed(spec.repo_id, "", "", exc))
                    continue
                for dep in deps:
                    if dep not in seen:
                        seen.add(dep)
                        queue.append(dep)
        send(
            FetchProgress(
                "finished", kernels_ok=summary.kernels_ok, kernels_failed=summary.kernels_failed
            )
        )
        return summary

    def _one(
        self,
        spec: KernelSpec,
        variants: Sequence[str],
        torch: set[tuple[int, int]],
        platforms: Sequence[PlatformFacts],
        refresh: bool,
        send: Emit,
        summary: PrefetchSummary,
        cancel: threading.Event | None,
        hold: Hold,
        quiet: bool = False,
    ) -> list[KernelSpec]:
        """One kernel through the acquire path (a `Listed` plan): its planned variants in the
        store, the events and log lines on the way; the kernels they depend on."""
        repo = spec.repo_id
        asked_at = self.resolver.clock()

        def choose(listing: Listing) -> dict[str, str]:
            plan = self._plan(listing.names, variants, torch, platforms)
            if not plan:
                raise NoVariantFits(
                    [],
                    repo_id=repo,
                    revision=listing.commit,
                    detail=_no_plan(listing.names, variants),
                )
            send(
                FetchProgress(
                    "kernel-started",
                    repo,
                    listing.commit,
                    files_total=len(plan),
                    stale=listing.stale,
                )
            )
            return plan

        def before(_variant: str) -> None:
            if cancel is not None and cancel.is_set():
                raise Cancelled("prefetch cancelled")

        # The ref is moved below, once the new commit's trees are here (record=False).
        batch = self.acquire.acquire(
            spec,
            Listed(choose, before),
            refresh=refresh,
            record=False,
            hold=hold,
            progress=_file_events(send),
        )
        commit, stale = batch.listing.commit, batch.listing.stale
        failures: list[tuple[str, BaseException]] = []
        deps: list[KernelSpec] = []
        fetched = present = 0
        for outcome in batch.outcomes:
            variant, hit = outcome.variant, outcome.hit
            if outcome.error is not None:
                failures.append((variant, outcome.error))
                if not quiet:
                    log.warning(
                        "prefetch variant failed repo=%s commit=%s variant=%s error=%s",
                        repo,
                        commit,
                        variant,
                        outcome.error,
                    )
                continue
            assert hit is not None  # an outcome without an error has its tree
            deps.extend(outcome.dependencies)
            already = outcome.fetched is None
            if outcome.fetched is None:
                present += 1
            else:
                fetched += 1
                summary.bytes += outcome.fetched.bytes_downloaded
            send(
                FetchProgress(
                    "variant-done",
                    repo,
                    commit,
                    variant,
                    path=str(hit.path),
                    tree_digest=hit.digest,
                    already_present=already,
                )
            )
            log.debug(
                "prefetch %s repo=%s commit=%s variant=%s why=%s",
                "present" if already else "fetched",
                repo,
                commit,
                variant,
                outcome.why,
            )
        summary.variants_fetched += fetched
        summary.variants_present += present
        log.info(
            "prefetch repo=%s ref=%s commit=%s%s variants=%s fetched=%d present=%d failed=%d",
            repo,
            spec.ref,
            commit,
            " (stale ref)" if stale else "",
            ",".join(o.variant for o in batch.outcomes) or "-",
            fetched,
            present,
            len(failures),
        )
        if not stale:
            self._move_ref(spec, commit, asked_at, complete=not failures)
        if failures:
            bad_variant, error = failures[0]
            summary.kernels_failed += 1
            summary.errors.append((f"{spec}/{bad_variant}", error))
            send(FetchProgress.failed(repo, commit, bad_variant, error))
        else:
            summary.kernels_ok += 1
            send(FetchProgress("kernel-done", repo, commit, files_done=len(batch.outcomes)))
        return deps

    def _move_ref(self, spec: KernelSpec, commit: str, asked_at: float, *, complete: bool) -> None:
        """Record the upstream's answer for `spec`'s ref. A ref that moves to a new commit moves
        only when every planned variant of that commit is in the store (jobs then switch to
        it without downloading); until then they keep the commit they had."""
        if spec.locked_commit is not None or is_commit(spec.ref):
            return
        if not self.resolver.upstreams:
            return  # import-only: nothing was asked; the ref stays the last import's
        known = self.store.names.get_ref(spec.repo_id, spec.ref)
        if complete or known is None or known.commit == commit:
            self.store.names.set_ref(spec.repo_id, spec.ref, commit, fetched_at=asked_at)
        else:
            log.warning(
                "not moving ref repo=%s ref=%s from %s to %s: some of its variants could not "
                "be fetched; jobs keep the old commit until they are",
                spec.repo_id,
                spec.ref,
                known.commit,
                commit,
            )

    def _plan(
        self,
        names: Sequence[str],
        variants: Sequence[str],
        torch: set[tuple[int, int]],
        platforms: Sequence[PlatformFacts],
    ) -> dict[str, str]:
        modes = [v for v in variants if v] or ["auto"]
        out: dict[str, str] = {}
        for mode in modes:
            if mode == "all":
                out.update((n, "all variants") for n in names if n not in out)
            elif mode == "auto":
                clients = self.client_platforms.all()
                wanted = set(torch) or {
                    *self.configured_torch,
                    *(f.torch_version for f in clients if f.torch_version is not None),
                }
                hardware = self.hardware()
                if not hardware.gpus and not self._said_no_gpu:
                    self._said_no_gpu = True  # once per daemon: what `auto` means here
                    log.info("no GPU detected; prefetching CPU variants")
                for name, why in plan_variants(
                    names,
                    hardware=hardware,
                    torch_versions=wanted,
                    client_platforms=clients,
                    platforms=platforms,
                ).items():
                    out.setdefault(name, why)
            else:
                out.setdefault(mode, "requested")
        return out


def _file_events(send: Emit) -> FetchProgressFn:
    """A fetch's progress as a prefetch's events: its files; the variant's own start and end
    are the prefetch's."""

    def progress(event: FetchProgress) -> None:
        kind = {
            "variant-started": "file-progress",
            "file-progress": "file-progress",
            "file-done": "file-done",
        }.get(event.kind)
        if kind is not None:
            send(replace(event, kind=kind))

    return progress


def _no_plan(names: Sequence[str], variants: Sequence[str]) -> str:
    """Why a prefetch found nothing to fetch, and what to do about it."""
    listed = ", ".join(sorted(names)) or "none"
    if not names:
        return "the commit has no build variants (no build/ folder, or an empty one)"
    return (
        f"none of its variants ({listed}) is one this host's GPUs, torch versions and the "
        "platforms its clients showed would load; name the variants to fetch (--variant NAME "
        "or --variant all) or the torch versions (--torch 2.13)"
        if not [v for v in variants if v not in ("", "auto")]
        else f"none of the requested variants exists (it has: {listed})"
    )


def parse_torch_versions(values: Iterable[str]) -> set[tuple[int, int]]:
    """`["2.12", "2.13"]` -> {(2, 12), (2, 13)}; ValueError names the bad one."""
    out = set()
    for text in values:
        parts = text.strip().split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"torch version must be MAJOR.MINOR, got {text!r}")
        out.add((int(parts[0]), int(parts[1])))
    return out
