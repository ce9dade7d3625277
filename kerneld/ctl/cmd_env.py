"""env: LOCAL_KERNELS for the `kernels` package, pointing at this store's trees.

Reads what the daemon publishes to jobs (kerneld/store/published_index.py), not its SQLite
database: a job's user can read the former on a system install (kerneld-users), only the
daemon's user the latter, and the published index is by definition what a job would be given.
Each repo maps to the variant tree that fits (or the one named with `--variant`), at the asked
ref or commit (a unique prefix will do), else the highest vN, else main. The variant is chosen
for the platform of the interpreter kerneldctl runs in, or of the job's, named with `--python`
(`job_platform`: a system install's own has no torch). The daemon's published verdicts apply
as on the warm path: denies, `[trust]`, and under `[provenance] policy = "require"` only
verified trees are published. A refused kernel is skipped with one line that says why and
what to do (an error when it was named).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneld.ctl.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CtlError,
    Ctx,
    PermissionDenied,
    store_path,
)
from kerneld.ctl.subcommands import Commands

if TYPE_CHECKING:
    from kerneld.ctl.specs import Spec
    from kerneld_client.published_index import Publishers, RepoIndex
    from kerneld_client.variants import PlatformFacts


def _pick_commit(doc: RepoIndex, spec: Spec | None) -> str | None:
    """The commit `env` maps a repo to: the asked ref or commit (a unique prefix of a
    published commit, as git abbreviates), else the highest vN, else main."""
    if spec is not None and spec.ref is not None:
        from kerneld_client.vocabulary import is_commit_prefix  # not at parser build time

        asked = spec.ref
        found = doc.commit_for(asked)
        if found is None and is_commit_prefix(asked):
            matches = [c for c in doc.commits if c.startswith(asked)]
            found = matches[0] if len(matches) == 1 else None
        return found
    versions = sorted(
        (int(m.group(1)), commit)
        for ref, (commit, _) in doc.refs.items()
        if (m := re.fullmatch(r"v(\d+)", ref))
    )
    if versions:
        return versions[-1][1]
    main = doc.refs.get("main")
    return None if main is None else main[0]


def _no_torch(python: str) -> str:
    """Why builds for torch were turned down: the interpreter the variant is chosen for (by
    default kerneldctl's own; a system install's, /opt/kerneld's, has none) has no torch,
    while the job that reads LOCAL_KERNELS may. Said whenever that turned a build down."""
    return (
        f"{python} has no torch, so only builds without it fit; for a job with torch, pass "
        "--python with the job's interpreter (or --variant NAME)"
    )


#: A commit with no published tree: not fetched, or its trees were not verified while the
#: site requires signatures (the index leaves those out, and does not say which it was).
_NOTHING_PUBLISHED = (
    "no tree of it is published to jobs: it was not fetched (`kerneldctl prefetch`), or this "
    'site requires signed kernels ([provenance] policy = "require") and its trees are not '
    "verified (`kerneldctl ls` shows why; ask the publisher for a signed build, or an admin "
    "to add its signer to [provenance] identities)"
)


def refusal(
    doc: RepoIndex, publishers: Publishers | None, revision: str, commit: str
) -> str | None:
    """Why the daemon would refuse `commit` of `doc`'s repo to a job, by the verdicts it
    published (None: it would hand it out): a deny, or an untrusted publisher."""
    reason = doc.deny_reason(revision, commit) or doc.deny_reason(commit, commit)
    if reason is not None:
        return f"denied by the administrator: {reason} (an admin may `kerneldctl allow` it)"
    if publishers is not None and not publishers.trusts(doc.repo, trust_remote_code=False):
        org = doc.repo.split("/", 1)[0]
        return (
            f"{org} is not a trusted kernel publisher on this host: ask an admin to add "
            f"{org}/* to [trust] allow"
        )
    return None


#: Who may read the published index on a system install.
_READERS = "jobs' users may read it: join kerneld-users, or run as the store's owner"


class _Published:
    """The store's published index, read as a job would read it (no ownership check: this
    command hands out paths, it does not import them)."""

    def __init__(self, root: Path) -> None:
        from kerneld_client import published_index as pi

        self.root, self._pi = root, pi
        self.folder = pi.index_dir(root)
        try:
            if not self.folder.is_dir():
                raise CtlError(
                    f"no kerneld store with a published index at {root}",
                    hint="give the store's path with --store (a daemon publishes its index "
                    "when it starts)",
                )
            self.publishers: Publishers | None = pi.read_publishers(root, owner_uid=None)
        except PermissionError as exc:
            raise PermissionDenied(
                f"cannot read the store at {root}: {exc.strerror}",
                hint=_READERS,
            ) from None
        except pi.IndexFormatError as exc:
            raise CtlError(f"cannot read the daemon's published verdicts: {exc}") from None

    def repos(self) -> list[str]:
        """Every repo with a document, by its file's name (org/name)."""
        try:
            return sorted(
                f"{org.name}/{doc.stem}"
                for org in self.folder.iterdir()
                if org.is_dir()
                for doc in org.glob("*.json")
                if not doc.name.startswith(".")  # a document being written
            )
        except PermissionError as exc:
            raise PermissionDenied(
                f"cannot list the published index at {self.folder}: {exc.strerror}",
                hint=_READERS,
            ) from None

    def doc(self, repo: str) -> RepoIndex | None:
        """`repo`'s document, its name compared as the Hub does (`Org/Name` is `org/name`)."""
        from kerneld_client.vocabulary import repo_key

        try:
            doc = self._pi.read_repo_index(self.root, repo, owner_uid=None)
            if doc is None:
                spelled = [r for r in self.repos() if repo_key(r) == repo_key(repo)]
                if spelled:
                    doc = self._pi.read_repo_index(self.root, spelled[0], owner_uid=None)
        except PermissionError as exc:
            raise PermissionDenied(
                f"cannot read the published index of {repo}: {exc.strerror}",
                hint=_READERS,
            ) from None
        except self._pi.IndexFormatError as exc:
            raise CtlError(f"the published index of {repo} is unreadable: {exc}") from None
        return doc


def cmd_env(ctx: Ctx) -> int:
    """LOCAL_KERNELS for the `kernels` package: repo -> the store's best variant tree here."""
    from kerneld.ctl.specs import parse_spec
    from kerneld_client.variants import decide

    specs = [parse_spec(s) for s in ctx.args.kernels or []]
    wanted = {s.repo_id: s for s in specs}
    python = ctx.args.python or sys.executable  # whose platform the variants are chosen for
    where = f"the platform of {ctx.args.python}" if ctx.args.python else "this host"
    facts = None
    torch_builds_left_out = False  # chosen for an interpreter without torch: see _no_torch
    entries: list[dict[str, Any]] = []
    skipped: list[str] = []
    published = _Published(store_path(ctx))
    for asked_repo in list(wanted) or published.repos():
        spec = wanted.get(asked_repo)
        doc = published.doc(asked_repo)
        if doc is None:
            skipped.append(f"{asked_repo}: not in the store")
            continue
        repo = doc.repo
        commit = _pick_commit(doc, spec)
        if commit is None:
            if spec is not None and spec.ref is not None:
                skipped.append(f"{repo}: {spec.ref} is not in the store")
            else:
                skipped.append(f"{repo}: no vN or main ref in the store (name one: {repo}@REV)")
            continue
        published_tree = doc.commits.get(commit)
        names = list(published_tree.variants) if published_tree is not None else []
        if not names:
            skipped.append(f"{repo}@{commit[:12]}: {_NOTHING_PUBLISHED}")
            continue
        torch_left_out = False  # this repo's builds for torch turned down: see _no_torch
        if ctx.args.variant:
            chosen = ctx.args.variant if ctx.args.variant in names else None
        else:
            if facts is None:
                facts = _facts(ctx.args.python)
            decisions = decide(names, facts)
            accepted = [d.variant for d in decisions if d.accepted]
            chosen = accepted[0] if accepted else None
            torch_left_out = facts.torch_version is None and any(
                not d.accepted and d.parsed is not None and d.parsed.torch_version is not None
                for d in decisions
            )
            torch_builds_left_out = torch_builds_left_out or torch_left_out
        if chosen is None:
            hint = f" ({_no_torch(python)})" if torch_left_out else ""
            skipped.append(f"{repo}@{commit}: no variant in the store fits {where}{hint}")
            continue
        asked = spec.ref if spec is not None and spec.ref is not None else commit
        why = refusal(doc, published.publishers, asked, commit)
        if why is not None:
            skipped.append(f"{repo}@{commit[:12]}: {why}")
            continue
        assert published_tree is not None  # names came from it
        tree = published.root / published_tree.variants[chosen].tree
        if not tree.is_dir():
            skipped.append(f"{repo}@{commit[:12]}: {chosen}'s tree is gone ({tree})")
            continue
        path = str(tree)
        if ":" in path or "=" in path:
            raise CtlError(f"store path {path} contains ':' or '=': LOCAL_KERNELS cannot hold it")
        entries.append({"repo_id": repo, "commit": commit, "variant": chosen, "path": path})
    value = ":".join(f"{e['repo_id']}={e['path']}" for e in entries)
    for s in skipped:
        ctx.note(f"kerneldctl env: skipped {s}")
    if torch_builds_left_out:
        ctx.note(f"kerneldctl env: builds for torch were left out: {_no_torch(python)}")
    if ctx.json:
        ctx.emit_json(
            {
                "LOCAL_KERNELS": value,
                "kernels": entries,
                "skipped": skipped,
                "chosen_for": None if ctx.args.variant else python,
            }
        )
    else:
        ctx.out.write(f"LOCAL_KERNELS={value}\n")
    if specs and skipped:
        return EXIT_FAILURE
    return EXIT_OK


def _facts(python: str | None) -> PlatformFacts:
    """The platform the variants are chosen for: `--python`'s, detected in it, else this
    process's (which `KERNELD_PLATFORM_JSON` may pin)."""
    if python:
        from kerneld.ctl.job_platform import facts_of

        return facts_of(python)
    from kerneld_client.platform import platform_facts

    return platform_facts()


def register(commands: Commands) -> None:
    p = commands.add(
        "env",
        cmd_env,
        "Print LOCAL_KERNELS=org/a=/path:... for the store's kernels (for code that uses the "
        "`kernels` package directly).",
        "  kerneldctl env\n  export $(kerneldctl env kernels-community/activation:1)\n"
        "  kerneldctl env --python /srv/job/.venv/bin/python kernels-community/activation:1\n",
        commands.store_only,
    )
    p.add_argument("kernels", nargs="*", metavar="KERNEL", help="only these (org/name[:N|@REV])")
    choice = p.add_mutually_exclusive_group()
    choice.add_argument(
        "--python",
        metavar="PATH",
        help="choose each variant for this interpreter, the job's (its platform is detected by "
        "running it), instead of the one kerneldctl runs in: a system install's has no torch, "
        "so only builds without torch fit there",
    )
    choice.add_argument(
        "--variant",
        metavar="NAME",
        help="use this variant instead of the best one for the platform",
    )
