"""status: daemon readiness, store usage, quarantine, upstreams, pins, denies, leases.

Through the admin socket by default; where this user may not use it, what the user socket tells
(every kerneld-users member may ask); or, with `--store`, read off the store directly (read-only,
safe beside a running daemon).
"""

from __future__ import annotations

from typing import Any

from kerneld.ctl.common import (
    EXIT_OK,
    Ctx,
    DaemonNotReachable,
    PermissionDenied,
    human_bytes,
    offline,
    open_store,
)
from kerneld.ctl.subcommands import Commands


def cmd_status(ctx: Ctx) -> int:
    if offline(ctx):
        with open_store(ctx, writable=False) as store:
            usage = store.space.usage()
            now_refs = [
                {"repo_id": r.repo, "ref": r.ref, "commit": r.commit, "fetched_at": r.fetched_at}
                for repo in store.names.repos()
                for r in store.names.refs_of(repo)
            ]
            import time

            entries: int | None
            held: int | None
            try:
                entries, held = store.quarantine.usage()
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
                "pins": len(store.names.pins()),
                "denies": len(store.names.denies()),
                "active_leases": sum(1 for x in store.leases.rows() if x.expires_at > time.time()),
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
    for problem in doc.get("listener_problems") or []:
        ctx.say(f"NOT LISTENING: {problem}")
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
    if doc.get("import_only"):
        ctx.say(IMPORT_ONLY_LINE)
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


IMPORT_ONLY_LINE = "import-only: no upstream; kernels arrive by kerneldctl mirror import"


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
    from kerneld.ctl.listing import proto_to_dict
    from kerneld.ctl.rpc import Admin, UserChannel
    from kerneld_client.proto import kerneld_pb2

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


def register(commands: Commands) -> None:
    commands.add(
        "status",
        cmd_status,
        "Daemon readiness, store usage, upstreams, pins, denies, leases (without access to "
        "the admin socket: what the user socket tells, for kerneld-users members).",
        "  kerneldctl status\n  kerneldctl status --json\n  kerneldctl status --store PATH\n",
    )
