"""atheris target: Resolve / ResolveMany requests (protobuf wire bytes) handled by the real
Kernels servicer over a real store and mirror upstream (`kerneld.server`). Even first byte:
the rest is a ResolveRequest; odd: a ResolveManyRequest."""

from __future__ import annotations

from collections.abc import Mapping

from _harness import Target, run, workdir


def make() -> tuple[Target, Mapping[str, bytes]]:
    from google.protobuf.message import DecodeError

    from kerneld_client.proto import kerneld_pb2 as pb
    from tests.fixtures_daemon import ACT, C1, DEP_TOP, MULTI, build_kernel_mirror
    from tests.fuzz import harnesses

    root = workdir("resolve")
    harness = harnesses.ResolveHarness(root / "harness", build_kernel_mirror(root / "mirror"))

    def target(data: bytes) -> None:
        if not data:
            return
        try:
            if data[0] % 2 == 0:
                harness.check_resolve(pb.ResolveRequest.FromString(data[1:]))
            else:
                harness.check_resolve_many(pb.ResolveManyRequest.FromString(data[1:]))
        except DecodeError:
            return

    cpu = pb.PlatformFacts(torch_version="2.13", cxx11_abi=True, cpu="x86_64", os="linux")
    cuda = pb.PlatformFacts(
        torch_version="2.13",
        cxx11_abi=True,
        cpu="x86_64",
        os="linux",
        backend=pb.Backend(type="cuda", version="12.8"),
    )
    requests = {
        "act": pb.ResolveRequest(
            kernel=pb.KernelRef(repo_id=ACT, version=1), platform=cpu, allow_fetch=True
        ),
        "deps": pb.ResolveRequest(
            kernel=pb.KernelRef(repo_id=DEP_TOP, version=1), platform=cpu, allow_fetch=True
        ),
        "locked": pb.ResolveRequest(
            kernel=pb.KernelRef(repo_id=MULTI, locked_commit=C1), platform=cuda, allow_fetch=True
        ),
        "variant": pb.ResolveRequest(
            kernel=pb.KernelRef(repo_id=MULTI, revision="v1"),
            platform=cpu,
            variant="torch-cpu",
            lease_seconds=60,
        ),
    }
    seeds = {name: b"\0" + r.SerializeToString() for name, r in requests.items()}
    seeds["many"] = (
        b"\1" + pb.ResolveManyRequest(requests=list(requests.values())).SerializeToString()
    )
    return target, seeds


if __name__ == "__main__":
    run(
        "resolve",
        [
            "kerneld.server.fronts.rpc.kernels_service",
            "kerneld.server.fronts.rpc.convert",
            "kerneld.pipeline.resolve",
        ],
        make,
    )
