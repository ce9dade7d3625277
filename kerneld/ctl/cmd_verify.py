"""verify: re-hash the store, optionally repair it, and manage its quarantine.

Through the daemon's admin socket by default (the daemon streams its pass), or on a store
directly with `--store`. Repairs never delete: damaged objects go to the store's quarantine,
which `--restore` / `--drop` act on (offline only: the daemon owns its store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kerneld.ctl.common import (
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERIFY_NOT_RUN,
    CtlError,
    Ctx,
    human_bytes,
    offline,
    open_store,
)
from kerneld.ctl.subcommands import Commands

if TYPE_CHECKING:
    from kerneld.ctl.rpc import Admin

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
        held = [_quarantined(q) for q in store.quarantine.entries()]
    except PermissionError:  # the quarantine is the store owner's alone (0700)
        held = []
    return problems, list(report.repaired), int(report.exit_code), checked, held


def _daemon_pass(admin: Admin, repair: bool) -> _Pass:
    from kerneld.ctl.listing import proto_to_dict
    from kerneld_client.proto import kerneld_pb2

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
                    store.repair.verify(repair=repair), store
                )
                mask = found
                if repair and problems:
                    remaining, _, mask, _, held = _report_pass(
                        store.repair.verify(repair=False), store
                    )
        else:
            from kerneld.ctl.rpc import Admin

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
                trees = store.quarantine.restore(name)
                done = [f"{t.repo}@{t.commit}/{t.variant} ({t.digest})" for t in trees]
                doc: dict[str, Any] = {"restored": name, "variants": done}
            else:
                store.quarantine.drop(name)
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


def register(commands: Commands) -> None:
    p = commands.add(
        "verify",
        cmd_verify,
        "Re-hash every blob and tree. Exit status is a bitmask of what is wrong: 1 corrupt, "
        "2 untrusted (owner, mode, links), 4 I/O error; 8 if verification could not run. With "
        "--repair, of what remains after the repair (0: everything was repaired).",
        "  kerneldctl verify\n"
        "  kerneldctl verify --repair\n"
        "  kerneldctl verify --store /var/lib/kerneld/store   (daemon stopped)\n",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="take what is broken out of service: quarantined (kept, never deleted) and "
        "re-fetched where an upstream has it",
    )
    p.add_argument("--restore", metavar="NAME", help="put a quarantine entry back (re-hashed)")
    p.add_argument("--drop", metavar="NAME", help="delete a quarantine entry for good")
