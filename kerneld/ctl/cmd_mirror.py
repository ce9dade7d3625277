"""mirror export / mirror import, and the signing keys (key generate / key public)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneld.ctl.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CtlError,
    Ctx,
    PermissionDenied,
    offline,
    open_store,
)
from kerneld.ctl.subcommands import FORMATTER, Commands, epilog

if TYPE_CHECKING:
    from kerneld.mirror.keys import SigningKey


def _key_dir(ctx: Ctx) -> Path | None:
    return Path(ctx.args.key_dir) if getattr(ctx.args, "key_dir", None) else None


def _event_kind(event: Any) -> str:
    name = event.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number[event.kind].name
    return str(name).lower().replace("_", "-")


# ---- export -----------------------------------------------------------------------------------


def cmd_mirror_export(ctx: Ctx) -> int:
    from kerneld.ctl.specs import parse_spec
    from kerneld.ctl.views import MirrorView
    from kerneld.mirror.destination import ExportError
    from kerneld.mirror.export import export_mirror
    from kerneld.mirror.keys import KeyFileError, load_signing_key
    from kerneld.mirror.selection import ExportSpec, specs_from_lock
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
        # Signed here, with the admin's own keys: the daemon cannot (and must not) read them.
        try:
            signers = [load_signing_key(k, _key_dir(ctx)) for k in keys]
        except KeyFileError as exc:
            raise CtlError(str(exc)) from None
        doc = _export_through_daemon(ctx, Path(dest), variants, signers)
    if ctx.json:
        ctx.emit_json(doc)
    return EXIT_FAILURE if doc.get("refused") else EXIT_OK


#: The request carries the destination's documents; the daemon takes at most 4 MiB.
_MAX_REQUEST_BYTES = 3 << 20


def _export_through_daemon(
    ctx: Ctx, dest: Path, variants: list[str], signers: list[SigningKey]
) -> dict[str, Any]:
    """The daemon streams the export's files; this process (the admin) writes them.

    The daemon runs as its own user in a sandbox (read-only /srv, a private /tmp): a path it
    wrote would be the wrong file, or none. Here the destination is written with the admin's
    own permissions, a .tar atomically (staged beside it, renamed at the end, removed on
    failure), a directory file by file."""
    from kerneld.ctl.specs import parse_spec
    from kerneld.mirror.destination import ExportError
    from kerneld.mirror.receive import ExportReceiver
    from kerneld_client.lockfile import LockfileError, parse_lockfile
    from kerneld_client.proto import kerneld_pb2

    lock_text = ""
    repos = {parse_spec(t).repo_id for t in ctx.args.kernels or []}
    if ctx.args.lock:
        try:
            lock_text = Path(ctx.args.lock).read_text(encoding="utf-8")
            repos |= {
                repo for repo, _c, _r in parse_lockfile(lock_text, source=ctx.args.lock).pinned()
            }
        except OSError as exc:
            raise CtlError(f"{ctx.args.lock}: {exc.strerror or exc}") from None
        except LockfileError as exc:
            raise CtlError(str(exc)) from None
    try:
        with ExportReceiver(dest) as receiver:
            receiver.sign_with(signers)
            existing, present = receiver.existing(repos)
            request = kerneld_pb2.MirrorExportRequest(
                destination=str(dest),
                kernels=[_export_ref(t) for t in ctx.args.kernels or []],
                lockfile_json=lock_text,
                variants=variants,
                existing=[kerneld_pb2.MirrorFile(path=k, data=v) for k, v in existing.items()],
                present_blobs=present,
            )
            if request.ByteSize() > _MAX_REQUEST_BYTES:
                raise CtlError(
                    f"{dest} already holds {request.ByteSize()} bytes of manifests and refs for "
                    "these kernels, more than one request to the daemon may carry",
                    hint="export into a new directory or .tar, or use --store DIR",
                )
            doc = _stream_mirror(
                ctx, "exported", lambda a: a.stub.MirrorExport, request, on_file=receiver.handle
            )
            receiver.commit()
    except ExportError as exc:
        raise CtlError(str(exc)) from None
    except OSError as exc:
        raise CtlError(
            f"cannot write {dest}: {exc.strerror or exc}",
            hint="kerneldctl writes the export itself, as you: choose a destination you may write",
        ) from None
    doc["destination"] = str(dest)
    doc["signed_by"] = [k.name for k in signers]
    return doc


def _export_ref(text: str) -> Any:
    """A KernelRef for the export request; no selector means the whole repo, as in kerneldctl."""
    from kerneld.ctl.specs import parse_spec

    return parse_spec(text).to_proto()


def _stream_mirror(
    ctx: Ctx,
    verb: str,
    method: Any,
    request: Any,
    *,
    on_file: Callable[[str, str, int, bytes], None] | None = None,
) -> dict[str, Any]:
    from kerneld.ctl.rpc import Admin
    from kerneld.ctl.views import MirrorView

    doc: dict[str, Any] = {"ok": True, "refused": [], "manifests": 0, "blobs": 0, "bytes": 0}
    kernels: list[dict[str, str]] = []
    refused: set[tuple[str, str]] = set()
    with Admin(ctx) as admin, MirrorView(ctx, verb) as view:
        for event in admin.stream(method(admin), request):
            kind = _event_kind(event)
            if kind in ("file", "data", "delete"):
                if on_file is None:
                    raise CtlError(f"the daemon sent export file data to a {verb!r} request")
                on_file(kind, event.path, event.bytes_total, event.data)
                continue
            view.handle(kind, event)
            if kind == "manifest":
                kernels.append({"repo_id": event.repo_id, "commit": event.commit})
            elif kind == "refused":
                doc["refused"].append(
                    {"repo_id": event.repo_id, "commit": event.commit, "reason": event.detail}
                )
                refused.add((event.repo_id, event.commit))
            elif kind == "verdict":
                if event.detail:
                    doc.setdefault("publishers_vouched", {})[event.repo_id] = event.detail
                else:
                    doc.setdefault("without_verdicts", []).append(event.repo_id)
            elif kind == "finished":
                doc["manifests"] = event.manifests
                doc["blobs"] = event.blobs
                doc["bytes"] = event.bytes_done
                doc["detail"] = event.detail
    done = [k for k in kernels if (k["repo_id"], k["commit"]) not in refused]
    doc["imported" if verb == "imported" else "kernels"] = done
    if verb == "imported":
        doc.setdefault("publishers_vouched", {})
        doc.setdefault("without_verdicts", [])
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


class _Upload:
    """The upload's messages: the bundle read here, as the admin (the daemon's sandbox may not
    see the path: ProtectHome, a private /tmp), and sent over the admin socket. gRPC reads the
    messages on its own thread: a read error is kept for `check` to raise here."""

    def __init__(self, ctx: Ctx, source: Path) -> None:
        from kerneld.mirror.tarball import stream_bundle

        self.source = source
        self.error: Exception | None = None
        # read once the daemon answers (its errors first)
        self._chunks = _stdin_chunks() if str(source) == STDIN else stream_bundle(source)
        self._no_check_sigs = bool(ctx.args.no_check_sigs)

    def _guarded(self, read: Callable[[], bytes]) -> bytes:
        from kerneld.mirror.destination import ExportError

        try:
            return read()
        except FileNotFoundError:
            raise CtlError(f"{self.source} does not exist") from None
        except PermissionError as exc:
            raise PermissionDenied(f"cannot read {self.source}: {exc.strerror}") from None
        except (ExportError, OSError) as exc:
            raise CtlError(f"cannot read {self.source}: {exc}") from None

    def __iter__(self) -> Iterator[Any]:
        from kerneld_client.proto import kerneld_pb2

        start = kerneld_pb2.MirrorImportRequest(
            source=str(self.source), no_check_sigs=self._no_check_sigs
        )
        try:
            first = next(self._chunks, b"")
            yield kerneld_pb2.MirrorUpload(start=start, data=first)
            for chunk in self._chunks:
                yield kerneld_pb2.MirrorUpload(data=chunk)
        except Exception as exc:  # ends the call; `check` says why
            self.error = exc
            raise

    def check(self) -> None:
        error = self.error
        if error is not None:

            def reraise() -> bytes:
                raise error

            self._guarded(reraise)


STDIN = "-"
"""`--from -`: the bundle (a .tar, compressed or not) on standard input (`kubectl exec -i`)."""


def _stdin_chunks() -> Iterator[bytes]:
    import sys

    from kerneld.mirror.destination import CHUNK

    while chunk := sys.stdin.buffer.read(CHUNK):
        yield chunk


def _spooled_stdin() -> Any:
    """Standard input in a temporary file (an import without the daemon reads the tar twice)."""
    import shutil
    import sys
    import tempfile

    spool = tempfile.NamedTemporaryFile(prefix="kerneldctl-import-", suffix=".tar")  # noqa: SIM115
    shutil.copyfileobj(sys.stdin.buffer, spool, 1 << 20)
    spool.flush()
    return spool


def cmd_mirror_import(ctx: Ctx) -> int:
    from kerneld.ctl.views import MirrorView

    from_stdin = ctx.args.source == STDIN
    source = STDIN if from_stdin else os.path.abspath(ctx.args.source)
    if not from_stdin and not os.path.lexists(source):
        raise CtlError(
            f"{source} does not exist: --from takes a bundle (.tar, compressed or not), a "
            "mirror directory, or - for standard input"
        )
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
            spool = _spooled_stdin() if from_stdin else None
            try:
                report = import_mirror(
                    store,
                    spool.name if spool is not None else source,
                    trusted,
                    no_check_sigs=bool(ctx.args.no_check_sigs),
                    progress=lambda ev: view.handle(ev.kind, ev),
                )
            except (MirrorImportRefused, KeyFileError) as exc:
                message = str(exc) if spool is None else str(exc).replace(spool.name, "stdin")
                raise CtlError(f"refused {source}: {message}") from None
            finally:
                if spool is not None:
                    spool.close()
        doc = report.to_dict()
        doc["source"] = source
    else:
        if ctx.args.trust:
            raise CtlError(
                "--trust only applies with --store; the daemon trusts the keys in its config "
                "([mirror] trusted_keys)",
                code=EXIT_USAGE,
            )
        upload = _Upload(ctx, Path(source))
        try:
            doc = _stream_mirror(ctx, "imported", lambda a: a.stub.MirrorImportUpload, iter(upload))
        except CtlError:
            upload.check()  # a read error here is the real reason the call ended
            raise
        doc["source"] = source
    if ctx.json:
        ctx.emit_json(doc)
    return EXIT_FAILURE if doc.get("refused") else EXIT_OK


def register(commands: Commands) -> None:
    mirror = commands.group(
        "mirror",
        "Export or import a signed static mirror (air-gapped transfer).",
        "Export or import a signed static mirror (air-gapped transfer).",
        "  kerneldctl mirror export --to /media/usb/kernels.tar --lock kernels.lock "
        "--sign-key site-1\n"
        "  kerneldctl mirror import --from /media/usb/kernels.tar\n",
        dest="mirror_command",
        metavar="export|import",
    )
    p = mirror.add_parser(
        "export",
        parents=[commands.both],
        help="Write kernels from the store as a mirror directory or .tar (incremental).",
        description="Write kernels from the store as a mirror directory or .tar file. An "
        "existing mirror only receives what it lacks; manifests and refs are signed with "
        "--sign-key (Ed25519).",
        epilog=epilog(
            "  kerneldctl mirror export --to /srv/mirror kernels-community/activation:1\n"
            "  kerneldctl mirror export --to kernels.tar --lock kernels.lock --sign-key site-1\n"
            "  kerneldctl mirror export --store ./store --to out.tar org/k --variants "
            "torch-universal\n"
        ),
        formatter_class=FORMATTER,
    )
    p.set_defaults(handler=cmd_mirror_export)
    p.add_argument("kernels", nargs="*", metavar="REPO", help="org/name (all it has), :N or @REV")
    p.add_argument("--to", required=True, metavar="DIR|FILE.tar", help="destination")
    p.add_argument("--lock", metavar="FILE", help="export every entry of a kernels.lock")
    p.add_argument("--variants", nargs="+", metavar="all|NAME", help="default: all in the store")
    p.add_argument(
        "--sign-key", action="append", metavar="NAME", help="sign with this key (repeatable)"
    )
    p.add_argument("--key-dir", metavar="DIR", help="where keys live (default: see key --help)")
    p.add_argument("--name", metavar="TEXT", help="a name recorded in mirror-info")
    p = mirror.add_parser(
        "import",
        parents=[commands.both],
        help="Import a mirror directory or .tar into the store (signatures checked first).",
        description="Import a mirror directory or .tar file. Signatures are checked against "
        "the trusted keys first; every byte is verified by the store; a kernel with any bad "
        "file is not published at all.",
        epilog=epilog(
            "  kerneldctl mirror import --from /media/usb/kernels.tar\n"
            "  kerneldctl mirror import --store ./store --from m.tar --trust site-1=ed25519:...\n"
        ),
        formatter_class=FORMATTER,
    )
    p.set_defaults(handler=cmd_mirror_import)
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="DIR|FILE.tar|-",
        help="the bundle: a mirror directory, a .tar (compressed or not), or - (stdin)",
    )
    p.add_argument(
        "--no-check-sigs", action="store_true", help="skip signature checks (content still hashed)"
    )
    p.add_argument(
        "--trust", action="append", metavar="NAME=KEY", help="with --store: trust this key too"
    )
