"""atheris target: variant names, platform facts (KERNELD_PLATFORM_JSON and wire bytes) and
backend.archs checks (`kerneld_client.variants`). The first byte picks which."""

from __future__ import annotations

import json
from collections.abc import Mapping

import atheris
from _harness import Target, run


def make() -> tuple[Target, Mapping[str, bytes]]:
    from kerneld_client.variants import PlatformFacts
    from kerneld_client.wire import facts_to_proto
    from tests.fuzz import invariants as inv

    def target(data: bytes) -> None:
        if not data:
            return
        mode, rest = data[0] % 4, data[1:]
        if mode == 0:
            inv.check_variant_names(rest.decode("utf-8", "surrogateescape").split("\n")[:16])
        elif mode == 1:
            inv.check_platform_json(rest.decode("utf-8", "surrogateescape"), ["torch-universal"])
        elif mode == 2:
            inv.check_facts_proto(rest, ["torch213-cxx11-cpu-x86_64-linux", "torch-cuda"])
        else:
            fdp = atheris.FuzzedDataProvider(rest)
            capability = fdp.ConsumeUnicodeNoSurrogates(12)
            archs = fdp.ConsumeUnicodeNoSurrogates(200).split(",")
            inv.check_arch(archs, capability)

    facts = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)
    seeds = {
        "names": b"\0"
        + b"\n".join(
            n.encode()
            for n in [
                "torch213-cxx11-cu128-x86_64-linux",
                "torch-stable-abi29-cpu-aarch64-darwin",
                "tvm-ffi01-rocm64-x86_64-linux",
                "torch-universal",
                "torch-npu",
            ]
        ),
        "json": b"\1" + json.dumps(facts.to_dict() | {"backend": "cu130"}).encode(),
        "proto": b"\2" + facts_to_proto(facts).SerializeToString(),
        "arch": b"\3" + b"\x039.0" + b"8.0,9.0a,10.0f,7.5+PTX",
    }
    return target, seeds


if __name__ == "__main__":
    run(
        "variants",
        ["kerneld_client.variants", "kerneld_client.platform", "kerneld_client.wire"],
        make,
    )
