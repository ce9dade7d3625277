"""Determinism gating: with deterministic algorithms on, only declared-deterministic kernels."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import kernels
import pytest
import torch

from kerneld_client.layers import (
    Cause,
    LayerStatus,
    LocalLayerRepository,
    Mode,
    NondeterministicKernel,
    kernelize,
    kernelize_report,
    use_kernel_mapping,
)
from tests.layers import synth
from tests.layers.model import RMSNorm, make_model, tokens


def run(path: Path, **kwargs: object) -> dict[str, tuple[LayerStatus, Cause, str]]:
    model = make_model()
    mapping = {
        name: {"cpu": LocalLayerRepository(path, layer_name=name)}
        for name in ("RMSNorm", "SiluAndMul")
    }
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", **kwargs)  # type: ignore[arg-type]
    report = kernelize_report(model)
    assert report is not None
    return {e.layer_name: (e.status, e.cause, e.reason) for e in report}


KERNELIZED = (LayerStatus.KERNELIZED, Cause.NONE)
REFUSED = (LayerStatus.FALLBACK, Cause.NONDETERMINISTIC)


def short(
    result: dict[str, tuple[LayerStatus, Cause, str]],
) -> dict[str, tuple[LayerStatus, Cause]]:
    return {k: v[:2] for k, v in result.items()}


def test_undeclared_kernels_are_refused_only_in_deterministic_mode(act_arch: Path) -> None:
    assert short(run(act_arch)) == {"RMSNorm": KERNELIZED, "SiluAndMul": KERNELIZED}
    torch.use_deterministic_algorithms(True)
    got = run(act_arch)
    assert short(got) == {"RMSNorm": REFUSED, "SiluAndMul": REFUSED}
    reason = got["RMSNorm"][2]
    assert "does not declare itself deterministic" in reason
    assert "KERNELD_ALLOW_NONDETERMINISTIC=1" in reason


def test_user_opt_in(act_arch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.use_deterministic_algorithms(True)
    assert short(run(act_arch, allow_nondeterministic=True))["RMSNorm"] == KERNELIZED
    monkeypatch.setenv("KERNELD_ALLOW_NONDETERMINISTIC", "1")
    assert short(run(act_arch))["RMSNorm"] == KERNELIZED
    assert short(run(act_arch, allow_nondeterministic=False))["RMSNorm"] == REFUSED


@pytest.mark.parametrize(
    ("metadata", "rms_extra", "expected"),
    [
        ({"deterministic": True}, "", {"RMSNorm": KERNELIZED, "SiluAndMul": KERNELIZED}),
        ({"deterministic": False}, "", {"RMSNorm": REFUSED, "SiluAndMul": REFUSED}),
        ({"deterministic": ["RMSNorm"]}, "", {"RMSNorm": KERNELIZED, "SiluAndMul": REFUSED}),
        ({}, "deterministic = True\n", {"RMSNorm": KERNELIZED, "SiluAndMul": REFUSED}),
        (
            {"deterministic": True},
            "deterministic = False\n",
            {"RMSNorm": REFUSED, "SiluAndMul": KERNELIZED},
        ),
        ({"deterministic": "yes"}, "", {"RMSNorm": REFUSED, "SiluAndMul": REFUSED}),
    ],
    ids=[
        "metadata-true",
        "metadata-false",
        "metadata-list",
        "attribute",
        "attribute-wins",
        "not-a-bool",
    ],
)
def test_declarations(tmp_path: Path, metadata: dict, rms_extra: str, expected: dict) -> None:
    path = synth.write_kernel(
        tmp_path / "k", layers=synth.layers_source(rms_extra=rms_extra), extra_metadata=metadata
    )
    torch.use_deterministic_algorithms(True)
    assert short(run(path)) == expected


def test_warn_only_mode_uses_the_kernel_and_says_so(
    act_arch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    got = run(act_arch)
    assert short(got) == {"RMSNorm": KERNELIZED, "SiluAndMul": KERNELIZED}
    assert "warn-only" in got["RMSNorm"][2]
    assert any(
        "warn-only" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )


def test_refusal_raises_without_fallback(act_arch: Path) -> None:
    torch.use_deterministic_algorithms(True)
    with pytest.raises(NondeterministicKernel, match="deterministic"):
        run(act_arch, use_fallback=False)


def test_refused_model_stays_deterministic(act_arch: Path) -> None:
    torch.use_deterministic_algorithms(True)
    model = make_model()
    with use_kernel_mapping(
        {"RMSNorm": {"cpu": LocalLayerRepository(act_arch, layer_name="RMSNorm")}}
    ):
        kernelize(model, mode=Mode.TRAINING, device="cpu")
    for module in model.modules():
        if isinstance(module, RMSNorm):
            assert "forward" not in module.__dict__
    a, b = model(tokens()), model(tokens())
    assert torch.equal(a, b)


def test_kernels_loads_a_kernel_with_the_metadata_key(tmp_path: Path) -> None:
    """The metadata key is compatible with `kernels`: it ignores unknown metadata keys."""
    path = synth.write_kernel(tmp_path / "k", extra_metadata={"deterministic": True})
    doc = json.loads((path / "build" / "torch-universal" / "metadata.json").read_text())
    assert doc["deterministic"] is True
    module = kernels.get_local_kernel(path)
    assert module.layers.RMSNorm.has_backward is True


def test_kernels_refuses_the_class_attribute(tmp_path: Path) -> None:
    """Why the metadata key is the portable form: `kernels` rejects extra layer members."""
    path = synth.write_kernel(
        tmp_path / "k", layers=synth.layers_source(rms_extra="deterministic = True\n")
    )
    model = make_model()
    mapping = {"RMSNorm": {"cpu": kernels.LocalLayerRepository(path, layer_name="RMSNorm")}}
    with kernels.use_kernel_mapping(mapping), pytest.raises(TypeError, match="additional members"):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
