"""gc: free store space now, or show (`--dry-run -v`) what would go and what is kept and why.

Through the daemon's admin socket by default, or on a store directly with `--store` (a dry run
opens it read-only; a real one needs the daemon stopped). A `--target-free` the store cannot
reach exits with its own code and says what holds the rest.
"""

from __future__ import annotations

from typing import Any

from kerneld.ctl.common import (
    EXIT_GC_TARGET_MISSED,
    EXIT_OK,
    EXIT_USAGE,
    CtlError,
    Ctx,
    human_bytes,
    offline,
    open_store,
)
from kerneld.ctl.subcommands import Commands


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


def _size(text: str | None) -> int:
    """`--target-free` in bytes: `20GiB`, `20GB` (10^9), `500MiB` or a byte count."""
    from kerneld.config import ConfigError
    from kerneld.config.values import parse_size

    if not text:
        return 0
    try:
        return parse_size(text, source="--target-free", key="size")
    except ConfigError:
        raise CtlError(
            f"--target-free takes a size like 20GiB, 500MB or a byte count, got {text!r}",
            code=EXIT_USAGE,
        ) from None


def cmd_gc(ctx: Ctx) -> int:
    dry = bool(ctx.args.dry_run)
    target = _size(ctx.args.target_free)
    if offline(ctx):
        with open_store(ctx, writable=not dry) as store:
            if target:
                # as the daemon does: free until `target` more bytes are free than now
                from dataclasses import replace

                free = store.space.usage().free_bytes
                store.gc.policy = replace(store.gc.policy, free_target_bytes=free + target)
            report = store.gc.collect(dry_run=dry)
        doc: dict[str, Any] = {
            "dry_run": dry,
            "removed": [_gc_item(t) for t in report.deleted_trees],
            "kept": [_gc_item(t) for t in report.kept_trees],
            "freed_bytes": report.bytes_freed,
            "orphan_blobs_removed": len(report.blobs_deleted),
        }
    else:
        from kerneld.ctl.listing import proto_to_dict
        from kerneld.ctl.rpc import Admin
        from kerneld_client.proto import kerneld_pb2

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


def register(commands: Commands) -> None:
    p = commands.add(
        "gc",
        cmd_gc,
        "Collect garbage: unreferenced trees and blobs, and least recently used ones under "
        "pressure.",
        "  kerneldctl gc --dry-run\n  kerneldctl gc --json\n",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    p.add_argument(
        "--target-free",
        metavar="SIZE",
        help="free at least this much: 20GiB, 500MB or a byte count (exit 6 when what is "
        "pinned, leased or in use prevents it)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also list what is kept and why")
