"""lock: write `kernels.lock` (0.17 format) for a project; --verify-old: check old-format hashes.

`kerneldctl lock PROJECT` does what `kernels lock PROJECT` does and writes the same bytes: every
`[tool.kernels.dependencies]` entry is resolved (version N = the tip of branch vN), then the
`kernel-depends` of every build variant of that commit are locked too, recursively. Sources:

- `hub` (default): the Hub at `--hub-endpoint`, else $HF_ENDPOINT, else huggingface.co;
- `daemon`: what the running daemon's store knows (its refs; dependencies from the variants it
  holds), so a host without Hub access can still lock against its cache;
- `store`: the same, read from a store directly (`--store PATH`).

Unlike `kernels lock`, a dependency given by a branch or tag name is resolved to its commit (the
`kernels` package would fail on it), and publisher trust is not checked (kerneld's policy is the
daemon's fetch allow-list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kerneld.ctl.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CtlError,
    Ctx,
    open_store,
)
from kerneld.ctl.subcommands import Commands

if TYPE_CHECKING:
    from kerneld_client.lockfile import Dependency

MAX_METADATA = 1 << 20


class Source(Protocol):
    name: str

    def commit(self, dep: Dependency) -> str: ...

    def depends(self, repo_id: str, commit: str) -> list[Dependency]: ...


def parse_depends(doc: Any, where: str) -> list[Dependency]:
    """`kernel-depends` of a metadata.json document (kerneld_client.metadata's rules)."""
    from kerneld_client.metadata import kernel_depends

    try:
        return kernel_depends(doc)
    except ValueError as exc:
        raise CtlError(f"{where}: {exc}") from None


class HubSource:
    """Resolution against a Hub through kerneld's Hub upstream (huggingface_hub underneath)."""

    name = "hub"

    def __init__(self, endpoint: str | None) -> None:
        from kerneld.upstream.hub import HubUpstream

        self.hub = HubUpstream(endpoint=endpoint)
        self.endpoint = self.hub.endpoint

    def commit(self, dep: Dependency) -> str:
        from kerneld_client.vocabulary import is_commit

        if dep.version is not None:
            versions = self.hub.list_refs(dep.repo_id).versions()
            if dep.version not in versions:
                available = ", ".join(str(v) for v in sorted(versions)) or "none"
                raise CtlError(
                    f"{dep.repo_id}: version {dep.version} not found, available versions: "
                    f"{available}"
                )
            return versions[dep.version]
        rev = str(dep.revision)
        return (
            rev.lower() if is_commit(rev.lower()) else self.hub.resolve_revision(dep.repo_id, rev)
        )

    def depends(self, repo_id: str, commit: str) -> list[Dependency]:
        from kerneld.upstream.base import RemoteFile
        from kerneld_client.variants import UnrecognisedVariant, parse_variant

        deps: list[Dependency] = []
        for variant in self.hub.list_variants(repo_id, commit):
            if isinstance(parse_variant(variant), UnrecognisedVariant):
                continue  # `kernels lock` skips folders that are not build variants
            with self.hub.open_file(
                repo_id, commit, variant, RemoteFile("metadata.json", 0)
            ) as chunks:
                data = b""
                for chunk in chunks:
                    data += chunk
                    if len(data) > MAX_METADATA:
                        raise CtlError(f"{repo_id}@{commit} {variant}: metadata.json too large")
            where = f"{repo_id}@{commit} build/{variant}/metadata.json"
            try:
                doc = json.loads(data)
            except ValueError as exc:
                raise CtlError(f"{where}: not valid JSON: {exc}") from None
            deps += parse_depends(doc, where)
        return list(dict.fromkeys(deps))


@dataclass
class ListingSource:
    """Resolution against what a store holds (via the daemon's List, or the store itself)."""

    name: str
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    listed_depends: dict[tuple[str, str], list[Dependency]] | None = None
    """(repo, commit) -> its variants' `kernel-depends` as the daemon read them (None: read
    each variant's metadata.json from the store here)."""

    def commit(self, dep: Dependency) -> str:
        kernel = self.kernels.get(dep.repo_id)
        ref = dep.ref
        for rev in (kernel or {}).get("revisions", []):
            if ref in rev["refs"] or rev["commit"] == ref.lower():
                return str(rev["commit"])
        raise CtlError(
            f"{dep}: the {self.name} does not know {dep.repo_id}@{ref}",
            hint=f"kerneldctl prefetch {dep} (or lock against the Hub)",
        )

    def depends(self, repo_id: str, commit: str) -> list[Dependency]:
        if self.listed_depends is not None:
            return self.listed_depends.get((repo_id, commit), [])
        deps: list[Dependency] = []
        for rev in self.kernels.get(repo_id, {}).get("revisions", []):
            if rev["commit"] != commit:
                continue
            for v in rev["variants"]:
                path = Path(v["path"]) / "metadata.json"
                try:
                    doc = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as exc:
                    raise CtlError(f"cannot read {path}: {exc}") from None
                deps += parse_depends(doc, str(path))
        return list(dict.fromkeys(deps))


def lock_dependencies(deps: list[Dependency], source: Source) -> dict[Dependency, str]:
    """Lock `deps` and their kernel-depends, as `kernels lock` walks them."""
    locks: dict[Dependency, str] = {}

    def visit(dep: Dependency, stack: tuple[Dependency, ...]) -> None:
        if dep in locks:
            return
        if dep in stack:
            chain = " -> ".join(str(d) for d in (*stack, dep))
            raise CtlError(f"cyclic kernel dependency: {chain}")
        commit = source.commit(dep)
        for child in source.depends(dep.repo_id, commit):
            visit(child, (*stack, dep))
        locks[dep] = commit

    for dep in deps:
        visit(dep, ())
    if not locks:
        raise CtlError("no kernels found to lock")
    return locks


def _source(ctx: Ctx) -> Source:
    from kerneld.ctl.listing import proto_to_dict, store_listing
    from kerneld_client.lockfile import Dependency

    kind = ctx.args.source or ("store" if ctx.args.store else "hub")
    if kind == "hub":
        return HubSource(ctx.args.hub_endpoint)
    if kind == "store":
        with open_store(ctx, writable=False) as store:
            listing = store_listing(store)
        return ListingSource("store", {k["repo_id"]: k for k in listing})
    from kerneld.ctl.rpc import Admin
    from kerneld_client.proto import kerneld_pb2

    with Admin(ctx) as admin:  # the daemon reads the metadata: the store may be closed to us
        answer = admin.unary(admin.stub.List, kerneld_pb2.ListRequest(with_depends=True))
    listing = [proto_to_dict(k) for k in answer.kernels]
    depends: dict[tuple[str, str], list[Dependency]] = {}
    for kernel in answer.kernels:
        for rev in kernel.revisions:
            found = depends.setdefault((kernel.repo_id, rev.commit), [])
            for variant in rev.variants:
                for ref in variant.kernel_depends:
                    which = ref.WhichOneof("selector")
                    dep = Dependency(
                        ref.repo_id,
                        version=ref.version if which == "version" else None,
                        revision=None if which == "version" else ref.revision or "main",
                    )
                    if dep not in found:
                        found.append(dep)
    return ListingSource("daemon", {k["repo_id"]: k for k in listing}, depends)


def _translate_upstream(exc: Exception) -> CtlError:
    return CtlError(str(exc))


def cmd_lock(ctx: Ctx) -> int:
    if ctx.args.verify_old:
        return _verify_old(ctx)
    from kerneld_client.lockfile import (
        LOCKFILE_NAME,
        Lock,
        LockfileError,
        dumps_locks,
        read_pyproject_dependencies,
    )

    project = Path(ctx.args.project or ".")
    pyproject = project / "pyproject.toml" if project.is_dir() else project
    if pyproject.name != "pyproject.toml":
        raise CtlError(f"{project}: expected a project directory or its pyproject.toml", code=2)
    try:
        deps = read_pyproject_dependencies(pyproject)
    except LockfileError as exc:
        raise CtlError(str(exc)) from None
    from kerneld.upstream.errors import UpstreamError

    try:
        source = _source(ctx)
        locked = lock_dependencies(deps, source)
    except UpstreamError as exc:
        raise _translate_upstream(exc) from None
    locks = [Lock(dep, commit) for dep, commit in locked.items()]
    text = dumps_locks(locks)
    out = Path(ctx.args.output) if ctx.args.output else pyproject.parent / LOCKFILE_NAME
    try:
        current: bytes | None = out.read_bytes()
    except FileNotFoundError:
        current = None
    changed = current != text.encode("utf-8")
    if ctx.args.check:
        written = False
    else:
        out.write_bytes(text.encode("utf-8"))
        written = True
    doc: dict[str, Any] = {
        "path": str(out),
        "source": source.name,
        "written": written,
        "changed": changed,
        "locks": [
            {
                "repo_id": x.dependency.repo_id,
                "version": x.dependency.version,
                "revision": x.dependency.revision,
                "commit": x.commit,
            }
            for x in sorted(locks, key=lambda x: x.dependency.sort_key())
        ],
    }
    if ctx.json:
        ctx.emit_json(doc)
    else:
        for x in doc["locks"]:
            sel = f":{x['version']}" if x["version"] is not None else f"@{x['revision']}"
            ctx.say(f"{x['repo_id']}{sel} -> {x['commit']}")
        if ctx.args.check:
            ctx.say(f"{out} is {'OUT OF DATE' if changed else 'up to date'}")
        else:
            ctx.say(f"wrote {out}" + ("" if changed else " (unchanged)"))
    return EXIT_FAILURE if ctx.args.check and changed else EXIT_OK


# ---- --verify-old -----------------------------------------------------------------------------


def _verify_old(ctx: Ctx) -> int:
    from kerneld_client.lockfile import LockfileError, git_lfs_concat_hash, load_lockfile

    try:
        lock = load_lockfile(ctx.args.verify_old)
    except LockfileError as exc:
        raise CtlError(str(exc)) from None
    if lock.format != "old":
        raise CtlError(
            f"{ctx.args.verify_old} is in the 0.17 format, which carries no content hashes",
            code=EXIT_USAGE,
        )
    kind = ctx.args.source or ("store" if ctx.args.store else "hub")
    if kind == "daemon":
        raise CtlError(
            "--verify-old reads the store directly (read-only is safe beside the daemon): use "
            "--source store",
            code=EXIT_USAGE,
        )
    results: list[dict[str, Any]] = []
    from kerneld.upstream.errors import EntryNotFound, RepoNotFound, RevisionNotFound

    if kind == "hub":
        hub = HubSource(ctx.args.hub_endpoint).hub
        for entry in lock.old:
            for variant, want in sorted(entry.variants.items()):
                try:
                    files = hub.list_files(entry.repo_id, entry.sha, variant)
                except (EntryNotFound, RevisionNotFound, RepoNotFound) as exc:
                    results.append(
                        _result(entry.repo_id, entry.sha, variant, want.hash, None, str(exc))
                    )
                    continue
                ids = [(f.path, f.sha256 or f.git_sha1 or "") for f in files]
                results.append(
                    _result(entry.repo_id, entry.sha, variant, want.hash, git_lfs_concat_hash(ids))
                )
    else:
        with open_store(ctx, writable=False) as store:
            for entry in lock.old:
                for variant, want in sorted(entry.variants.items()):
                    upstream = store.catalog.upstream_ids(entry.repo_id, entry.sha, variant)
                    if not upstream:
                        results.append(
                            _result(
                                entry.repo_id,
                                entry.sha,
                                variant,
                                want.hash,
                                None,
                                "not in the store",
                            )
                        )
                        continue
                    tree = store.catalog.published_tree(entry.repo_id, entry.sha, variant)
                    from kerneld.store.manifest import parse_manifest

                    paths = {e.path for e in parse_manifest(tree.manifest)} if tree else set()
                    if paths - set(upstream):
                        results.append(
                            _result(
                                entry.repo_id,
                                entry.sha,
                                variant,
                                want.hash,
                                None,
                                "the store lacks the upstream ids of some files",
                            )
                        )
                        continue
                    got = git_lfs_concat_hash(sorted(upstream.items()))
                    results.append(_result(entry.repo_id, entry.sha, variant, want.hash, got))
    mismatched = [r for r in results if r["status"] == "mismatch"]
    checked = [r for r in results if r["status"] == "ok"]
    missing = [r for r in results if r["status"] == "unchecked"]
    failed = bool(mismatched) or not checked or (kind == "hub" and bool(missing))
    if ctx.json:
        ctx.emit_json(
            {
                "lockfile": str(ctx.args.verify_old),
                "source": kind,
                "ok": not failed,
                "results": results,
            }
        )
    else:
        for r in results:
            what = f"{r['repo_id']}@{r['commit'][:12]} {r['variant']}"
            if r["status"] == "ok":
                ctx.say(f"ok        {what}")
            elif r["status"] == "mismatch":
                ctx.say(f"MISMATCH  {what}: lock {r['expected']}, {kind} {r['actual']}")
            else:
                ctx.say(f"unchecked {what}: {r['detail']}")
        ctx.say(
            f"{len(checked)} variant(s) match, {len(mismatched)} mismatch, {len(missing)} unchecked"
        )
    return EXIT_FAILURE if failed else EXIT_OK


def _result(
    repo: str, commit: str, variant: str, expected: str, actual: str | None, detail: str = ""
) -> dict[str, Any]:
    status = "unchecked" if actual is None else ("ok" if actual == expected else "mismatch")
    return {
        "repo_id": repo,
        "commit": commit,
        "variant": variant,
        "expected": expected,
        "actual": actual,
        "status": status,
        "detail": detail,
    }


def register(commands: Commands) -> None:
    p = commands.add(
        "lock",
        cmd_lock,
        "Write kernels.lock (0.17 format, byte-compatible with `kernels lock`) for a project.",
        "  kerneldctl lock .\n"
        "  kerneldctl lock my-project --hub-endpoint http://hub.internal\n"
        "  kerneldctl lock . --source daemon --check\n"
        "  kerneldctl lock --verify-old old/kernels.lock --source store\n",
    )
    p.add_argument("project", nargs="?", metavar="PROJECT", help="project dir (default: .)")
    p.add_argument("--output", metavar="FILE", help="write here instead of PROJECT/kernels.lock")
    p.add_argument("--check", action="store_true", help="exit 1 if the lock file is out of date")
    p.add_argument(
        "--source",
        choices=("hub", "daemon", "store"),
        help="resolve against the Hub (default), the daemon's store, or --store",
    )
    p.add_argument(
        "--hub-endpoint", metavar="URL", help="Hub to resolve against (default: $HF_ENDPOINT)"
    )
    p.add_argument(
        "--verify-old",
        metavar="LOCKFILE",
        help="check an old-format lock file's git_lfs_concat hashes against the Hub or store",
    )
