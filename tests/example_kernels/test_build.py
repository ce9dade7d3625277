"""What a build produces (variant names, metadata, digests, one module per build) and how the
build cache keys, reuses and rejects it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples.kernels.build import REPRO_RESULT, build_examples, check_reproducible
from examples.kernels.built import BuiltExamples
from examples.kernels.cache import CACHE_ENV, cache_key, load_cached_build
from examples.kernels.digest import variant_digest, verify_variant
from examples.kernels.specs import KERNELS
from examples.kernels.toolchain import local_arch_variant, toolchain_facts
from kerneld_client.platform import platform_facts
from kerneld_client.variants import best_variant
from tests.example_kernels.support import (
    KINDS,
    import_variant,
    pick,
    ref_relu2,
    ref_relu2_and_mul,
    ref_silu_and_mul,
)

KERNEL_SPECS = {spec.name: spec for spec in KERNELS}

# --------------------------------------------------------------------------- layout & metadata


def test_variant_name_matches_local_platform(built_examples: BuiltExamples):
    from kernels.variants import get_variants_local, resolve_variant

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    assert platform.system() == "Linux"  # the project's platform; the name below is Linux's
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    expected = f"torch{major}{minor}-{abi}-cpu-{platform.machine()}-linux"
    assert built_examples.arch_variant == expected == local_arch_variant()
    new = f"torch-{major}.{minor}-{abi}-cpu-cpython-3.9-abi3-{platform.machine()}-linux"
    assert local_arch_variant("new") == new
    facts = platform_facts()
    for kernel in built_examples.kernels:
        names = sorted(p.name for p in (kernel.path / "build").iterdir())
        assert names == sorted(v.variant for v in kernel.variants)
        if KERNEL_SPECS[kernel.name].name_format == "new":
            # kernels 0.17.2 does not know the name (test_kernels_0191_loads_the_new_builds
            # loads it with 0.19.1); kerneld's rules pick it.
            assert best_variant(names, facts) == new
            continue
        chosen, _ = resolve_variant(get_variants_local(kernel.path / "build"))
        assert chosen is not None and chosen.variant_str == expected
        assert best_variant(names, facts) == expected


def test_metadata_is_complete_and_digests_match(built_examples: BuiltExamples):
    from kernels import Metadata
    from kernels._rust import Digest, DigestAlgorithm

    ids = set()
    for v in built_examples.all_variants():
        raw = json.loads(v.metadata_file.read_text())
        required = {"id", "name", "version", "license", "python-depends", "backend", "digest"}
        assert set(raw) >= required
        meta = Metadata.read_from_file(v.metadata_file)
        assert meta.id == v.module_id and meta.id.startswith(f"_{v.kernel.replace('-', '_')}_")
        assert (
            raw.get("build-layout", "files") == v.layout == KERNEL_SPECS[v.kernel].layout(v.version)
        )
        if v.layout == "zip":  # the package is in <id>.zip, the library beside it
            assert f"{v.module_id}.zip" in v.files and "__init__.py" not in v.files
        assert str(meta.name) == v.kernel and meta.version == v.version
        assert meta.license == "Apache-2.0" and meta.python_depends == []
        assert raw["backend"] == {"type": "cpu"} and raw["digest"]["algorithm"] == "sha256"
        files = {p for p in v.files if p != "metadata.json"}
        assert set(raw["digest"]["files"]) == files
        assert (v.library in files) == v.compiled
        if v.compiled:
            assert v.library == f"{v.module_id}.abi3.so"
        actual = Digest.hash_variant(DigestAlgorithm.SHA256, v.path)
        assert meta.digest is not None
        meta.digest.validate(actual)  # raises on any difference
        assert actual.files == variant_digest(v.path)
        assert verify_variant(v.path) == []
        ids.add(v.module_id)
    assert len(ids) == len(list(built_examples.all_variants())), "ids must be unique per build"


def test_digest_catches_a_changed_file(built_examples: BuiltExamples, tmp_path: Path):
    from kernels import Metadata
    from kernels._rust import Digest, DigestAlgorithm, DigestValidationError

    v = built_examples.variant("activation", 1)
    copy = tmp_path / v.variant
    shutil.copytree(v.path, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / v.library).open("ab") as f:  # type: ignore[operator]
        f.write(b"\0")
    (copy / "extra.py").write_text("")
    assert verify_variant(copy) == ["unexpected extra.py", f"hash mismatch {v.library}"]
    meta = Metadata.read_from_file(copy / "metadata.json")
    assert meta.digest is not None
    with pytest.raises(DigestValidationError):
        meta.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, copy))


def test_v1_and_v2_differ_observably(built_examples: BuiltExamples):
    for kind in KINDS:
        v1 = import_variant(pick(built_examples, kind, 1))
        v2 = import_variant(pick(built_examples, kind, 2))
        assert (v1.__version__, v2.__version__) == ("1.0.0", "2.0.0")
        assert not hasattr(v1, "gelu_and_mul") and hasattr(v2, "gelu_and_mul")
        assert not hasattr(v1.ops, "gelu_and_mul") and hasattr(v2.ops, "gelu_and_mul")
        assert v1.__name__ != v2.__name__
    assert built_examples.variant("relu2", 1).ops == ("relu2",)
    assert built_examples.variant("relu2", 2).ops == ("relu2", "relu2_and_mul")


def test_kernels_import_side_by_side(built_examples: BuiltExamples):
    variants = [
        built_examples.variant("activation", 1),
        built_examples.variant("activation", 2),
        built_examples.variant("relu2", 1),
        built_examples.variant("relu2", 2),
        built_examples.variant("activation", 2, "torch-cpu"),
    ]
    modules = [import_variant(v) for v in variants]
    assert len({m.__name__ for m in modules}) == len(variants)
    for v, m in zip(variants, modules, strict=True):
        assert sys.modules[v.module_id] is m and m.__name__ == v.module_id
        assert m.add_op_namespace_prefix("x") == f"{v.module_id}::x"
        for op in v.ops:
            assert hasattr(getattr(torch.ops, v.module_id), op)
        if v.compiled:
            # This build's library. A process loads an op library once, and an earlier test in
            # this worker may have imported the same build from a copy (the test Hub's snapshot
            # under an HF cache): the same name and bytes, another folder.
            loaded = Path(str(sys.modules[f"{v.module_id}.{v.module_id}"].__file__))
            assert loaded.name == v.library
            assert loaded.read_bytes() == (v.path / v.library).read_bytes()
    x = torch.randn(4, 8)
    torch.testing.assert_close(modules[0].silu_and_mul_alloc(x), modules[1].silu_and_mul_alloc(x))
    torch.testing.assert_close(modules[2].relu2_alloc(x), ref_relu2(x))
    # Importing the same build again (as kernels.get_local_kernel would) is harmless.
    spec = importlib.util.spec_from_file_location(variants[4].module_id, variants[4].init_file)
    assert spec is not None and spec.loader is not None
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    torch.testing.assert_close(again.silu_and_mul_alloc(x), ref_silu_and_mul(x))


def test_kernels_get_local_kernel_loads_the_variants(built_examples: BuiltExamples):
    import kernels

    repo = built_examples.kernel("relu2", 2)
    mod = kernels.get_local_kernel(repo.path, backend="cpu")
    assert mod.__name__ == built_examples.variant("relu2", 2).module_id
    x = torch.randn(3, 4)
    torch.testing.assert_close(mod.relu2_and_mul_alloc(x), ref_relu2_and_mul(x))

    noarch = built_examples.variant("activation", 1, "torch-universal")
    mod = kernels.get_local_kernel(noarch.path)  # a variant folder works too
    assert mod.__name__ == noarch.module_id
    torch.testing.assert_close(mod.silu_and_mul_alloc(x), ref_silu_and_mul(x))
    loaded = {k.metadata.id for k in kernels.get_loaded_kernels()}
    assert {noarch.module_id, built_examples.variant("relu2", 2).module_id} <= loaded


# --------------------------------------------------------------------------- cache


def test_second_build_is_a_cache_hit(built_examples: BuiltExamples):
    so = built_examples.variant("activation", 1)
    before = (so.path / so.library).stat()  # type: ignore[operator]
    again = build_examples()
    assert again.cache_hit  # no compile: the library's inode and mtime below are unchanged
    assert again.root == built_examples.root and again.cache_key == built_examples.cache_key
    after = (so.path / so.library).stat()  # type: ignore[operator]
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_cache_dir_override_and_damaged_entry(
    built_examples: BuiltExamples, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cache = tmp_path / "cache"
    shutil.copytree(built_examples.root, cache / built_examples.cache_key)
    monkeypatch.setenv(CACHE_ENV, str(cache))
    hit = build_examples()
    assert hit.cache_hit and hit.root == cache / built_examples.cache_key
    assert hit.variant("relu2", 1).path.is_relative_to(cache)
    # A changed file makes the entry invalid (and build_examples would rebuild it).
    init = hit.variant("relu2", 1).init_file
    init.write_text(init.read_text() + "\n")
    assert load_cached_build(hit.root) is None


def test_cache_key_tracks_toolchain_and_sources():
    facts = toolchain_facts()
    assert facts["torch"] == importlib.metadata.version("torch")
    key = cache_key(facts)
    assert key == cache_key(dict(facts))
    assert key != cache_key({**facts, "torch": "9.9.9"})
    assert key != cache_key({**facts, "compiler_version": "g++ 99"})


@pytest.mark.slow
def test_native_library_is_byte_reproducible(built_examples: BuiltExamples):
    """Rebuilding elsewhere gives the same bytes. Costs one more compile (~10-15 s), so it runs
    when asked (KERNELD_CHECK_REPRO=1) or when `build --check-repro` already stored a result."""
    stored = (built_examples.root / REPRO_RESULT).is_file()
    if not stored and os.environ.get("KERNELD_CHECK_REPRO") != "1":
        pytest.skip("set KERNELD_CHECK_REPRO=1 to rebuild one library and compare its bytes")
    check = check_reproducible(built_examples)
    assert check.reproducible, check


def test_kernels_0191_loads_the_new_builds(
    clean_release_venvs: dict[str, Path], built_examples: BuiltExamples, tmp_path: Path
):
    """An unmodified `kernels` 0.19.1 (its own clean venv; torch appended after its packages)
    picks the new-format name and loads both builds of relu2-next, the zip one included, with
    its own importer: the example builds are what `kernels` 0.19 publishes and loads."""
    import sysconfig

    script = """
import json, sys
sys.path.append(sys.argv[1])  # torch, after the venv's own kernels and huggingface_hub
from pathlib import Path
import kernels, torch
out = {"kernels": kernels.__version__}
for version, root in json.loads(sys.argv[2]).items():
    mod = kernels.get_local_kernel(Path(root))
    x = torch.randn(4, 6)
    ok = torch.equal(mod.relu2(torch.empty_like(x), x), torch.relu(x) ** 2)
    out[version] = {"file": mod.__file__, "ok": ok, "and_mul": hasattr(mod, "relu2_and_mul")}
print(json.dumps(out))
"""
    roots = {str(v): str(built_examples.kernel("relu2-next", v).path / "build") for v in (1, 2)}
    proc = subprocess.run(
        [
            str(clean_release_venvs["0.19.1"]),
            "-I",
            "-c",
            script,
            sysconfig.get_paths()["purelib"],
            json.dumps(roots),
        ],
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["kernels"] == "0.19.1"
    new = local_arch_variant("new")
    v1, v2 = built_examples.variant("relu2-next", 1), built_examples.variant("relu2-next", 2)
    assert v1.variant == v2.variant == new and (v1.layout, v2.layout) == ("files", "zip")
    assert out["1"] == {"file": str(v1.path / "__init__.py"), "ok": True, "and_mul": False}
    assert out["2"] == {
        "file": str(v2.path / f"{v2.module_id}.zip" / "__init__.py"),
        "ok": True,
        "and_mul": True,
    }
