"""Keeping layers on PyTorch on purpose: KERNELD_DISABLE and DISABLE_KERNEL_MAPPING."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneld_client.layers import (
    Cause,
    LayerRepository,
    LayerStatus,
    LocalLayerRepository,
    Mode,
    _repos,
    kernelize,
    kernelize_report,
    use_kernel_mapping,
)
from tests.layers.model import RMSNorm, SiluAndMul, make_model

REPO = "kerneld-examples/activation"


def statuses(model: object) -> dict[str, tuple[LayerStatus, Cause]]:
    report = kernelize_report(model)  # type: ignore[arg-type]
    assert report is not None
    out: dict[str, tuple[LayerStatus, Cause]] = {}
    for e in report:
        got = (e.status, e.cause)
        assert out.setdefault(e.layer_name, got) == got, e
    return out


@pytest.fixture
def counted_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = _repos._load_repository

    def counting(repo: _repos._Repository, backend: str | None) -> _repos.KernelSource:
        calls.append(str(repo))
        return real(repo, backend)

    monkeypatch.setattr(_repos, "_load_repository", counting)
    return calls


def mapping(noarch: Path) -> dict:
    return {
        "RMSNorm": {"cpu": LayerRepository(REPO, layer_name="RMSNorm", version=1)},
        "SiluAndMul": {"cpu": LocalLayerRepository(noarch, layer_name="SiluAndMul")},
    }


@pytest.mark.parametrize(
    ("value", "norm"),
    [
        ("RMSNorm", (LayerStatus.DISABLED, Cause.KERNELD_DISABLE)),
        (" other/thing , RMSNorm ,", (LayerStatus.DISABLED, Cause.KERNELD_DISABLE)),
        (REPO, (LayerStatus.DISABLED, Cause.KERNELD_DISABLE)),
        (f"{REPO}@v1", (LayerStatus.DISABLED, Cause.KERNELD_DISABLE)),
        (f"{REPO}@v2", (LayerStatus.FALLBACK, Cause.DAEMON_UNAVAILABLE)),
        ("kerneld-examples/relu2", (LayerStatus.FALLBACK, Cause.DAEMON_UNAVAILABLE)),
        ("rmsnorm", (LayerStatus.FALLBACK, Cause.DAEMON_UNAVAILABLE)),
    ],
)
def test_kerneld_disable(
    monkeypatch: pytest.MonkeyPatch,
    act_noarch: Path,
    counted_loads: list[str],
    value: str,
    norm: tuple[LayerStatus, Cause],
) -> None:
    monkeypatch.setenv("KERNELD_DISABLE", value)
    model = make_model()
    with use_kernel_mapping(mapping(act_noarch)):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    got = statuses(model)
    assert got["RMSNorm"] == norm
    assert got["SiluAndMul"] == (LayerStatus.KERNELIZED, Cause.NONE)
    asked_daemon = any(REPO in call for call in counted_loads)
    assert asked_daemon is (norm[0] is LayerStatus.FALLBACK)  # a disabled kernel is never loaded
    report = kernelize_report(model)
    assert report is not None
    disabled = [e for e in report if e.status is LayerStatus.DISABLED]
    assert all("KERNELD_DISABLE entry" in e.reason for e in disabled)
    for module in model.modules():
        if isinstance(module, RMSNorm):
            assert "forward" not in module.__dict__


def test_kerneld_disable_by_local_hub_layer_name(
    monkeypatch: pytest.MonkeyPatch, act_noarch: Path
) -> None:
    """A name matches the mapping's layer name or the kernel's layer class name."""
    monkeypatch.setenv("KERNELD_DISABLE", "SiluAndMul")
    model = make_model()
    with use_kernel_mapping(
        {"RMSNorm": {"cpu": LocalLayerRepository(act_noarch, layer_name="RMSNorm")}}
    ):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert statuses(model)["RMSNorm"] == (LayerStatus.KERNELIZED, Cause.NONE)


def test_disable_kernel_mapping_restores_original_forwards(
    monkeypatch: pytest.MonkeyPatch, act_noarch: Path
) -> None:
    model = make_model()
    repos = {
        name: {"cpu": LocalLayerRepository(act_noarch, layer_name=name)}
        for name in ("RMSNorm", "SiluAndMul")
    }
    with use_kernel_mapping(repos):
        kernelize(model, mode=Mode.TRAINING, device="cpu")
        assert set(statuses(model).values()) == {(LayerStatus.KERNELIZED, Cause.NONE)}
        monkeypatch.setenv("DISABLE_KERNEL_MAPPING", "1")
        kernelize(model, mode=Mode.TRAINING, device="cpu")
    assert set(statuses(model).values()) == {(LayerStatus.DISABLED, Cause.DISABLE_KERNEL_MAPPING)}
    for module in model.modules():
        if isinstance(module, RMSNorm | SiluAndMul):
            assert "forward" not in module.__dict__
    monkeypatch.setenv("DISABLE_KERNEL_MAPPING", "0")
    with use_kernel_mapping(repos):
        kernelize(model, mode=Mode.TRAINING, device="cpu")
    assert set(statuses(model).values()) == {(LayerStatus.KERNELIZED, Cause.NONE)}


def test_disabling_never_raises_even_when_fallback_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELD_DISABLE", f"{REPO},SiluAndMul")
    model = make_model()
    with use_kernel_mapping(
        {
            "RMSNorm": {"cpu": LayerRepository(REPO, layer_name="RMSNorm", version=1)},
            "SiluAndMul": {"cpu": LayerRepository(REPO, layer_name="SiluAndMul", version=1)},
        }
    ):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", use_fallback=False)
    assert set(statuses(model).values()) == {(LayerStatus.DISABLED, Cause.KERNELD_DISABLE)}
