"""publish: turn a kernel author's local build into something kerneld serves.

Two destinations, one per flag, both written by this process with the caller's permissions:
`--mirror DIR|FILE.tar` (the mirror layout `mirror export` writes; a daemon serves it through a
`mirror-dir` upstream, `mirror import` takes it into a store) and `--store DIR` (a store whose
daemon is stopped, like every other `--store` change). There is no "through the daemon" form: the
daemon has no RPC that takes kernel files from a caller, and its `MirrorImport` reads the source
path inside its sandbox, as its own user, with signature checks by its trusted keys; publishing
to a mirror and then `kerneldctl mirror import --from DIR` says that explicitly instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from kerneld.ctl.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CtlError, Ctx, open_store
from kerneld.ctl.subcommands import Commands

if TYPE_CHECKING:
    from kerneld.mirror.keys import SigningKey
    from kerneld.publish import PublishError


def _ctl_error(exc: PublishError) -> CtlError:
    return CtlError(exc.message, code=EXIT_USAGE if exc.usage else EXIT_FAILURE, hint=exc.hint)


def _signers(ctx: Ctx) -> list[SigningKey]:
    from kerneld.mirror.keys import KeyFileError, load_signing_key

    key_dir = Path(ctx.args.key_dir) if ctx.args.key_dir else None
    try:
        return [load_signing_key(name, key_dir) for name in ctx.args.sign_key or []]
    except KeyFileError as exc:
        raise CtlError(str(exc)) from None


def cmd_publish(ctx: Ctx) -> int:
    from kerneld.publish import PublishError
    from kerneld.publish.build import check_variant, variant_folders
    from kerneld.publish.checkout import check_clean, resolve_revision
    from kerneld.publish.refs import check_names
    from kerneld.publish.report import summary
    from kerneld.publish.to_mirror import publish_to_mirror
    from kerneld.publish.to_store import publish_to_store

    args = ctx.args
    if bool(args.mirror) == bool(args.store):
        raise CtlError(
            "publish writes to one place: give --mirror DIR or --store DIR",
            code=EXIT_USAGE,
            hint='--mirror DIR: a mirror directory that daemons serve (kind = "mirror-dir") or '
            "that `kerneldctl mirror import --from DIR` takes into a running daemon's store; "
            "--store DIR: a store whose daemon is stopped",
        )
    if args.store and (args.sign_key or args.name):
        raise CtlError(
            "--sign-key and --name are for --mirror (a store holds no signatures)",
            code=EXIT_USAGE,
        )
    refs = list(dict.fromkeys(args.ref or []))
    path = Path(os.path.abspath(args.path))
    dest = Path(os.path.abspath(args.mirror or args.store))
    try:
        check_names(args.repo, refs)
        signers = _signers(ctx)  # a missing or unsafe key fails before any work
        folders = variant_folders(path)
        revision = resolve_revision(path, args.commit)
        # The build's own checks come before the checkout's: an edited file is reported as a
        # digest mismatch (re-run the hash step), not merely as an uncommitted change.
        variants = [check_variant(f, repo_id=args.repo, commit=revision.commit) for f in folders]
        revision = check_clean(revision, allow_dirty=args.allow_dirty, destination=dest)
        for line in revision.dirty[:10]:
            ctx.note(f"kerneldctl: warning: uncommitted change (--allow-dirty): {line}")
        if args.mirror:
            try:
                report = publish_to_mirror(
                    variants,
                    dest,
                    repo_id=args.repo,
                    commit=revision.commit,
                    refs=refs,
                    ancestry=revision.ancestry(),
                    force_refs=args.force_refs,
                    sign_keys=signers,
                    name=args.name or "",
                )
            except OSError as exc:
                raise CtlError(
                    f"cannot write {dest}: {exc.strerror or exc}",
                    hint="choose a mirror directory you may write",
                ) from None
        else:
            with open_store(ctx, writable=True, create=True) as store:
                report = publish_to_store(
                    store,
                    variants,
                    repo_id=args.repo,
                    commit=revision.commit,
                    refs=refs,
                    ancestry=revision.ancestry(),
                    force_refs=args.force_refs,
                )
    except PublishError as exc:
        raise _ctl_error(exc) from None
    doc = report.to_dict()
    doc["dirty"] = revision.dirty
    doc["checkout"] = str(revision.checkout.top) if revision.checkout is not None else None
    if ctx.json:
        ctx.emit_json(doc)
        return EXIT_OK
    for line in summary(report):
        ctx.say(line)
    if args.mirror:
        ctx.say(
            f"serve it: kerneld --upstream-mirror-dir {dest} (or an [[upstream]] of kind "
            f'"mirror-dir"), or import it: kerneldctl mirror import --from {dest}'
        )
    return EXIT_OK


def register(commands: Commands) -> None:
    p = commands.add(
        "publish",
        cmd_publish,
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
        commands.neither,
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
