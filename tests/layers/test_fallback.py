"""Every way a kernel layer can fail to materialise keeps the PyTorch forward, is reported, and
warns once; `use_fallback=False` and `KERNELD_REQUIRE=1` turn it into an error."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kerneld_client.errors import DaemonUnavailable, KernelLoadError, NoCompatibleVariant
from kerneld_client.layers import (
    Cause,
    Device,
    InvalidKernelLayer,
    LayerRepository,
    LayerStatus,
    LocalLayerRepository,
    Mode,
    kernelize,
    kernelize_report,
    use_kernel_mapping,
)
from kerneld_client.platform import detect_platform_facts, set_platform_facts
from kerneld_client.variants import Backend, BackendType
from tests.layers import synth
from tests.layers.model import RMSNorm, SiluAndMul, make_model, tokens

REPO = "kerneld-examples/activation"


def norm_report(model: torch.nn.Module) -> list:
    report = kernelize_report(model)
    assert report is not None
    return [e for e in report if e.layer_name == "RMSNorm"]


def assert_pytorch_norms(model: torch.nn.Module) -> None:
    for name, module in model.named_modules():
        if isinstance(module, RMSNorm):
            assert "forward" not in module.__dict__, name


def kernelize_norms(model: torch.nn.Module, repo: object, **kwargs: object) -> None:
    with use_kernel_mapping({"RMSNorm": {kwargs.pop("device_key", "cpu"): repo}}):
        kernelize(model, mode=Mode.INFERENCE, device=kwargs.pop("device", "cpu"), **kwargs)


def test_daemon_down(caplog: pytest.LogCaptureFixture) -> None:
    model = make_model()
    expected = model(tokens())
    caplog.set_level(logging.INFO, logger="kerneld_client.layers")
    kernelize_norms(model, LayerRepository(REPO, layer_name="RMSNorm", version=1))
    entries = norm_report(model)
    assert {e.status for e in entries} == {LayerStatus.FALLBACK}
    assert {e.cause for e in entries} == {Cause.DAEMON_UNAVAILABLE}
    assert {(e.repo, e.revision) for e in entries} == {(REPO, "v1")}
    assert_pytorch_norms(model)
    torch.testing.assert_close(model(tokens()), expected)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # 7 instances, one warning
    text = warnings[0].getMessage()
    assert "`RMSNorm`" in text and REPO in text and "7 instances" in text
    assert entries[0].reason in text


def test_daemon_down_raises_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = LayerRepository(REPO, layer_name="RMSNorm", version=1)
    with pytest.raises(DaemonUnavailable):
        kernelize_norms(make_model(), repo, use_fallback=False)
    monkeypatch.setenv("KERNELD_REQUIRE", "1")
    model = make_model()
    with pytest.raises(DaemonUnavailable):
        kernelize_norms(model, repo)
    assert_pytorch_norms(model)


def test_no_variant_for_this_platform(tmp_path: Path) -> None:
    path = synth.write_kernel(tmp_path / "k", variant="torch299-cxx11-cpu-x86_64-linux")
    model = make_model()
    kernelize_norms(model, LocalLayerRepository(path, layer_name="RMSNorm"))
    entries = norm_report(model)
    assert {e.cause for e in entries} == {Cause.NO_COMPATIBLE_VARIANT}
    assert "torch299-cxx11-cpu-x86_64-linux" in entries[0].reason
    assert_pytorch_norms(model)
    with pytest.raises(NoCompatibleVariant):
        kernelize_norms(
            make_model(), LocalLayerRepository(path, layer_name="RMSNorm"), use_fallback=False
        )


def test_device_arch_mismatch_is_caught_before_import(tmp_path: Path) -> None:
    path = synth.write_kernel(
        tmp_path / "k", variant="torch-cuda", backend={"type": "cuda", "archs": ["9.0"]}
    )
    base = detect_platform_facts(probe_devices=False)
    cuda = Backend(BackendType.CUDA, (13, 0))
    repo = LocalLayerRepository(path, layer_name="RMSNorm")

    set_platform_facts(replace(base, backend=cuda, device_capabilities=("8.0",)))
    model = make_model()
    kernelize_norms(model, repo, device="cuda", device_key="cuda")
    entries = norm_report(model)
    assert {e.cause for e in entries} == {Cause.NO_COMPATIBLE_VARIANT}, entries[0]
    assert "CUDA capability 8.0" in entries[0].reason
    assert_pytorch_norms(model)

    set_platform_facts(replace(base, backend=cuda, device_capabilities=("9.0",)))
    model = make_model()
    kernelize_norms(model, repo, device="cuda", device_key="cuda")
    assert {e.status for e in norm_report(model)} == {LayerStatus.KERNELIZED}


@pytest.mark.parametrize(
    ("kwargs", "cause", "needle"),
    [
        ({"raw_metadata": b'{"id": "_broken", '}, Cause.LOAD_ERROR, "metadata.json"),
        ({"raw_metadata": b'{"name": "synth"}'}, Cause.LOAD_ERROR, "'id'"),
        (
            {"init": "import kerneld_no_such_module_xyz\n"},
            Cause.LOAD_ERROR,
            "kerneld_no_such_module_xyz",
        ),
        ({"init": "raise RuntimeError('kernel init exploded')\n"}, Cause.LOAD_ERROR, "exploded"),
        ({"init": "x = 1\n"}, Cause.LOAD_ERROR, "does not define any layers"),
    ],
    ids=["metadata-json", "metadata-no-id", "import-error", "init-raises", "no-layers"],
)
def test_broken_kernels(tmp_path: Path, kwargs: dict, cause: Cause, needle: str) -> None:
    path = synth.write_kernel(tmp_path / "k", **kwargs)
    model = make_model()
    expected = model(tokens())
    kernelize_norms(model, LocalLayerRepository(path, layer_name="RMSNorm"))
    entries = norm_report(model)
    assert {e.status for e in entries} == {LayerStatus.FALLBACK}
    assert {e.cause for e in entries} == {cause}
    assert needle in entries[0].reason, entries[0].reason
    assert_pytorch_norms(model)
    torch.testing.assert_close(model(tokens()), expected)
    with pytest.raises(KernelLoadError):
        kernelize_norms(
            make_model(), LocalLayerRepository(path, layer_name="RMSNorm"), use_fallback=False
        )


def test_missing_layer_in_kernel(act_arch: Path) -> None:
    model = make_model()
    kernelize_norms(model, LocalLayerRepository(act_arch, layer_name="LayerNorm"))
    entries = norm_report(model)
    assert {e.cause for e in entries} == {Cause.LOAD_ERROR}
    assert "`LayerNorm` not found" in entries[0].reason and "RMSNorm" in entries[0].reason


BAD_LAYERS = {
    "extra-parameter": (
        Cause.SIGNATURE_MISMATCH,
        "forward takes 3 parameters",
        "def forward(self, hidden_states, residual):\n    return hidden_states\n",
    ),
    "varargs": (
        Cause.SIGNATURE_MISMATCH,
        "variadic positional",
        "def forward(self, *hidden_states):\n    return hidden_states[0]\n",
    ),
    "own-init": (
        Cause.INVALID_LAYER,
        "must not override nn.Module.__init__",
        "def __init__(self):\n    super().__init__()\n",
    ),
    "extra-member": (
        Cause.INVALID_LAYER,
        "adds members (scale)",
        "scale = 2.0\n",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LAYERS))
def test_invalid_hub_layers(tmp_path: Path, case: str) -> None:
    cause, needle, body = BAD_LAYERS[case]
    if "def forward" in body:
        source = synth.layers_source(rms_forward=body)
    else:
        source = synth.layers_source(rms_extra=body)
    path = synth.write_kernel(tmp_path / "k", layers=source)
    model = make_model()
    kernelize_norms(model, LocalLayerRepository(path, layer_name="RMSNorm"))
    entries = norm_report(model)
    assert {e.cause for e in entries} == {cause}, entries[0].reason
    assert needle in entries[0].reason, entries[0].reason
    assert_pytorch_norms(model)
    with pytest.raises(InvalidKernelLayer):
        kernelize_norms(
            make_model(), LocalLayerRepository(path, layer_name="RMSNorm"), use_fallback=False
        )


def test_one_failing_layer_does_not_stop_the_others(tmp_path: Path, act_arch: Path) -> None:
    model = make_model().eval()
    with torch.no_grad():
        expected = model(tokens())
    mapping = {
        "RMSNorm": {"cpu": LayerRepository(REPO, layer_name="RMSNorm", version=1)},
        "SiluAndMul": {"cpu": LocalLayerRepository(act_arch, layer_name="SiluAndMul")},
    }
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device=Device("cpu"))
    report = kernelize_report(model)
    assert report is not None
    summary = report.by_layer_name()
    assert summary["RMSNorm"].statuses == {"fallback": 7}
    assert summary["SiluAndMul"].statuses == {"kernelized": 3}
    assert summary["SiluAndMul"].repos == (str(act_arch),)
    assert report.not_kernelized == [e.name for e in report if e.layer_name == "RMSNorm"]
    for module in model.modules():
        if isinstance(module, SiluAndMul):
            assert "forward" in module.__dict__
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), expected, rtol=1e-5, atol=1e-5)
    as_dict = report.to_dict()
    assert as_dict["layers"][0]["status"] in ("fallback", "kernelized")
    assert "daemon-unavailable" in report.format()


def test_lock_file_problems(tmp_path: Path) -> None:
    from kerneld_client.layers import LockedLayerRepository
    from kerneld_client.lockfile import LockfileError

    other = tmp_path / "kernels.lock"
    other.write_text(
        '[{"dependency": {"repo-id": "org/other", "version": 1}, "lock": {"commit": "'
        + "a" * 40
        + '"}}]'
    )
    cases = {
        "missing": LockedLayerRepository(
            REPO, lockfile=tmp_path / "nope.lock", layer_name="RMSNorm"
        ),
        "not-locked": LockedLayerRepository(REPO, lockfile=other, layer_name="RMSNorm"),
        # This test package is not an installed distribution: no kernels.lock in its metadata.
        "caller": LockedLayerRepository(REPO, layer_name="RMSNorm"),
    }
    needles = {"missing": "cannot read", "not-locked": "is not locked", "caller": "tests.layers"}
    for case, repo in cases.items():
        model = make_model()
        kernelize_norms(model, repo)
        entries = norm_report(model)
        assert {(e.status, e.cause) for e in entries} == {(LayerStatus.FALLBACK, Cause.LOCKFILE)}, (
            case
        )
        assert needles[case] in entries[0].reason, (case, entries[0].reason)
        assert_pytorch_norms(model)
        with pytest.raises(LockfileError):
            kernelize_norms(make_model(), repo, use_fallback=False)
