"""atheris target: mirror bundles as tar files, imported into a real store
(`kerneld.mirror.bundle`, `kerneld.mirror.import_`). Inputs of odd length are imported with
signature checks, even ones without (which reaches the manifests and blobs sooner)."""

from __future__ import annotations

import tarfile
from collections.abc import Mapping

from _harness import Target, run, workdir


def make() -> tuple[Target, Mapping[str, bytes]]:
    from tests.fuzz import builders as b
    from tests.fuzz import harnesses

    harness = harnesses.BundleHarness(workdir("bundle"))

    def target(data: bytes) -> None:
        harness.check_tar(data, check_sigs=len(data) % 2 == 1)

    variants = {"torch-universal": b.variant_files({"_ops.py": b"# ops\n"})}
    plain = b.members_of(b.mirror_files(variants))
    signed = b.members_of(b.mirror_files(variants, sign=harness.sign))
    hostile = [
        *plain,
        b.Member("../outside/pwned", data=b"x"),
        b.Member("blobs/link", "symlink", link=str(harness.sandbox.outside / "canary")),
        b.Member("blobs/hard", "hardlink", link="mirror-info"),
        b.Member("blobs/dev", "char"),
    ]
    seeds = {
        "plain": b.build_tar(plain),
        "signed": b.build_tar(signed),
        "gnu": b.build_tar(plain, fmt=tarfile.GNU_FORMAT),
        "gz": b.build_tar(signed, compress=True),
        "hostile": b.build_tar(hostile),
    }
    # Make the two valid seeds land on their intended side of the signature switch.
    for name, want_odd in (("plain", False), ("signed", True)):
        if (len(seeds[name]) % 2 == 1) != want_odd:
            seeds[name] += b"\0"
    return target, seeds


if __name__ == "__main__":
    run("bundle", ["kerneld.mirror.bundle", "kerneld.mirror.import_", "kerneld.store"], make)
