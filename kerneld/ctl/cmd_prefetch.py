"""prefetch: fetch kernels ahead of need, through the daemon or into a stopped store.

Through the daemon (the normal case) the `Admin.Prefetch` stream is rendered as it arrives. With
`--store PATH` the same prefetch logic runs in this process against that store (the daemon must
be stopped) and the configured upstreams (or `--hub-endpoint`): that is how a connected host
without a daemon prepares a store for a mirror export.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kerneld.ctl.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CtlError, Ctx, offline, open_store
from kerneld.ctl.subcommands import Commands

if TYPE_CHECKING:
    from kerneld.ctl.specs import Spec


def parse_torch(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for value in values or []:
        for raw in value.split(","):
            part = raw.strip()
            if not part:
                continue
            if not re.fullmatch(r"\d+\.\d+", part):
                raise CtlError(f"--torch takes MAJOR.MINOR versions, got {part!r}", code=EXIT_USAGE)
            out.append(part)
    return out


def cmd_prefetch(ctx: Ctx) -> int:
    from kerneld.ctl.specs import gather
    from kerneld.ctl.views import PrefetchView

    specs = gather(ctx.args.kernels, ctx.args.lock, ctx.args.pyproject)
    if not specs:
        raise CtlError(
            "nothing to prefetch: name kernels (org/name:1), or give --lock / --pyproject",
            code=EXIT_USAGE,
        )
    variants = list(ctx.args.variants or ["auto"])
    torch = parse_torch(ctx.args.torch)
    with PrefetchView(ctx) as view:
        if offline(ctx):
            _local(ctx, specs, variants, torch, view)
        else:
            _daemon(ctx, specs, variants, torch, view)
    results = view.results()
    failed = view.failed
    if ctx.json:
        ctx.emit_json(
            {
                "ok": failed == 0,
                "kernels": results,
                "kernels_ok": sum(1 for k in results if k["status"] == "ok"),
                "kernels_failed": failed,
            }
        )
    else:
        ctx.say(view.summary_line())
    return EXIT_FAILURE if failed else EXIT_OK


def _daemon(ctx: Ctx, specs: list[Spec], variants: list[str], torch: list[str], view: Any) -> None:
    from kerneld.ctl.rpc import Admin
    from kerneld.ctl.views import progress_from_proto
    from kerneld_client.proto import kerneld_pb2

    request = kerneld_pb2.PrefetchRequest(
        kernels=[s.to_proto() for s in specs], variants=variants, torch_versions=torch
    )
    with Admin(ctx) as admin:
        for event in admin.stream(admin.stub.Prefetch, request):
            view.handle(progress_from_proto(event))


def _local(ctx: Ctx, specs: list[Spec], variants: list[str], torch: list[str], view: Any) -> None:
    from kerneld.config import ConfigError, load_config
    from kerneld.pipeline.acquire import ALLOW_ALL, Acquire
    from kerneld.pipeline.fetch import Fetcher
    from kerneld.pipeline.hardware import detect
    from kerneld.pipeline.prefetch import ClientPlatforms, Prefetcher, parse_torch_versions
    from kerneld.pipeline.resolve import KernelSpec, Resolver

    upstreams: list[Any]
    if ctx.args.hub_endpoint:
        from kerneld.upstream.hub import HubUpstream

        upstreams = [HubUpstream(endpoint=ctx.args.hub_endpoint)]
    else:
        from kerneld.pipeline.upstreams import build_upstreams

        try:
            cfg = load_config(ctx.args.config)
        except ConfigError as exc:
            raise CtlError(str(exc)) from None
        upstreams = list(build_upstreams(cfg))
    if not upstreams:
        raise CtlError("no upstream configured", hint="pass --hub-endpoint URL")

    kernel_specs = [
        KernelSpec(s.repo_id, version=s.version, revision=s.revision, locked_commit=s.locked_commit)
        for s in specs
    ]
    with open_store(ctx, writable=True, create=True) as store:
        fetcher = Fetcher(store, upstreams)
        resolver = Resolver(store, upstreams, fetch=fetcher)
        # The daemon's path, without its policy: a stopped store's admin allows everything.
        acquire = Acquire(store, resolver, fetcher, ALLOW_ALL)
        prefetcher = Prefetcher(
            store, resolver, acquire, hardware=detect, client_platforms=ClientPlatforms(None)
        )
        prefetcher.run(
            kernel_specs,
            variants=variants,
            torch_versions=parse_torch_versions(torch),
            emit=view.handle,
        )


def register(commands: Commands) -> None:
    p = commands.add(
        "prefetch",
        cmd_prefetch,
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
