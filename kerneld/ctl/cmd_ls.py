"""ls and info: what the store holds, kernel by kernel (revisions, refs, variants, trees).

Through the daemon's admin socket by default, or read off a store directly with `--store`
(read-only, safe beside a running daemon); `info` adds each variant's metadata.json.
"""

from __future__ import annotations

from typing import Any

from kerneld.ctl.common import EXIT_OK, CtlError, Ctx, human_bytes, offline, open_store
from kerneld.ctl.subcommands import Commands


def _listing(ctx: Ctx, repos: list[str]) -> list[dict[str, Any]]:
    from kerneld.ctl.listing import proto_to_dict, store_listing

    if offline(ctx):
        with open_store(ctx, writable=False) as store:
            return store_listing(store, repos)
    from kerneld.ctl.rpc import Admin
    from kerneld_client.proto import kerneld_pb2

    with Admin(ctx) as admin:
        answer = admin.unary(admin.stub.List, kerneld_pb2.ListRequest(repo_ids=repos))
    return [proto_to_dict(k) for k in answer.kernels]


def _flags(item: dict[str, Any]) -> str:
    bits = []
    if item.get("pinned"):
        bits.append("pinned")
    if item.get("denied"):  # what refuses it: the whole repo, or which rows refuse a commit
        by = item.get("denied_by")
        if by is None:  # a kernel (a revision has the list: empty from an older daemon)
            bits.append("DENIED (whole repo)")
        else:
            bits.append("DENIED by " + " and ".join(by) if by else "DENIED")
    # Refs denied by name: requests naming them are refused, the commit itself is not.
    bits.extend(f"ref {ref} DENIED" for ref in item.get("denied_refs") or [])
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
    from kerneld.ctl.specs import parse_spec

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
    from kerneld.ctl.listing import read_metadata
    from kerneld.ctl.specs import parse_spec

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
                ctx.say(f"      layout:  {meta.get('build_layout')}")
                flag = meta.get("deterministic")
                declared = "undeclared" if flag is None else ("yes" if flag else "no")
                ctx.say(f"      deterministic: {declared}")
                deps = meta.get("kernel_depends") or []
                if deps:
                    ctx.say("      depends: " + ", ".join(str(d.get("repo-id")) for d in deps))
            if _flags(v):
                ctx.say(f"      flags:   {_flags(v)}")
    return EXIT_OK


def register(commands: Commands) -> None:
    p = commands.add(
        "ls",
        cmd_ls,
        "List the kernels in the store: revisions, refs, variants, sizes, pins.",
        "  kerneldctl ls\n  kerneldctl ls kernels-community/activation --json\n",
    )
    p.add_argument("repos", nargs="*", metavar="REPO", help="only these repos (org/name)")

    p = commands.add(
        "info",
        cmd_info,
        "Describe one kernel in the store (its revisions, variants, trees, metadata).",
        "  kerneldctl info kernels-community/activation\n"
        "  kerneldctl info kernels-community/activation@v1 --json\n",
    )
    p.add_argument(
        "kernel", metavar="REPO[@REV]", help="org/name, org/name:VERSION or org/name@REV"
    )
