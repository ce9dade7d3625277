"""pin/unpin and deny/allow: an admin's standing decisions about a kernel.

A pin keeps a kernel's trees from garbage collection; a deny keeps a kernel (or one commit, or
what a ref names) from being served or fetched; what each deny row refuses is
`kerneld.store.deny_rules`. Through the daemon's admin socket by default, or on a store
directly with `--store` (the daemon stopped, since the daemon owns its store).
"""

from __future__ import annotations

from typing import Any

from kerneld.ctl.common import EXIT_OK, EXIT_USAGE, CtlError, Ctx, offline, open_store
from kerneld.ctl.subcommands import Commands

#: The revision of a whole-repo deny row (`kerneld.store.ALL`; not imported at startup).
ALL_REVISIONS = "*"

# ---- pin / unpin ------------------------------------------------------------------------------


def _pin(ctx: Ctx, unpin: bool) -> int:
    from kerneld.ctl.specs import parse_spec

    spec = parse_spec(ctx.args.kernel)
    variant = ctx.args.variant or ""
    if offline(ctx):
        from kerneld.store import ALL, StoreError

        with open_store(ctx, writable=True) as store:
            # As the daemon does: the ref (no selector: main) is pinned at its commit now.
            ref = spec.ref or "main"
            commit = store.names.resolve_revision(spec.repo_id, ref)
            if commit is None:
                raise CtlError(
                    f"{spec.repo_id}@{ref} is not known to this store",
                    hint=f"kerneldctl prefetch {spec} first, or give a commit",
                )
            try:
                if unpin:
                    changed = False
                    for revision in dict.fromkeys((commit, ref)):
                        changed = (
                            store.names.unpin(spec.repo_id, revision, variant or ALL) or changed
                        )
                else:
                    store.names.pin(spec.repo_id, commit, variant or ALL)
                    changed = True
            except StoreError as exc:
                raise CtlError(str(exc), code=EXIT_USAGE) from None
            trees = {
                v.tree
                for v in store.catalog.variants_of(spec.repo_id, commit)
                if not variant or v.variant == variant
            }
            doc: dict[str, Any] = {
                "kernel": str(spec),
                "commit": commit,
                "trees": len(trees),
                "changed": changed,
            }
    else:
        from kerneld.ctl.rpc import Admin
        from kerneld_client.proto import kerneld_pb2

        request = kerneld_pb2.PinRequest(
            kernel=spec.to_proto(), variant=variant, reason=ctx.args.reason or ""
        )
        with Admin(ctx) as admin:
            answer = admin.unary(admin.stub.Unpin if unpin else admin.stub.Pin, request)
        doc = {"kernel": str(spec), "commit": answer.commit, "trees": answer.trees}
    if ctx.json:
        ctx.emit_json(doc)
    else:
        what = f"{spec}" + (f" [{variant}]" if variant else "")
        at = f" at {doc['commit'][:12]}" if doc.get("commit") else ""
        if unpin:
            ctx.say(
                f"unpinned {what}{at}" if doc.get("changed", True) else f"{what} was not pinned"
            )
        else:
            ctx.say(f"pinned {what}{at} ({doc['trees']} tree(s) kept from GC)")
    return EXIT_OK


def cmd_pin(ctx: Ctx) -> int:
    return _pin(ctx, unpin=False)


def cmd_unpin(ctx: Ctx) -> int:
    return _pin(ctx, unpin=True)


# ---- deny / allow -----------------------------------------------------------------------------


def _deny_target(ctx: Ctx) -> tuple[str, str]:
    from kerneld.ctl.specs import parse_spec

    spec = parse_spec(ctx.args.kernel)
    return spec.repo_id, spec.ref or ""


def _list_denies(ctx: Ctx) -> int:
    if offline(ctx):
        from kerneld.store.deny_rules import REF, deny_kind, meaning, ref_commits

        with open_store(ctx, writable=False) as store:
            rows: list[dict[str, Any]] = []
            for d in store.names.denies():
                kind = deny_kind(d.revision)
                commits = ref_commits(store, d.repo, d.revision) if kind == REF else []
                rows.append(
                    {
                        "repo_id": d.repo,
                        "revision": "" if d.revision == "*" else d.revision,
                        "reason": d.reason,
                        "kind": kind,
                        "meaning": meaning(d.revision, commits),
                        "commits": commits,
                    }
                )
    else:
        from kerneld.ctl.listing import proto_to_dict
        from kerneld.ctl.rpc import Admin
        from kerneld_client.proto import kerneld_pb2

        with Admin(ctx) as admin:
            answer = admin.unary(admin.stub.ListDenies, kerneld_pb2.ListDeniesRequest())
        rows = [proto_to_dict(d) for d in answer.denies]
        for row in rows:
            row["revision"] = "" if row.get("revision") == "*" else row.get("revision", "")
    if ctx.json:
        ctx.emit_json({"denies": rows})
    elif not rows:
        ctx.say("nothing is denied")
    else:
        for r in rows:
            target = r["repo_id"] + (f"@{r['revision']}" if r.get("revision") else "")
            what = f"  {r['meaning']}" if r.get("meaning") else ""  # empty from an older daemon
            ctx.say(f"{target}{what}" + (f"  ({r['reason']})" if r.get("reason") else ""))
    return EXIT_OK


def _say_deny(ctx: Ctx, allow: bool, doc: dict[str, Any]) -> None:
    """`denied org/x@<sha> (v1 -> <sha>)`: the row written or lifted, and what it came from."""
    from kerneld.store.deny_rules import DenyTarget

    kind = doc.get("kind") or ""
    revision = doc["revision"] or "*"
    if kind:
        target = DenyTarget(doc["repo_id"], revision, kind, doc.get("resolved_from") or "")
        label = target.label()
    else:  # a daemon older than the kind field: it stored the revision as given
        label = doc["repo_id"] + (f"@{doc['revision']}" if doc["revision"] else "")
        if doc["revision"]:
            ctx.note(
                "kerneldctl: note: the daemon is older than this kerneldctl: it stored the "
                "revision as typed (requests that spell it), not the commit it names"
            )
    if allow:
        ctx.say(f"allowed {label}" if doc["changed"] else f"{label} was not denied")
    else:
        ctx.say(f"denied {label}" if doc["changed"] else f"{label} was already denied")


def _deny(ctx: Ctx, allow: bool) -> int:
    if not allow and ctx.args.list:
        return _list_denies(ctx)
    if not ctx.args.kernel:
        raise CtlError("name a kernel (org/name or org/name@REVISION)", code=EXIT_USAGE)
    repo, revision = _deny_target(ctx)
    reason = "" if allow else (ctx.args.reason or "")
    ref = bool(ctx.args.ref)
    if offline(ctx):
        from kerneld.store import ALL, StoreError, UnresolvedDenyError
        from kerneld.store.deny_rules import plan_allow, plan_deny

        with open_store(ctx, writable=True) as store:
            try:
                if allow:
                    target = plan_allow(store, repo, revision, ref=ref)
                    changed = store.names.allow(target.repo, target.revision)
                else:
                    # Without the daemon a ref or prefix is resolved from what the store knows.
                    target = plan_deny(store, repo, revision, ref=ref)
                    before = {(d.revision, d.reason) for d in store.names.denies(repo)}
                    store.names.deny(target.repo, target.revision, reason)
                    changed = (target.revision, reason) not in before
            except UnresolvedDenyError as exc:  # exit 1, as when the daemon refuses it
                raise CtlError(str(exc)) from None
            except StoreError as exc:
                raise CtlError(str(exc), code=EXIT_USAGE) from None
        stored = "" if target.revision == ALL else target.revision
        doc: dict[str, Any] = {
            "revision": stored,
            "kind": target.kind,
            "resolved_from": target.asked,
        }
    else:
        from kerneld.ctl.rpc import Admin
        from kerneld_client.proto import kerneld_pb2

        request = kerneld_pb2.DenyRequest(repo_id=repo, revision=revision, reason=reason, ref=ref)
        with Admin(ctx) as admin:
            answer = admin.unary(admin.stub.Allow if allow else admin.stub.Deny, request)
        changed = answer.changed
        stored = answer.revision if answer.kind else revision  # an older daemon: as typed
        doc = {
            "revision": "" if stored == ALL_REVISIONS else stored,
            "kind": answer.kind,
            "resolved_from": answer.resolved_from,
        }
    doc = {"repo_id": repo, **doc, "changed": changed}
    if ctx.json:
        ctx.emit_json(doc)
    else:
        _say_deny(ctx, allow, doc)
    return EXIT_OK


def cmd_deny(ctx: Ctx) -> int:
    return _deny(ctx, allow=False)


def cmd_allow(ctx: Ctx) -> int:
    return _deny(ctx, allow=True)


def register(commands: Commands) -> None:
    for name, handler, verb in (
        ("pin", cmd_pin, "Keep a kernel's trees from garbage collection."),
        ("unpin", cmd_unpin, "Remove a pin."),
    ):
        p = commands.add(
            name,
            handler,
            verb,
            f"  kerneldctl {name} kernels-community/activation:1\n"
            f"  kerneldctl {name} kernels-community/activation@main --variant torch-universal\n",
        )
        p.add_argument("kernel", metavar="REPO[@REV]")
        p.add_argument("--variant", metavar="NAME", help="only this variant")
        p.add_argument("--reason", metavar="TEXT", help="why (logged)")

    p = commands.add(
        "deny",
        cmd_deny,
        "Disable a kernel (or one commit of it) on this host, effective for new loads at once.",
        "  kerneldctl deny kernels-community/bad --reason 'crashes on H100'\n"
        "  kerneldctl deny kernels-community/activation:1\n"
        "  kerneldctl deny kernels-community/activation@0123abcd\n"
        "  kerneldctl deny --ref kernels-community/activation@v1\n"
        "  kerneldctl deny --list\n",
    )
    p.description = (
        f"{p.description}\n\n"
        "The repo id matches in any case (the Hub resolves Org/Name to org/name). REPO alone\n"
        "denies every revision. REPO@REV denies one commit, however a job names it (a branch,\n"
        "a tag, the sha): a branch, tag or commit prefix (at least 7 hex digits) is resolved to\n"
        "its full commit now, by the daemon's upstreams (with --store: what the store knows),\n"
        "and the command says which (`denied org/x@<sha> (v1 -> <sha>)`); an unknown,\n"
        "ambiguous or too short revision is refused. --ref denies the ref name instead: jobs\n"
        "that name it are refused whatever it points to, now and after it moves (the commit\n"
        "stays loadable by another name)."
    )
    p.add_argument("kernel", nargs="?", metavar="REPO[@REV]")
    p.add_argument("--reason", metavar="TEXT")
    p.add_argument(
        "--ref",
        action="store_true",
        help="deny the ref name itself (whatever it points to, now and later), not its commit",
    )
    p.add_argument(
        "--list", action="store_true", help="list what is denied and what each row refuses"
    )

    p = commands.add(
        "allow",
        cmd_allow,
        "Lift a deny.",
        "  kerneldctl allow kernels-community/bad\n"
        "  kerneldctl allow kernels-community/activation@0123abcd\n"
        "  kerneldctl allow --ref kernels-community/activation@v1\n",
    )
    p.description = (
        f"{p.description}\n\n"
        "REPO@REV lifts the row stored under REV, else the one `deny REPO@REV` would write\n"
        "(the commit REV names, resolved as deny resolves it)."
    )
    p.add_argument("kernel", metavar="REPO[@REV]")
    p.add_argument("--ref", action="store_true", help="lift a deny of the ref name (deny --ref)")
