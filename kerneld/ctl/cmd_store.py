"""status, ls, info, pin/unpin, deny/allow, gc, verify, env.

Each works through the daemon's admin socket by default, or directly on a store with `--store`
(read-only commands open it read-only, which is safe beside a running daemon; changes need the
daemon stopped, since the daemon owns its store).
"""

from __future__ import annotations

import re
from typing import Any

from kerneld.ctl.common import (
    EXIT_FAILURE,
    EXIT_GC_TARGET_MISSED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERIFY_NOT_RUN,
    CtlError,
    Ctx,
    DaemonNotReachable,
    PermissionDenied,
    human_bytes,
    offline,
    open_store,
)
from kerneld.ctl.listing import proto_to_dict, read_metadata, store_listing
from kerneld.ctl.rpc import Admin, UserChannel
from kerneld.ctl.specs import Spec, parse_spec

# ---- status -----------------------------------------------------------------------------------


def cmd_status(ctx: Ctx) -> int:
    if offline(ctx):
        with open_store(ctx, writable=False) as store:
            usage = store.usage()
            now_refs = [
                {"repo_id": r.repo, "ref": r.ref, "commit": r.commit, "fetched_at": r.fetched_at}
                for repo in store.repos()
                for r in store.refs_of(repo)
            ]
            import time

            try:
                entries, held = store.quarantine_usage()
            except PermissionError:  # the quarantine is the owner's alone (0700)
                entries = held = None
            doc: dict[str, Any] = {
                "source": "store",
                "store_root": str(store.root),
                "daemon_running": store.owner_is_running(),
                "trees": usage.trees,
                "blobs": usage.blobs,
                "store_bytes": usage.bytes_used,
                "free_bytes": usage.free_bytes,
                # the bound is the daemon's setting ([store] quarantine_max): not known here
                "quarantine_entries": entries,
                "quarantine_bytes": held,
                "pins": len(store.pins()),
                "denies": len(store.denies()),
                "active_leases": sum(1 for x in store.leases() if x.expires_at > time.time()),
                "refs": now_refs,
            }
    else:
        doc = _daemon_status(ctx)
    for up in doc.get("upstreams") or []:
        up["state"] = _upstream_state(up)
        if up["state"] == "not yet contacted":
            up["reachable"] = None  # unknown: the daemon has not asked it anything yet
    if ctx.json:
        ctx.emit_json(doc)
        return EXIT_OK
    if doc["source"] == "daemon":
        ctx.say(
            f"kerneld {doc.get('version', '?')}: {'ready' if doc.get('ready') else 'NOT READY'}"
        )
    else:
        ctx.say(f"store {doc['store_root']} (read directly, not through the daemon)")
        if doc["daemon_running"]:
            ctx.say("a daemon owns this store: drop --store to ask it")
    if doc.get("store_root") and doc["source"] == "daemon":
        ctx.say(f"store:   {doc['store_root']}")
    for where in doc.get("hub_api") or []:
        ctx.say(f"hub api: {where} (HF_ENDPOINT for unmodified kernels)")
    cap = doc.get("store_cap_bytes")
    used = human_bytes(int(doc.get("store_bytes", 0)))
    ctx.say(
        f"usage:   {used}"
        + (f" of {human_bytes(int(cap))}" if cap else "")
        + f" in {doc.get('trees', 0)} trees, {doc.get('blobs', 0)} blobs"
    )
    if doc.get("admin", True):
        ctx.say(
            f"pins: {doc.get('pins', 0)}  denies: {doc.get('denies', 0)}  "
            f"active leases: {doc.get('active_leases', 0)}"
        )
    if doc.get("quarantine_entries") is not None:
        ctx.say(_quarantine_line(doc))
    for up in doc.get("upstreams") or []:
        state = up["state"]
        if state == "unreachable":
            state = f"UNREACHABLE {up.get('last_error', '')}".rstrip()
        elif state == "reachable" and up.get("last_success"):
            state += f" (last answer {str(up['last_success'])[:19].replace('T', ' ')} UTC)"
        ctx.say(f"upstream {up.get('name')} ({up.get('kind')} {up.get('location')}): {state}")
    if not doc.get("admin", True):
        ctx.say(f"pins, denies, leases and refs: {doc['admin_detail']}")
    return EXIT_OK


def _quarantine_line(doc: dict[str, Any]) -> str:
    """ "quarantine: 2 entries, 1.2 MiB of 1.0 GiB (kerneldctl verify lists them)": what the
    daemon took out of service and keeps, against its bound (`[store] quarantine_max`)."""
    entries = int(doc.get("quarantine_entries") or 0)
    held = human_bytes(int(doc.get("quarantine_bytes") or 0))
    bound = doc.get("quarantine_max_bytes")
    if bound is None:
        of = ""
    elif int(bound):
        of = f" of {human_bytes(int(bound))}"
    else:
        of = " (no bound)"
    where = " (kerneldctl verify lists them)" if entries else ""
    return f"quarantine: {entries} entr{'y' if entries == 1 else 'ies'}, {held}{of}{where}"


def _upstream_state(up: dict[str, Any]) -> str:
    """The daemon starts every upstream as reachable; only an answer (last_success) or an
    error says which it is, so neither yet means "not yet contacted", never "reachable"."""
    if not up.get("reachable"):
        return "unreachable"
    if up.get("last_success"):
        return "reachable"
    return "not yet contacted"


def _daemon_status(ctx: Ctx) -> dict[str, Any]:
    """GetAdminStatus on the admin socket; where this user may not use it, GetStatus on the
    user socket (what every kerneld-users member may ask), marked as lacking the admin part."""
    from kerneld_client._proto import kerneld_pb2

    try:
        with Admin(ctx) as admin:
            answer = admin.unary(admin.stub.GetAdminStatus, kerneld_pb2.GetStatusRequest())
    except PermissionDenied as denied:
        try:
            with UserChannel(ctx) as user:
                status = user.unary(user.kernels().GetStatus, kerneld_pb2.GetStatusRequest())
        except DaemonNotReachable:
            raise denied from None
        reason = f"need the admin socket ({denied.message}; {denied.hint})"
        if not ctx.json:
            ctx.note(f"kerneldctl: note: {denied.message}: showing what the user socket tells")
        return {
            "source": "daemon",
            "socket": str(user.path),
            "admin": False,
            "admin_detail": reason,
            **proto_to_dict(status),
        }
    full = proto_to_dict(answer)
    status_doc = full.pop("status") or {}
    return {
        "source": "daemon",
        "admin_socket": str(admin.path),
        "admin": True,
        **status_doc,
        **full,
    }


# ---- ls / info --------------------------------------------------------------------------------


def _listing(ctx: Ctx, repos: list[str]) -> list[dict[str, Any]]:
    if offline(ctx):
        with open_store(ctx, writable=False) as store:
            return store_listing(store, repos)
    from kerneld_client._proto import kerneld_pb2

    with Admin(ctx) as admin:
        answer = admin.unary(admin.stub.List, kerneld_pb2.ListRequest(repo_ids=repos))
    return [proto_to_dict(k) for k in answer.kernels]


def _flags(item: dict[str, Any]) -> str:
    bits = []
    if item.get("pinned"):
        bits.append("pinned")
    if item.get("denied"):
        bits.append("DENIED")
    if item.get("active_leases"):
        bits.append(f"{item['active_leases']} lease(s)")
    provenance = item.get("provenance") or {}
    status = provenance.get("status")
    if status:  # verified, unsigned, INVALID, unchecked: the sigstore check at ingest
        bits.append(
            "signed" if status == "verified" else status.upper() if status == "invalid" else status
        )
    return ",".join(bits)


def _signature(provenance: dict[str, Any] | None) -> str:
    """`kerneldctl info`'s line about who signed a tree."""
    if not provenance:
        return "not checked ([provenance] policy is off, or the tree predates the check)"
    if provenance["status"] == "verified":
        return f"verified: {provenance['signer']} (issuer {provenance['issuer']})"
    return f"{provenance['status']}: {provenance['detail']}"


def cmd_ls(ctx: Ctx) -> int:
    for repo in ctx.args.repos or []:
        parse_spec(repo)
    kernels = _listing(ctx, list(ctx.args.repos or []))
    if ctx.json:
        ctx.emit_json({"kernels": kernels})
        return EXIT_OK
    if not kernels:
        ctx.say("the store holds no kernels")
        return EXIT_OK
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("KERNEL", "REVISION", "REFS", "VARIANT", "SIZE", "FILES", "LAST USED", "FLAGS"):
        table.add_column(col)
    for k in kernels:
        kflags = _flags(k)
        for rev in k["revisions"] or [{"commit": "", "refs": [], "variants": []}]:
            variants = rev["variants"] or [{}]
            for v in variants:
                flags = ",".join(
                    dict.fromkeys(
                        x for f in (kflags, _flags(rev), _flags(v)) for x in f.split(",") if x
                    )
                )
                table.add_row(
                    k["repo_id"],
                    rev["commit"][:12],
                    ",".join(rev["refs"]),
                    v.get("variant", "-"),
                    human_bytes(int(v["size_bytes"])) if v else "",
                    str(v.get("files", "")),
                    (v.get("last_resolved") or "never")[:16].replace("T", " ") if v else "",
                    flags,
                )
    ctx.console().print(table)
    return EXIT_OK


def cmd_info(ctx: Ctx) -> int:
    spec = parse_spec(ctx.args.kernel)
    kernels = _listing(ctx, [spec.repo_id])
    if not kernels:
        raise CtlError(
            f"{spec.repo_id} is not in the store", hint=f"kerneldctl prefetch {spec.repo_id}"
        )
    kernel = kernels[0]
    rev = spec.ref
    revisions = kernel["revisions"]
    if rev is not None:
        revisions = [
            r
            for r in revisions
            if rev in r["refs"]
            or r["commit"] == rev
            or (len(rev) >= 7 and r["commit"].startswith(rev))
        ]
        if not revisions:
            raise CtlError(f"{spec} is not in the store", hint=f"kerneldctl prefetch {spec}")
    for r in revisions:
        for v in r["variants"]:
            v["metadata"] = read_metadata(v["path"]) if v.get("path") else None
    doc = {**kernel, "revisions": revisions}
    if ctx.json:
        ctx.emit_json(doc)
        return EXIT_OK
    flags = _flags(kernel)
    ctx.say(f"{kernel['repo_id']}" + (f"  ({flags})" if flags else ""))
    for r in revisions:
        refs = ", ".join(r["refs"]) or "no refs"
        ctx.say(f"  commit {r['commit']}  [{refs}]" + (f"  ({_flags(r)})" if _flags(r) else ""))
        for v in r["variants"]:
            meta = v.get("metadata") or {}
            ctx.say(f"    {v['variant']}")
            ctx.say(f"      tree:    {v['tree_digest']}")
            ctx.say(f"      path:    {v['path']}")
            ctx.say(f"      size:    {human_bytes(int(v['size_bytes']))} in {v['files']} files")
            ctx.say(f"      signature: {_signature(v.get('provenance'))}")
            if meta:
                ctx.say(
                    f"      id:      {meta.get('id')}  version {meta.get('version')}  "
                    f"backend {meta.get('backend')}  license {meta.get('license')}"
                )
                flag = meta.get("deterministic")
                declared = "undeclared" if flag is None else ("yes" if flag else "no")
                ctx.say(f"      deterministic: {declared}")
                deps = meta.get("kernel_depends") or []
                if deps:
                    ctx.say("      depends: " + ", ".join(str(d.get("repo-id")) for d in deps))
            if _flags(v):
                ctx.say(f"      flags:   {_flags(v)}")
    return EXIT_OK


# ---- pin / unpin ------------------------------------------------------------------------------


def _pin(ctx: Ctx, unpin: bool) -> int:
    spec = parse_spec(ctx.args.kernel)
    variant = ctx.args.variant or ""
    if offline(ctx):
        from kerneld.store import StoreError
        from kerneld.store.index import ALL

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
        from kerneld_client._proto import kerneld_pb2

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
        from kerneld_client._proto import kerneld_pb2

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
        from kerneld.store import StoreError
        from kerneld.store.index import ALL

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
        from kerneld_client._proto import kerneld_pb2

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


# ---- gc ---------------------------------------------------------------------------------------


def _gc_item(t: Any) -> dict[str, Any]:
    repo, commit, variant = t.variants[0] if t.variants else ("", "", "")
    return {
        "tree_digest": f"sha256:{t.digest}",
        "repo_id": repo,
        "commit": commit,
        "variant": variant,
        # removed: the bytes deleting it freed; kept: its size (as the daemon reports them)
        "size_bytes": t.bytes_freed if t.action == "delete" else t.size_bytes,
        "reason": t.reason,
    }


def _kept_by_reason(kept: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Kept trees grouped by why (pinned, leased, in use, recent, not needed): count, bytes."""
    out: dict[str, dict[str, int]] = {}
    for item in kept:
        why = str(item["reason"]).split(" (")[0] or "kept"
        entry = out.setdefault(why, {"trees": 0, "size_bytes": 0})
        entry["trees"] += 1
        entry["size_bytes"] += int(item["size_bytes"])
    return out


def cmd_gc(ctx: Ctx) -> int:
    dry = bool(ctx.args.dry_run)
    target = int(ctx.args.target_free or 0)
    if target < 0:
        raise CtlError("--target-free must be a number of bytes >= 0", code=EXIT_USAGE)
    if offline(ctx):
        with open_store(ctx, writable=not dry) as store:
            if target:
                # as the daemon does: free until `target` more bytes are free than now
                from dataclasses import replace

                free = store.usage().free_bytes
                store.policy = replace(store.policy, free_target_bytes=free + target)
            report = store.gc(dry_run=dry)
        doc: dict[str, Any] = {
            "dry_run": dry,
            "removed": [_gc_item(t) for t in report.deleted_trees],
            "kept": [_gc_item(t) for t in report.kept_trees],
            "freed_bytes": report.bytes_freed,
            "orphan_blobs_removed": len(report.blobs_deleted),
        }
    else:
        from kerneld_client._proto import kerneld_pb2

        request = kerneld_pb2.GcRequest(dry_run=dry, target_free_bytes=target)
        with Admin(ctx) as admin:
            answer = admin.unary(admin.stub.GarbageCollect, request, long=True)
        doc = proto_to_dict(answer)
    kept_by = _kept_by_reason(doc["kept"])
    missed = bool(target) and int(doc["freed_bytes"]) < target
    if target:
        doc["target_free_bytes"] = target
        doc["target_reached"] = not missed
    doc["kept_by_reason"] = kept_by
    why = ", ".join(
        f"{v['trees']} {k} ({human_bytes(v['size_bytes'])})"
        for k, v in sorted(kept_by.items())
        if k != "not needed"
    )
    if missed:
        ctx.note(
            f"kerneldctl: gc: target not reached: {'would free' if dry else 'freed'} "
            f"{human_bytes(int(doc['freed_bytes']))} of the {human_bytes(target)} asked; "
            f"the rest is held: {why or 'nothing else is collectable'}"
        )
        ctx.note(
            "kerneldctl: hint: `kerneldctl gc --dry-run -v` lists each kept tree and why; unpin "
            "what is no longer needed (kerneldctl unpin), leases end when their jobs do, "
            "recently used trees become collectable after [store] gc_min_age"
        )
    if ctx.json:
        ctx.emit_json(doc)
        return EXIT_GC_TARGET_MISSED if missed else EXIT_OK
    verb = "would remove" if dry else "removed"
    for item in doc["removed"]:
        ctx.say(
            f"{verb} {item['tree_digest'][:19]} {item['repo_id']}@{item['commit'][:7]} "
            f"{item['variant']} ({human_bytes(int(item['size_bytes']))}, {item['reason']})"
        )
    for item in doc["kept"] if ctx.args.verbose else []:
        ctx.say(
            f"kept {item['tree_digest'][:19]} {item['repo_id']} "
            f"({human_bytes(int(item['size_bytes']))}, {item['reason']})"
        )
    ctx.say(
        f"{'would free' if dry else 'freed'} {human_bytes(int(doc['freed_bytes']))}: "
        f"{len(doc['removed'])} tree(s), {doc['orphan_blobs_removed']} orphan blob(s); "
        f"{len(doc['kept'])} tree(s) kept" + (f": {why}" if why else "")
    )
    return EXIT_GC_TARGET_MISSED if missed else EXIT_OK


# ---- verify -----------------------------------------------------------------------------------


#: (problems, repaired, exit mask, counts, quarantine entries) of one verification pass.
_Pass = tuple[list[dict[str, Any]], list[str], int, dict[str, int], list[dict[str, Any]]]


def _quarantined(q: Any) -> dict[str, Any]:
    """A store's quarantine entry (kerneld.store.verify.Quarantined) as `verify` shows it."""
    import datetime

    at = datetime.datetime.fromtimestamp(q.quarantined_at, tz=datetime.timezone.utc)
    return {
        "name": q.name,
        "path": str(q.path),
        "object": q.object,
        "id": q.id,
        "bytes": q.size_bytes,
        "reason": q.reason,
        "by": q.by,
        "quarantined_at": at.isoformat() if q.quarantined_at else None,
        "variants": [{"repo_id": r, "commit": c, "variant": v} for r, c, v in q.variants],
        "moved": q.moved,
    }


def _report_pass(report: Any, store: Any) -> _Pass:
    problems = [
        {"problem": p.kind, "object": p.object, "path": p.path, "detail": p.detail}
        for p in report.problems
    ]
    checked = {"blobs_checked": report.blobs_checked, "trees_checked": report.trees_checked}
    try:
        held = [_quarantined(q) for q in store.quarantine()]
    except PermissionError:  # the quarantine is the store owner's alone (0700)
        held = []
    return problems, list(report.repaired), int(report.exit_code), checked, held


def _daemon_pass(admin: Admin, repair: bool) -> _Pass:
    from kerneld_client._proto import kerneld_pb2

    problems: list[dict[str, Any]] = []
    repaired: list[str] = []
    held: list[dict[str, Any]] = []
    mask = 0
    checked: dict[str, int] | None = None
    for ev in admin.stream(
        admin.stub.Verify, kerneld_pb2.VerifyRequest(repair=repair, quarantine=True)
    ):
        kind = kerneld_pb2.VerifyEvent.Problem.Name(ev.problem)
        if kind == "SUMMARY":
            mask = int(ev.exit_mask)
            checked = {"blobs_checked": ev.blobs_checked, "trees_checked": ev.trees_checked}
        elif kind == "REPAIRED":
            repaired.append(ev.path or ev.detail)
        elif kind == "QUARANTINED":
            entry = proto_to_dict(ev.entry)
            held.append({"path": ev.path, **entry})
        else:
            problems.append(
                {"problem": kind.lower(), "object": "", "path": ev.path, "detail": ev.detail}
            )
    if checked is None:
        raise CtlError("the daemon ended the verification without a summary")
    return problems, repaired, mask, checked, held


def _say_quarantine(ctx: Ctx, held: list[dict[str, Any]]) -> None:
    """One line per quarantine entry: name, what, size, who put it there, when and why."""
    if not held:
        return
    total = sum(int(q.get("bytes") or 0) for q in held)
    ctx.say(
        f"quarantine: {len(held)} entr{'y' if len(held) == 1 else 'ies'}, "
        f"{human_bytes(total)} (kept, never deleted by verify; restore or drop one with the "
        "daemon stopped: kerneldctl verify --store <store> --restore|--drop NAME)"
    )
    for q in held:
        what = {"tree": f"tree sha256:{str(q['id'])[:16]}", "blob": f"blob {str(q['id'])[:16]}"}
        used = ", ".join(
            f"{v['repo_id']}@{str(v['commit'])[:7]}/{v['variant']}" for v in q.get("variants") or []
        )
        when = str(q.get("quarantined_at") or "")[:19].replace("T", " ")
        ctx.say(
            f"  {q['name']}: {what.get(str(q['object']), 'stray file')}, "
            f"{human_bytes(int(q.get('bytes') or 0))}, by {q.get('by') or '?'}"
            + (f" at {when} UTC" if when else "")
            + (f": {q['reason']}" if q.get("reason") else "")
            + (f"; used by {used}" if used else "")
            + ("" if q.get("moved", True) else "; NOT MOVED (left in place, out of service)")
        )


def cmd_verify(ctx: Ctx) -> int:
    """Exit with what is still wrong: after `--repair`, a second (read-only) pass decides, so
    a store whose every problem was repaired exits 0 and one with leftovers says which."""
    repair = bool(ctx.args.repair)
    if getattr(ctx.args, "restore", None) or getattr(ctx.args, "drop", None):
        return _quarantine_action(ctx)
    remaining: list[dict[str, Any]] | None = None
    try:
        if offline(ctx):
            with open_store(ctx, writable=repair) as store:
                problems, repaired, found, checked, held = _report_pass(
                    store.verify(repair=repair), store
                )
                mask = found
                if repair and problems:
                    remaining, _, mask, _, held = _report_pass(store.verify(repair=False), store)
        else:
            with Admin(ctx) as admin:
                problems, repaired, found, checked, held = _daemon_pass(admin, repair)
                mask = found
                if repair and problems:
                    remaining, _, mask, _, held = _daemon_pass(admin, False)
    except CtlError as exc:
        exc.code = EXIT_VERIFY_NOT_RUN
        raise
    doc: dict[str, Any] = {
        "exit_mask": mask,
        "found_mask": found,
        "problems": problems,
        "repaired": repaired,
        "quarantine": held,
        **checked,
    }
    if remaining is not None:
        doc["remaining"] = remaining
    if ctx.json:
        ctx.emit_json(doc)
        return mask
    for p in problems:
        ctx.say(f"{p['problem'].upper()}: {p['path']}: {p['detail']}")
    for r in repaired:
        ctx.say(f"repaired: {r}")
    kept = sum(1 for r in repaired if "quarantined, not deleted" in r)
    if kept:
        ctx.say(
            f"nothing was deleted: {kept} object(s) moved to the store's quarantine "
            "(v1/quarantine); "
            "the daemon re-fetches their variants where an upstream has them and then drops the "
            "copies, the rest stay until restored (--restore) or dropped (--drop)"
        )
    _say_quarantine(ctx, held)
    state = "clean" if not problems else f"{len(problems)} problem(s), exit mask {found}"
    ctx.say(
        f"verified {checked['blobs_checked']} blobs and {checked['trees_checked']} trees: {state}"
    )
    if remaining is not None:
        for p in remaining:
            ctx.say(f"REMAINING {p['problem'].upper()}: {p['path']}: {p['detail']}")
        ctx.say(
            "after repair: clean"
            if not remaining
            else f"after repair: {len(remaining)} problem(s) remain, exit mask {mask}"
        )
    return mask


def _quarantine_action(ctx: Ctx) -> int:
    """`verify --restore NAME` / `--drop NAME`: act on one quarantine entry (offline: the
    daemon owns its store, so it must be stopped)."""
    name = str(ctx.args.restore or ctx.args.drop)
    flag = "--restore" if ctx.args.restore else "--drop"
    if not offline(ctx):
        raise CtlError(
            "--restore and --drop work on the store directly",
            code=EXIT_USAGE,
            hint="stop the daemon, then run as the store's owner: runuser -u kerneld -- "
            f"kerneldctl verify --store /var/lib/kerneld/store {flag} {name}",
        )
    from kerneld.store import StoreError

    with open_store(ctx, writable=True) as store:
        try:
            if ctx.args.restore:
                trees = store.restore_quarantined(name)
                done = [f"{t.repo}@{t.commit}/{t.variant} ({t.digest})" for t in trees]
                doc: dict[str, Any] = {"restored": name, "variants": done}
            else:
                store.drop_quarantined(name)
                doc = {"dropped": name}
        except StoreError as exc:
            raise CtlError(
                f"cannot {flag.lstrip('-')} {name}: {exc}",
                hint="`kerneldctl verify --store ... --repair` lists what it quarantined; a "
                "restore re-hashes every file, so damaged bytes never come back",
            ) from None
    if ctx.json:
        ctx.emit_json(doc)
    elif ctx.args.restore:
        ctx.say(f"restored {name}: " + (", ".join(doc["variants"]) or "its blob"))
    else:
        ctx.say(f"dropped {name}")
    return EXIT_OK


# ---- env --------------------------------------------------------------------------------------


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
