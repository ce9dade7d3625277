"""Stand-ins, built from the example kernels, for the Hub repos Transformers' own kernel mapping
names for the layer kinds of Llama, Qwen2, Mixtral and Qwen3-MoE (the mapping is
`_build_kernel_mapping` in transformers/integrations/hub_kernels.py, 5.22.2 and 5.25.0):

- `RMSNorm` -> `kernels-community/liger-kernels`, layer `LigerRMSNorm`, v3 (5.22), v4 (5.25)
- `SiLU` -> `kernels-community/activation`, layer `Silu`, v1
- `rotary_pos_emb` -> `kernels-community/rotary`, layer `apply_rotary_transformers`, v2

`activation` and `rotary` carry the example kernels' compiled CPU builds (v1, v2);
`liger-kernels` carries the compiled activation v2 build with `LigerRMSNorm` named as an alias of
its `RMSNorm`, as v3 and v4 (v2's op namespace differs from v1's, so both load in one process).
Only the org `kernels-community` is a trusted publisher.
"""

from __future__ import annotations

import json
from pathlib import Path

from examples.kernels.built import BuiltExamples
from tests.support.gitrepo import GitRepo, variant_digest

COMMUNITY = "kernels-community"
LIGER = f"{COMMUNITY}/liger-kernels"
ACTIVATION = f"{COMMUNITY}/activation"
ROTARY = f"{COMMUNITY}/rotary"
STANDINS = (LIGER, ACTIVATION, ROTARY)
#: stand-in -> (example kernel, {stand-in version: example version}, code appended to layers.py)
_SOURCES: dict[str, tuple[str, dict[int, int], str]] = {
    LIGER: (
        "activation",
        {3: 2, 4: 2},
        "\n\n# The name Transformers' mapping gives the layer.\n"
        'LigerRMSNorm = RMSNorm\n__all__ += ["LigerRMSNorm"]\n',
    ),
    ACTIVATION: ("activation", {1: 1, 2: 2}, ""),
    ROTARY: ("rotary", {1: 1, 2: 2}, ""),
}


def _variant_files(
    built: BuiltExamples, kernel: str, example_version: int, version: int, extra: str
) -> dict[str, bytes]:
    """The example's arch variant as this stand-in's `version`: layers declared compile-ready
    (`can_torch_compile = True`, as the community kernels are: Transformers maps only such
    kernels, every entry with Mode.TORCH_COMPILE, and `kernelize` refuses a layer that says
    otherwise), `extra` appended to layers.py, metadata's version and digest to match."""
    variant = built.variant(kernel, example_version)
    files = {rel: (variant.path / rel).read_bytes() for rel in variant.files}
    layers = files["layers.py"].decode()
    assert "can_torch_compile = False" in layers, variant.path
    layers = layers.replace("can_torch_compile = False", "can_torch_compile = True") + extra
    files["layers.py"] = layers.encode()
    metadata = json.loads(files.pop("metadata.json"))
    metadata["version"] = version
    metadata["digest"]["files"] = variant_digest(files)
    files["metadata.json"] = (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode()
    return {f"build/{variant.variant}/{rel}": data for rel, data in files.items()}


def build_transformers_hub(
    root: Path, built: BuiltExamples, *, repos: tuple[str, ...] = STANDINS
) -> Path:
    """Lay out `repos` (some of STANDINS) under `root/kernels/kernels-community/`, each with a
    branch `v<N>` per version and `main` at the last; `root`."""
    for repo_id in repos:
        kernel, versions, extra = _SOURCES[repo_id]
        repo = GitRepo(root / "kernels" / repo_id)
        for version, example_version in versions.items():
            files = _variant_files(built, kernel, example_version, version, extra)
            # each version's tree holds only its own build (no file of the previous one)
            repo.commit(f"{repo_id} stand-in v{version}", {"build": None, **files})
            repo.branch(f"v{version}")
    return root
