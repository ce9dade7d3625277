"""pin/unpin and deny/allow: an admin's standing decisions about a kernel.

A pin keeps a kernel's trees from garbage collection; a deny keeps a kernel (or one revision)
from being served or fetched. Through the daemon's admin socket by default, or on a store
directly with `--store` (the daemon stopped, since the daemon owns its store).
"""

from __future__ import annotations

from typing import Any

from kerneld.ctl.common import EXIT_OK, EXIT_USAGE, CtlError, Ctx, offline, open_store
from kerneld.ctl.subcommands import Commands

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
            commit = store.resolve_revision(spec.repo_id, ref)
            if commit is None:
                raise CtlError(
                    f"{spec.repo_id}@{ref} is not known to this store",
                    hint=f"kerneldctl prefetch {spec} first, or give a commit",
                )
            try:
                if unpin:
                    changed = False
                    for revision in dict.fromkeys((commit, ref)):
                        changed = store.unpin(spec.repo_id, revision, variant or ALL) or changed
                else:
                    store.pin(spec.repo_id, commit, variant or ALL)
                    changed = True
            except StoreError as exc:
                raise CtlError(str(exc), code=EXIT_USAGE) from None
            trees = {
                v.tree
                for v in store.variants_of(spec.repo_id, commit)
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
        with open_store(ctx, writable=False) as store:
            rows = [
                {
                    "repo_id": r.repo,
                    "revision": "" if r.revision == "*" else r.revision,
                    "reason": r.reason,
                }
                for r in store.denies()
            ]
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
            ctx.say(f"{target}" + (f"  ({r['reason']})" if r.get("reason") else ""))
    return EXIT_OK


def _deny(ctx: Ctx, allow: bool) -> int:
    if not allow and ctx.args.list:
        return _list_denies(ctx)
    if not ctx.args.kernel:
        raise CtlError("name a kernel (org/name or org/name@REVISION)", code=EXIT_USAGE)
    repo, revision = _deny_target(ctx)
    reason = "" if allow else (ctx.args.reason or "")
    if offline(ctx):
        from kerneld.store import ALL, StoreError

        with open_store(ctx, writable=True) as store:
            try:
                if allow:
                    changed = store.allow(repo, revision or ALL)
                else:
                    before = {(d.repo, d.revision, d.reason) for d in store.denies(repo)}
                    store.deny(repo, revision or ALL, reason)
                    after = {(d.repo, d.revision, d.reason) for d in store.denies(repo)}
                    changed = before != after
            except StoreError as exc:
                raise CtlError(str(exc), code=EXIT_USAGE) from None
    else:
        from kerneld.ctl.rpc import Admin
        from kerneld_client.proto import kerneld_pb2

        request = kerneld_pb2.DenyRequest(repo_id=repo, revision=revision, reason=reason)
        with Admin(ctx) as admin:
            answer = admin.unary(admin.stub.Allow if allow else admin.stub.Deny, request)
        changed = answer.changed
    target = repo + (f"@{revision}" if revision else "")
    if ctx.json:
        ctx.emit_json({"repo_id": repo, "revision": revision, "changed": changed})
    elif allow:
        ctx.say(f"allowed {target}" if changed else f"{target} was not denied")
    else:
        ctx.say(f"denied {target}" if changed else f"{target} was already denied")
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
        "Disable a kernel (or one revision of it) on this host, effective for new loads at once.",
        "  kerneldctl deny kernels-community/bad --reason 'crashes on H100'\n"
        "  kerneldctl deny kernels-community/activation@0123abcd...\n"
        "  kerneldctl deny --list\n",
    )
    p.add_argument("kernel", nargs="?", metavar="REPO[@REV]")
    p.add_argument("--reason", metavar="TEXT")
    p.add_argument("--list", action="store_true", help="list what is denied")

    p = commands.add(
        "allow",
        cmd_allow,
        "Lift a deny.",
        "  kerneldctl allow kernels-community/bad\n",
    )
    p.add_argument("kernel", metavar="REPO[@REV]")
