"""env: LOCAL_KERNELS for the `kernels` package, pointing at this store's trees.

Reads the store directly (read-only): each repo maps to the variant tree that fits this host
(or the one named with `--variant`), at the asked ref, else the highest vN, else main.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kerneld.ctl.common import EXIT_FAILURE, EXIT_OK, CtlError, Ctx, open_store
from kerneld.ctl.subcommands import Commands

if TYPE_CHECKING:
    from kerneld.ctl.specs import Spec


def _pick_commit(store: Any, repo: str, spec: Spec | None) -> str | None:
    """The commit `env` maps a repo to: the asked ref, else the highest vN, else main, else
    the most recently published commit."""
    if spec is not None and spec.ref is not None:
        found: str | None = store.resolve_revision(repo, spec.ref)
        return found
    refs: dict[str, str] = {r.ref: r.commit for r in store.refs_of(repo)}
    versions = sorted(
        (int(m.group(1)), c) for r, c in refs.items() if (m := re.fullmatch(r"v(\d+)", r))
    )
    if versions:
        return versions[-1][1]
    if "main" in refs:
        return refs["main"]
    rows = store.variants_of(repo)
    if not rows:
        return None
    latest: str = max(rows, key=lambda v: v.published_at).commit
    return latest


def cmd_env(ctx: Ctx) -> int:
    """LOCAL_KERNELS for the `kernels` package: repo -> the store's best variant tree here."""
    from kerneld.ctl.specs import parse_spec
    from kerneld_client.variants import decide

    specs = [parse_spec(s) for s in ctx.args.kernels or []]
    wanted = {s.repo_id: s for s in specs}
    facts = None
    entries: list[dict[str, Any]] = []
    skipped: list[str] = []
    with open_store(ctx, writable=False) as store:
        repos = list(wanted) if wanted else store.repos()
        for repo in repos:
            commit = _pick_commit(store, repo, wanted.get(repo))
            names = store.variants(repo, commit) if commit else []
            if not names:
                skipped.append(f"{repo}: not in the store")
                continue
            if ctx.args.variant:
                chosen = ctx.args.variant if ctx.args.variant in names else None
            else:
                if facts is None:
                    from kerneld_client.platform import platform_facts

                    facts = platform_facts()
                accepted = [d.variant for d in decide(names, facts) if d.accepted]
                chosen = accepted[0] if accepted else None
            if chosen is None:
                skipped.append(f"{repo}@{commit}: no variant in the store fits this host")
                continue
            hit = store.lookup(repo, commit, chosen)
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
    p.add_argument("--variant", metavar="NAME", help="use this variant instead of the best one")
