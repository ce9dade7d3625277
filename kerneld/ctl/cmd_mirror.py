"""mirror export / mirror import, and the signing keys (key generate / key public)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kerneld.ctl.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CtlError,
    Ctx,
    offline,
    open_store,
)
from kerneld.ctl.progress import MirrorView
from kerneld.ctl.rpc import Admin
from kerneld.ctl.specs import parse_spec


def _key_dir(ctx: Ctx) -> Path | None:
    return Path(ctx.args.key_dir) if getattr(ctx.args, "key_dir", None) else None


def _event_kind(event: Any) -> str:
    name = event.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number[event.kind].name
    return str(name).lower().replace("_", "-")


# ---- export -----------------------------------------------------------------------------------


def cmd_mirror_export(ctx: Ctx) -> int:
    from kerneld.mirror.export import ExportError, ExportSpec, export_mirror, specs_from_lock
    from kerneld.mirror.keys import KeyFileError, load_signing_key
    from kerneld_client.lockfile import LockfileError, load_lockfile

    dest = os.path.abspath(ctx.args.to)
    if not ctx.args.kernels and not ctx.args.lock:
        raise CtlError("nothing to export: name kernels or give --lock FILE", code=EXIT_USAGE)
    for text in ctx.args.kernels or []:
        parse_spec(text)  # usage errors before any work
    variants = list(ctx.args.variants or ["all"])
    keys = list(ctx.args.sign_key or [])
    if offline(ctx):
        try:
            specs = [ExportSpec.parse(t) for t in ctx.args.kernels or []]
            if ctx.args.lock:
                specs += specs_from_lock(load_lockfile(ctx.args.lock))
            signers = [load_signing_key(k, _key_dir(ctx)) for k in keys]
        except (LockfileError, KeyFileError, ValueError) as exc:
            raise CtlError(str(exc)) from None
        with open_store(ctx, writable=False) as store, MirrorView(ctx, "exported") as view:
            try:
                report = export_mirror(
                    store,
                    dest,
                    specs,
                    variants=variants,
                    sign_keys=signers,
                    name=ctx.args.name or "",
                    progress=lambda ev: view.handle(ev.kind, ev),
                )
            except ExportError as exc:
                raise CtlError(str(exc)) from None
        doc = report.to_dict()
    else:
        if len(keys) > 1:
            raise CtlError(
                "the daemon signs with one key per export; run the export again with the "
                "second key (signatures accumulate), or use --store",
                code=EXIT_USAGE,
            )
        if _key_dir(ctx) is not None:
            # The daemon reads its keys itself, as its own user: a directory of the caller's
            # would be ignored, and an export signed with another key than asked is worse
            # than none.
            raise CtlError(
                "--key-dir applies to exports from a store (--store); through the daemon, "
                "signing keys come from the daemon's own key directory ($KERNELD_KEY_DIR of "
                "the daemon, else /etc/kerneld/keys on a system install)",
                hint="create the key as the daemon's user (sudo -u kerneld kerneldctl key "
                "generate NAME), or export with --store DIR --key-dir DIR",
                code=EXIT_USAGE,
            )
        from kerneld_client._proto import kerneld_pb2

        lock_text = ""
        if ctx.args.lock:
            try:
                lock_text = Path(ctx.args.lock).read_text(encoding="utf-8")
            except OSError as exc:
                raise CtlError(f"{ctx.args.lock}: {exc.strerror or exc}") from None
        request = kerneld_pb2.MirrorExportRequest(
            destination=dest,
            kernels=[_export_ref(t) for t in ctx.args.kernels or []],
            lockfile_json=lock_text,
            variants=variants,
            sign_key=keys[0] if keys else "",
        )
        doc = _stream_mirror(ctx, "exported", lambda a: a.stub.MirrorExport, request)
        doc["destination"] = dest
    if ctx.json:
        ctx.emit_json(doc)
    return EXIT_FAILURE if doc.get("refused") else EXIT_OK


def _export_ref(text: str) -> Any:
    """A KernelRef for the export request; no selector means the whole repo, as in kerneldctl."""
    return parse_spec(text).to_proto()


def _stream_mirror(ctx: Ctx, verb: str, method: Any, request: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"ok": True, "refused": [], "manifests": 0, "blobs": 0, "bytes": 0}
    kernels: list[dict[str, str]] = []
    refused: set[tuple[str, str]] = set()
    with Admin(ctx) as admin, MirrorView(ctx, verb) as view:
        for event in admin.stream(method(admin), request):
            kind = _event_kind(event)
            view.handle(kind, event)
            if kind == "manifest":
                kernels.append({"repo_id": event.repo_id, "commit": event.commit})
            elif kind == "refused":
                doc["refused"].append(
                    {"repo_id": event.repo_id, "commit": event.commit, "reason": event.detail}
                )
                refused.add((event.repo_id, event.commit))
            elif kind == "finished":
                doc["manifests"] = event.manifests
                doc["blobs"] = event.blobs
                doc["bytes"] = event.bytes_done
                doc["detail"] = event.detail
    done = [k for k in kernels if (k["repo_id"], k["commit"]) not in refused]
    doc["imported" if verb == "imported" else "kernels"] = done
    doc["ok"] = not doc["refused"]
    return doc


# ---- import -----------------------------------------------------------------------------------


def _trusted(ctx: Ctx) -> dict[str, str]:
    from kerneld.config import ConfigError, load_config

    keys: dict[str, str] = {}
    try:
        cfg = load_config(Path(ctx.args.config) if ctx.args.config else None)
        keys.update(cfg.trusted_keys)
    except ConfigError as exc:
        raise CtlError(str(exc)) from None
    for item in ctx.args.trust or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise CtlError(f"--trust takes NAME=ed25519:BASE64, got {item!r}", code=EXIT_USAGE)
        keys[name] = value
    return keys


def cmd_mirror_import(ctx: Ctx) -> int:
    source = os.path.abspath(ctx.args.source)
    if offline(ctx):
        from kerneld.mirror.import_ import MirrorImportRefused, import_mirror
        from kerneld.mirror.keys import KeyFileError

        trusted = {} if ctx.args.no_check_sigs else _trusted(ctx)
        if ctx.args.no_check_sigs:
            ctx.note("kerneldctl: WARNING: importing without signature checks (--no-check-sigs)")
        with (
            open_store(ctx, writable=True, create=True) as store,
            MirrorView(ctx, "imported") as view,
        ):
            try:
                report = import_mirror(
                    store,
                    source,
                    trusted,
                    no_check_sigs=bool(ctx.args.no_check_sigs),
                    progress=lambda ev: view.handle(ev.kind, ev),
                )
            except (MirrorImportRefused, KeyFileError) as exc:
                raise CtlError(f"refused {source}: {exc}") from None
        doc = report.to_dict()
    else:
        if ctx.args.trust:
            raise CtlError(
                "--trust only applies with --store; the daemon trusts the keys in its config "
                "([mirror] trusted_keys)",
                code=EXIT_USAGE,
            )
        from kerneld_client._proto import kerneld_pb2

        request = kerneld_pb2.MirrorImportRequest(
            source=source, no_check_sigs=bool(ctx.args.no_check_sigs)
        )
        doc = _stream_mirror(ctx, "imported", lambda a: a.stub.MirrorImport, request)
        doc["source"] = source
    if ctx.json:
        ctx.emit_json(doc)
    return EXIT_FAILURE if doc.get("refused") else EXIT_OK


# ---- keys -------------------------------------------------------------------------------------


def cmd_key_generate(ctx: Ctx) -> int:
    from kerneld.mirror.keys import KeyFileError, default_key_dir, generate_key

    key_dir = _key_dir(ctx) or default_key_dir()
    try:
        key = generate_key(ctx.args.name, key_dir, overwrite=bool(ctx.args.force))
    except KeyFileError as exc:
        raise CtlError(str(exc)) from None
    doc = {
        "name": key.name,
        "public_key": key.public,
        "private_key_file": str(key_dir / f"{key.name}.key"),
        "public_key_file": str(key_dir / f"{key.name}.pub"),
        "trusted_keys_line": f'{key.name} = "{key.public}"',
    }
    if ctx.json:
        ctx.emit_json(doc)
    else:
        ctx.say(f"created {doc['private_key_file']} (keep it secret) and {doc['public_key_file']}")
        ctx.say("add this line under [mirror.trusted_keys] in kerneld.toml on importing hosts:")
        ctx.say(f"  {doc['trusted_keys_line']}")
    return EXIT_OK


def cmd_key_public(ctx: Ctx) -> int:
    from kerneld.mirror.keys import KeyFileError, load_public_key

    try:
        public = load_public_key(ctx.args.name, _key_dir(ctx))
    except KeyFileError as exc:
        raise CtlError(str(exc)) from None
    if ctx.json:
        ctx.emit_json({"name": ctx.args.name, "public_key": public})
    else:
        ctx.out.write(public + "\n")
    return EXIT_OK
