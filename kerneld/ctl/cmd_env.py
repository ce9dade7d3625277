"""env: LOCAL_KERNELS for the `kernels` package, pointing at this store's trees.

Reads the store directly (read-only): each repo maps to the variant tree that fits this host
(or the one named with `--variant`), at the asked ref, else the highest vN, else main. Only
what a job would be given: the daemon's verdicts, as it publishes them for the warm path
(kerneld/store/published_index.py), are applied first (`refusal`): denies, `[trust]` and, under
`[provenance] policy = "require"`, signatures. A refused kernel is skipped with one line that
says why and what to do (an error when it was named).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneld.ctl.common import EXIT_FAILURE, EXIT_OK, CtlError, Ctx, open_store
from kerneld.ctl.subcommands import Commands

if TYPE_CHECKING:
    from kerneld.ctl.specs import Spec


def _pick_commit(store: Any, repo: str, spec: Spec | None) -> str | None:
    """The commit `env` maps a repo to: the asked ref, else the highest vN, else main, else
    the most recently published commit."""
    if spec is not None and spec.ref is not None:
        found: str | None = store.names.resolve_revision(repo, spec.ref)
        return found
    refs: dict[str, str] = {r.ref: r.commit for r in store.names.refs_of(repo)}
    versions = sorted(
        (int(m.group(1)), c) for r, c in refs.items() if (m := re.fullmatch(r"v(\d+)", r))
    )
    if versions:
        return versions[-1][1]
    if "main" in refs:
        return refs["main"]
    rows = store.catalog.variants_of(repo)
    if not rows:
        return None
    latest: str = max(rows, key=lambda v: v.published_at).commit
    return latest


#: The variant is chosen for the interpreter kerneldctl runs in. A system install's is
#: /opt/kerneld's, which has no torch: there only noarch builds fit, while the job that reads
#: LOCAL_KERNELS has torch. Said whenever a build for torch was turned down for that reason.
_NO_TORCH = (
    f"{sys.executable} has no torch, so only builds without it fit; for a job with torch, "
    "pass --variant NAME, or set KERNELD_PLATFORM_JSON to the job's platform"
)


def refusal(root: Path, repo: str, revision: str, commit: str, variant: str) -> str | None:
    """Why the daemon would refuse `repo`@`commit`'s `variant` to a job, by the verdicts it
    published (None: it would hand it out): a deny, an untrusted publisher, or a tree left out
    of the index because its signature is not verified while signatures are required."""
    from kerneld_client import published_index as pi

    try:
        doc = pi.read_repo_index(root, repo, owner_uid=None)
        publishers = pi.read_publishers(root, owner_uid=None)
    except (OSError, pi.IndexFormatError) as exc:
        return f"cannot read the daemon's published verdicts ({exc}): ask the daemon instead"
    if doc is not None:
        reason = doc.deny_reason(revision, commit) or doc.deny_reason(commit, commit)
        if reason is not None:
            return f"denied by the administrator: {reason} (an admin may `kerneldctl allow` it)"
    if publishers is not None and not publishers.trusts(repo, trust_remote_code=False):
        org = repo.split("/", 1)[0]
        return (
            f"{org} is not a trusted kernel publisher on this host: ask an admin to add "
            f"{org}/* to [trust] allow"
        )
    entry = None if doc is None else doc.commits.get(commit)
    if doc is not None and (entry is None or variant not in entry.variants):
        return (
            "its signature is not verified and this site requires signed kernels "
            '([provenance] policy = "require"; `kerneldctl ls` shows why): ask the publisher '
            "for a signed build, or an admin to add its signer to [provenance] identities"
        )
    return None


def cmd_env(ctx: Ctx) -> int:
    """LOCAL_KERNELS for the `kernels` package: repo -> the store's best variant tree here."""
    from kerneld.ctl.specs import parse_spec
    from kerneld.store import StoreError
    from kerneld_client.variants import decide

    specs = [parse_spec(s) for s in ctx.args.kernels or []]
    wanted = {s.repo_id: s for s in specs}
    facts = None
    torch_builds_left_out = False  # chosen for an interpreter without torch: see _NO_TORCH
    entries: list[dict[str, Any]] = []
    skipped: list[str] = []
    with open_store(ctx, writable=False) as store:
        repos = list(wanted) if wanted else store.names.repos()
        for repo in repos:
            commit = _pick_commit(store, repo, wanted.get(repo))
            names = store.catalog.variants(repo, commit) if commit else []
            if commit is None or not names:
                skipped.append(f"{repo}: not in the store")
                continue
            torch_left_out = False  # this repo's builds for torch turned down: see _NO_TORCH
            if ctx.args.variant:
                chosen = ctx.args.variant if ctx.args.variant in names else None
            else:
                if facts is None:
                    from kerneld_client.platform import platform_facts

                    facts = platform_facts()
                decisions = decide(names, facts)
                accepted = [d.variant for d in decisions if d.accepted]
                chosen = accepted[0] if accepted else None
                torch_left_out = facts.torch_version is None and any(
                    not d.accepted and d.parsed is not None and d.parsed.torch_version is not None
                    for d in decisions
                )
                torch_builds_left_out = torch_builds_left_out or torch_left_out
            if chosen is None:
                hint = f" ({_NO_TORCH})" if torch_left_out else ""
                skipped.append(f"{repo}@{commit}: no variant in the store fits this host{hint}")
                continue
            spec = wanted.get(repo)
            asked = spec.ref if spec is not None and spec.ref is not None else commit
            why = refusal(store.root, repo, asked, commit, chosen)
            if why is not None:
                skipped.append(f"{repo}@{commit[:12]}: {why}")
                continue
            try:
                hit = store.catalog.lookup(repo, commit, chosen)
            except StoreError as exc:  # a deny the index has not published yet
                skipped.append(f"{repo}@{commit[:12]}: {exc}")
                continue
            if hit is None:
                skipped.append(f"{repo}@{commit}: {chosen} vanished")
                continue
            path = str(hit.path)
            if ":" in path or "=" in path:
                raise CtlError(
                    f"store path {path} contains ':' or '=': LOCAL_KERNELS cannot hold it"
                )
            entries.append({"repo_id": repo, "commit": commit, "variant": chosen, "path": path})
    value = ":".join(f"{e['repo_id']}={e['path']}" for e in entries)
    for s in skipped:
        ctx.note(f"kerneldctl env: skipped {s}")
    if torch_builds_left_out:
        ctx.note(f"kerneldctl env: builds for torch were left out: {_NO_TORCH}")
    if ctx.json:
        ctx.emit_json({"LOCAL_KERNELS": value, "kernels": entries, "skipped": skipped})
    else:
        ctx.out.write(f"LOCAL_KERNELS={value}\n")
    if specs and skipped:
        return EXIT_FAILURE
    return EXIT_OK


def register(commands: Commands) -> None:
    p = commands.add(
        "env",
        cmd_env,
        "Print LOCAL_KERNELS=org/a=/path:... for the store's kernels (for code that uses the "
        "`kernels` package directly).",
        "  kerneldctl env\n  export $(kerneldctl env kernels-community/activation:1)\n",
        commands.store_only,
    )
    p.add_argument("kernels", nargs="*", metavar="KERNEL", help="only these (org/name[:N|@REV])")
    p.add_argument(
        "--variant",
        metavar="NAME",
        help="use this variant instead of the best one for the interpreter kerneldctl runs in "
        "(a system install's has no torch: only builds without torch fit there)",
    )
