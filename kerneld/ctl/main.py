"""`kerneldctl`: administer the host's kerneld daemon and its kernel store.

Commands talk to the daemon over its admin socket (`--admin-socket`, default from
`kerneld_client.locations`), or, with `--store PATH`, work on a store directly (read-only where
possible, so safe beside a running daemon; changes need the daemon stopped). Every command takes
`--json` and documents its exit codes in `--help`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from kerneld import __version__
from kerneld.ctl.common import (
    EXIT_CODES_HELP,
    EXIT_FAILURE,
    EXIT_USAGE,
    CtlError,
    Ctx,
    stdout_ctx,
)

Handler = Callable[[Ctx], int]
#: "module:function" in kerneld.ctl, imported only when run (keeps --help fast).
HandlerRef = str
_F = argparse.RawDescriptionHelpFormatter


def _common(*, store: bool = True, socket: bool = True) -> argparse.ArgumentParser:
    """Options every subcommand accepts (so they work after the subcommand name)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    if socket:
        p.add_argument(
            "--admin-socket",
            metavar="PATH",
            help="the daemon's admin socket (default: $KERNELD_ADMIN_SOCKET, else the one that "
            "exists, else /run/kerneld/admin.sock as root or on a system install, else "
            "$XDG_RUNTIME_DIR/kerneld/admin.sock)",
        )
        p.add_argument(
            "--timeout", type=float, metavar="SECONDS", help="deadline of a daemon call (30)"
        )
    if store:
        p.add_argument(
            "--store",
            metavar="PATH",
            help="work on this store directly instead of through the daemon",
        )
    p.add_argument(
        "--config", metavar="FILE", help="kerneld.toml to read (trusted keys, upstreams)"
    )
    return p


def _epilog(examples: str) -> str:
    return "examples:\n" + examples.rstrip() + "\n\n" + EXIT_CODES_HELP


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerneldctl",
        description="Administer the host's kerneld daemon and its kernel store.",
        formatter_class=_F,
        epilog=_epilog(
            "  kerneldctl status\n"
            "  kerneldctl prefetch kernels-community/activation:1 --variants auto\n"
            "  kerneldctl ls --json\n"
            "  kerneldctl verify --store /var/lib/kerneld/store   (daemon stopped)\n"
            "  kerneldctl mirror export --to /media/usb/kernels.tar --lock kernels.lock "
            "--sign-key site-1\n"
            "  kerneldctl publish . --repo myorg/mykernel --ref v1 --mirror /srv/kernel-mirror\n"
        ),
    )
    parser.add_argument("--version", action="version", version=f"kerneldctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    both = _common()
    store_only = _common(socket=False)

    def add(
        name: str, handler: HandlerRef, help_: str, examples: str, *parents: argparse.ArgumentParser
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            parents=list(parents) or [both],
            help=help_,
            description=help_,
            epilog=_epilog(examples),
            formatter_class=_F,
        )
        p.set_defaults(handler=handler)
        return p

    add(
        "status",
        "cmd_status:cmd_status",
        "Daemon readiness, store usage, upstreams, pins, denies, leases (without access to "
        "the admin socket: what the user socket tells, for kerneld-users members).",
        "  kerneldctl status\n  kerneldctl status --json\n  kerneldctl status --store PATH\n",
    )
    p = add(
        "ls",
        "cmd_ls:cmd_ls",
        "List the kernels in the store: revisions, refs, variants, sizes, pins.",
        "  kerneldctl ls\n  kerneldctl ls kernels-community/activation --json\n",
    )
    p.add_argument("repos", nargs="*", metavar="REPO", help="only these repos (org/name)")
    p = add(
        "info",
        "cmd_ls:cmd_info",
        "Describe one kernel in the store (its revisions, variants, trees, metadata).",
        "  kerneldctl info kernels-community/activation\n"
        "  kerneldctl info kernels-community/activation@v1 --json\n",
    )
    p.add_argument(
        "kernel", metavar="REPO[@REV]", help="org/name, org/name:VERSION or org/name@REV"
    )

    p = add(
        "prefetch",
        "cmd_prefetch:cmd_prefetch",
        "Fetch kernels ahead of need (progress bar on a terminal, quiet lines otherwise).",
        "  kerneldctl prefetch kernels-community/activation:1 org/relu@main\n"
        "  kerneldctl prefetch --lock kernels.lock --variants all\n"
        "  kerneldctl prefetch --pyproject . --torch 2.12,2.13\n"
        "  kerneldctl prefetch --store ./store --hub-endpoint http://127.0.0.1:8080 org/k:1\n",
    )
    p.add_argument(
        "kernels", nargs="*", metavar="KERNEL", help="org/name, org/name:VERSION, org/name@REV"
    )
    p.add_argument("--lock", metavar="FILE", help="prefetch every entry of a kernels.lock")
    p.add_argument("--pyproject", metavar="PATH", help="[tool.kernels.dependencies] of a project")
    p.add_argument(
        "--variants",
        nargs="+",
        metavar="auto|all|NAME",
        help="auto (what this host can run; default), all, or variant names",
    )
    p.add_argument(
        "--torch", action="append", metavar="X.Y[,X.Y]", help="torch versions to cover in auto"
    )
    p.add_argument("--hub-endpoint", metavar="URL", help="with --store: fetch from this Hub")

    for name, handler, verb in (
        ("pin", "cmd_pin:cmd_pin", "Keep a kernel's trees from garbage collection."),
        ("unpin", "cmd_pin:cmd_unpin", "Remove a pin."),
    ):
        p = add(
            name,
            handler,
            verb,
            f"  kerneldctl {name} kernels-community/activation:1\n"
            f"  kerneldctl {name} kernels-community/activation@main --variant torch-universal\n",
        )
        p.add_argument("kernel", metavar="REPO[@REV]")
        p.add_argument("--variant", metavar="NAME", help="only this variant")
        p.add_argument("--reason", metavar="TEXT", help="why (logged)")

    p = add(
        "deny",
        "cmd_pin:cmd_deny",
        "Disable a kernel (or one revision of it) on this host, effective for new loads at once.",
        "  kerneldctl deny kernels-community/bad --reason 'crashes on H100'\n"
        "  kerneldctl deny kernels-community/activation@0123abcd...\n"
        "  kerneldctl deny --list\n",
    )
    p.add_argument("kernel", nargs="?", metavar="REPO[@REV]")
    p.add_argument("--reason", metavar="TEXT")
    p.add_argument("--list", action="store_true", help="list what is denied")
    p = add(
        "allow",
        "cmd_pin:cmd_allow",
        "Lift a deny.",
        "  kerneldctl allow kernels-community/bad\n",
    )
    p.add_argument("kernel", metavar="REPO[@REV]")

    p = add(
        "gc",
        "cmd_gc:cmd_gc",
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

    p = add(
        "verify",
        "cmd_verify:cmd_verify",
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

    add(
        "reload",
        "cmd_reload:cmd_reload",
        "Make the daemon re-read its configuration file; exit 1 with the daemon's reason if it "
        "rejects the file (it then keeps running with the old one). `systemctl reload kerneld` "
        "runs this.",
        "  kerneldctl reload\n  kerneldctl reload --json\n",
        _common(store=False),
    )

    p = add(
        "lock",
        "cmd_lock:cmd_lock",
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

    mirror = sub.add_parser(
        "mirror",
        help="Export or import a signed static mirror (air-gapped transfer).",
        description="Export or import a signed static mirror (air-gapped transfer).",
        formatter_class=_F,
        epilog=_epilog(
            "  kerneldctl mirror export --to /media/usb/kernels.tar --lock kernels.lock "
            "--sign-key site-1\n"
            "  kerneldctl mirror import --from /media/usb/kernels.tar\n"
        ),
    )
    msub = mirror.add_subparsers(dest="mirror_command", metavar="export|import", required=True)
    p = msub.add_parser(
        "export",
        parents=[both],
        help="Write kernels from the store as a mirror directory or .tar (incremental).",
        description="Write kernels from the store as a mirror directory or .tar file. An "
        "existing mirror only receives what it lacks; manifests and refs are signed with "
        "--sign-key (Ed25519).",
        epilog=_epilog(
            "  kerneldctl mirror export --to /srv/mirror kernels-community/activation:1\n"
            "  kerneldctl mirror export --to kernels.tar --lock kernels.lock --sign-key site-1\n"
            "  kerneldctl mirror export --store ./store --to out.tar org/k --variants "
            "torch-universal\n"
        ),
        formatter_class=_F,
    )
    p.set_defaults(handler="cmd_mirror:cmd_mirror_export")
    p.add_argument("kernels", nargs="*", metavar="REPO", help="org/name (all it has), :N or @REV")
    p.add_argument("--to", required=True, metavar="DIR|FILE.tar", help="destination")
    p.add_argument("--lock", metavar="FILE", help="export every entry of a kernels.lock")
    p.add_argument("--variants", nargs="+", metavar="all|NAME", help="default: all in the store")
    p.add_argument(
        "--sign-key", action="append", metavar="NAME", help="sign with this key (repeatable)"
    )
    p.add_argument("--key-dir", metavar="DIR", help="where keys live (default: see key --help)")
    p.add_argument("--name", metavar="TEXT", help="a name recorded in mirror-info")
    p = msub.add_parser(
        "import",
        parents=[both],
        help="Import a mirror directory or .tar into the store (signatures checked first).",
        description="Import a mirror directory or .tar file. Signatures are checked against "
        "the trusted keys first; every byte is verified by the store; a kernel with any bad "
        "file is not published at all.",
        epilog=_epilog(
            "  kerneldctl mirror import --from /media/usb/kernels.tar\n"
            "  kerneldctl mirror import --store ./store --from m.tar --trust site-1=ed25519:...\n"
        ),
        formatter_class=_F,
    )
    p.set_defaults(handler="cmd_mirror:cmd_mirror_import")
    p.add_argument("--from", dest="source", required=True, metavar="DIR|FILE.tar")
    p.add_argument(
        "--no-check-sigs", action="store_true", help="skip signature checks (content still hashed)"
    )
    p.add_argument(
        "--trust", action="append", metavar="NAME=KEY", help="with --store: trust this key too"
    )

    p = add(
        "publish",
        "cmd_publish:cmd_publish",
        "Publish a local kernel build (build/<variant>/... as the kernel builder writes it) "
        "into a mirror directory that daemons serve, or into a stopped daemon's store. Every "
        "variant's metadata.json digest must describe exactly its files; nothing is written "
        "otherwise. The commit is the git checkout's HEAD (a dirty checkout is refused); "
        "--ref names only move forward.",
        "  kerneldctl publish . --repo myorg/mykernel --ref v1 --mirror /srv/kernel-mirror\n"
        "  kerneldctl publish . --repo myorg/mykernel --ref v1 --mirror /srv/kernel-mirror "
        "--sign-key site-1\n"
        "  kerneldctl publish build/torch-universal --repo myorg/mykernel --commit 0123abcd... "
        "--store ./store\n",
        _common(store=False, socket=False),
    )
    p.add_argument(
        "path",
        metavar="PATH",
        help="the kernel's repo folder (holding build/<variant>/...) or one build/<variant>",
    )
    p.add_argument("--repo", required=True, metavar="ORG/NAME", help="the kernel's repo id")
    p.add_argument(
        "--commit",
        metavar="SHA",
        help="the commit the build is of (40 hex); default: HEAD of PATH's git checkout, "
        "required outside one",
    )
    p.add_argument(
        "--ref",
        action="append",
        metavar="NAME",
        help="point this branch at the commit, e.g. the version branch v1 (repeatable); only "
        "forward, to a descendant of the commit it points at",
    )
    p.add_argument(
        "--allow-dirty", action="store_true", help="publish a checkout with uncommitted changes"
    )
    p.add_argument(
        "--force-refs",
        action="store_true",
        help="move --ref even to a commit that does not descend from its current one (a "
        "rollback, or a folder outside git)",
    )
    p.add_argument(
        "--mirror",
        metavar="DIR|FILE.tar",
        help="add the kernel to this mirror (created, or extended)",
    )
    p.add_argument(
        "--sign-key", action="append", metavar="NAME", help="sign with this key (repeatable)"
    )
    p.add_argument("--key-dir", metavar="DIR", help="where keys live (default: see key --help)")
    p.add_argument("--name", metavar="TEXT", help="a name recorded in a new mirror's mirror-info")
    p.add_argument(
        "--store",
        metavar="PATH",
        help="publish into this store instead (its daemon stopped; run as the store's owner)",
    )

    key = sub.add_parser(
        "key",
        help="Manage mirror signing keys.",
        description="Manage Ed25519 mirror signing keys. Keys live in --key-dir, default "
        "$KERNELD_KEY_DIR, else /etc/kerneld/keys (root), else ~/.config/kerneld/keys.",
        formatter_class=_F,
        epilog=_epilog("  kerneldctl key generate site-1\n  kerneldctl key public site-1\n"),
    )
    ksub = key.add_subparsers(dest="key_command", metavar="generate|public", required=True)
    key_common = argparse.ArgumentParser(add_help=False)
    key_common.add_argument("--json", action="store_true", help="print one JSON document")
    key_common.add_argument("--key-dir", metavar="DIR", help="key directory")
    p = ksub.add_parser(
        "generate",
        parents=[key_common],
        help="Create NAME.key (0600) and NAME.pub.",
        epilog=_epilog("  kerneldctl key generate site-2\n"),
        formatter_class=_F,
    )
    p.set_defaults(handler="cmd_key:cmd_key_generate")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--force", action="store_true", help="replace an existing key")
    p = ksub.add_parser(
        "public",
        parents=[key_common],
        help="Print NAME's public key (for [mirror] trusted_keys on importing hosts).",
        epilog=_epilog("  kerneldctl key public site-1\n"),
        formatter_class=_F,
    )
    p.set_defaults(handler="cmd_key:cmd_key_public")
    p.add_argument("name", metavar="NAME")

    p = add(
        "env",
        "cmd_env:cmd_env",
        "Print LOCAL_KERNELS=org/a=/path:... for the store's kernels (for code that uses the "
        "`kernels` package directly).",
        "  kerneldctl env\n  export $(kerneldctl env kernels-community/activation:1)\n",
        store_only,
    )
    p.add_argument("kernels", nargs="*", metavar="KERNEL", help="only these (org/name[:N|@REV])")
    p.add_argument("--variant", metavar="NAME", help="use this variant instead of the best one")
    return parser


def _quiet_library_logs() -> None:
    """kerneld's modules log for the daemon's journal; here their outcome is already reported
    by the command, so only errors pass unless $KERNELD_LOG_LEVEL asks for more."""
    import logging

    from kerneld.config.environment import Environment

    level = (Environment.read().log_level or "error").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.ERROR),
        format="kerneldctl: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _resolve(ref: HandlerRef) -> Handler:
    import importlib

    module, _, func = ref.partition(":")
    handler: Handler = getattr(importlib.import_module(f"kerneld.ctl.{module}"), func)
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    ref: HandlerRef | None = getattr(args, "handler", None)
    if ref is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    ctx = stdout_ctx(args)
    _quiet_library_logs()
    try:
        return _resolve(ref)(ctx)
    except CtlError as exc:
        ctx.note(f"kerneldctl: error: {exc.message}")
        if exc.hint:
            ctx.note(f"kerneldctl: hint: {exc.hint}")
        if ctx.json and not ctx.emitted:
            # --json promises a document on stdout, failures included
            ctx.emit_json(
                {"ok": False, "error": exc.message, "hint": exc.hint, "exit_code": exc.code}
            )
        return exc.code
    except KeyboardInterrupt:
        ctx.note("kerneldctl: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
