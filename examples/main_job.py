"""The main job (`make run`): example kernels -> mirror -> verified store -> imported and checked.

What it shows, end to end, with real parts: the example C++ kernels are built for this torch
(cached by source hash), published as a kerneld mirror, resolved for this process's platform into
a fresh content-addressed store (every byte verified), imported from the read-only tree without
writing into it, and checked against PyTorch. A second resolve is a cache hit with no upstream I/O.
The full daemon demo replaces this once the daemon lands (issue 12).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="store directory (default: a temporary one)")
    args = parser.parse_args(argv)

    import torch

    from examples.kernels.build import build_examples
    from examples.mirror import build_example_mirror
    from kerneld.resolve import KernelSpec, Resolver
    from kerneld.store import Store
    from kerneld.upstream.mirror import MirrorDirUpstream
    from kerneld_client.importer import import_variant
    from kerneld_client.platform import platform_facts

    t0 = time.perf_counter()
    built = build_examples()
    how = "cached" if built.cache_hit else f"compiled in {built.cold_build_seconds:.1f} s"
    print(f"1. example kernels built ({how}) for variant {built.arch_variant}")

    mirror = build_example_mirror(built=built)
    print(f"2. mirror with {len(mirror.repos)} kernels at {mirror.root.name}/")

    facts = platform_facts()
    print(f"3. this process: {facts.describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        store_root = args.store or Path(tmp) / "store"
        store = Store.open(store_root)
        try:
            resolver = Resolver(store, [MirrorDirUpstream(mirror.root, name="examples-mirror")])
            spec = KernelSpec("kerneld-examples/activation", version=1)
            t = time.perf_counter()
            cold = resolver.resolve(spec, facts, lease_ttl_s=300)
            cold_s = time.perf_counter() - t
            fetched = cold.fetched
            print(
                f"4. cold resolve {spec}: {cold.variant} @ {cold.commit[:12]} in {_ms(cold_s)} "
                f"({fetched.files_downloaded if fetched else 0} files verified and published)"
            )
            t = time.perf_counter()
            warm = resolver.resolve(spec, facts)
            print(f"5. warm resolve (store hit, no upstream I/O): {_ms(time.perf_counter() - t)}")
            assert warm.hit.path == cold.hit.path

            before = sorted(p.name for p in cold.hit.path.rglob("*"))
            t = time.perf_counter()
            kernel = import_variant(cold.hit.path)
            import_s = time.perf_counter() - t
            x = torch.randn(8, 2 * 64)
            ref = torch.nn.functional.silu(x[:, :64]) * x[:, 64:]
            got = kernel.silu_and_mul_alloc(x)
            err = (got - ref).abs().max().item()
            w = torch.randn(64)
            y = torch.randn(8, 64)
            ref_norm = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * w
            err_norm = (kernel.rms_norm_alloc(y, w, 1e-6) - ref_norm).abs().max().item()
            unchanged = sorted(p.name for p in cold.hit.path.rglob("*")) == before
            print(
                f"6. imported as {kernel.__name__} in {_ms(import_s)}; "
                f"silu_and_mul max|err| {err:.2e}, rms_norm max|err| {err_norm:.2e}; "
                f"tree unchanged by the import: {unchanged}"
            )
            report = store.verify()
            print(f"7. store verify: {'clean' if report.clean else report.exit_code}")
            ok = err < 1e-5 and err_norm < 1e-4 and unchanged and report.clean
        finally:
            store.close()
    print(f"done in {time.perf_counter() - t0:.1f} s: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
