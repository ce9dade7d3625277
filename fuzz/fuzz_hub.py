"""atheris target: Hub tree listings served by a crafted Hub endpoint, read by HubUpstream
(huggingface_hub underneath) and fetched into a real store (`kerneld.upstream.hub`,
`kerneld.pipeline.fetch`). Input: the recursive listing of build/<variant>, optionally followed by
`\\0` and the listing of build/."""

from __future__ import annotations

from collections.abc import Mapping

from _harness import Target, run, workdir

VARIANT = "torch-universal"


def make() -> tuple[Target, Mapping[str, bytes]]:
    from tests.fuzz import builders as b
    from tests.fuzz import harnesses

    harness = harnesses.HubHarness(workdir("hub"))
    files = b.variant_files({"_ops.py": b"# ops\n", "lib/k.so": b"\x7fELF"})

    def target(data: bytes) -> None:
        listing, sep, variants = data.partition(b"\0")
        harness.check(VARIANT, listing, files, variants_listing=variants if sep else None)

    seeds = {
        "plain": b.tree_listing(files, VARIANT),
        "lfs": b.tree_listing(files, VARIANT, lfs=["lib/k.so"])
        + b"\0"
        + b.variants_listing([VARIANT, "torch-cuda"]),
    }
    return target, seeds


if __name__ == "__main__":
    run("hub", ["kerneld.upstream.hub", "kerneld.pipeline.fetch", "kerneld.store"], make)
