"""Which repo a layer gets: mode fallback chains, device types, capability intervals, mappings."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from pathlib import Path

import kernels
import pytest
from kernels.layer.repos import _select_repository as kernels_select

from kerneld_client.layers import (
    Cause,
    CUDAProperties,
    Device,
    LayerStatus,
    LocalLayerRepository,
    Mode,
    ROCMProperties,
    kernelize,
    kernelize_report,
    register_kernel_mapping,
    use_kernel_mapping,
)
from kerneld_client.layers._mapping import MappingMiss, select_repository
from kerneld_client.platform import detect_platform_facts, set_platform_facts
from kerneld_client.variants import Backend, BackendType
from tests.layers import synth
from tests.layers.model import make_model, marked_names

KERNELIZE_MODES = [
    Mode.INFERENCE,
    Mode.TRAINING,
    Mode.INFERENCE | Mode.TORCH_COMPILE,
    Mode.TRAINING | Mode.TORCH_COMPILE,
]
MAPPING_MODES = [Mode.FALLBACK, *KERNELIZE_MODES]


def repo(tag: str, layer: str = "RMSNorm") -> LocalLayerRepository:
    return LocalLayerRepository(Path("/nonexistent") / tag, layer_name=layer)


def to_kernels_mode(mode: Mode) -> kernels.Mode:
    out = kernels.Mode._NONE
    for name in ("FALLBACK", "TRAINING", "INFERENCE", "TORCH_COMPILE"):
        if Mode[name] in mode:
            out = out | kernels.Mode[name]
    return out


def inject(backend: Backend, *capabilities: str) -> None:
    base = detect_platform_facts(probe_devices=False)
    set_platform_facts(replace(base, backend=backend, device_capabilities=capabilities))


CUDA = Backend(BackendType.CUDA, (13, 0))
ROCM = Backend(BackendType.ROCM, (6, 4))


@pytest.mark.parametrize("mode", KERNELIZE_MODES, ids=str)
def test_mode_chains_agree_with_kernels_for_every_mapping(mode: Mode) -> None:
    """All 31 non-empty sets of mapping modes: the same entry as `kernels` picks, or none."""
    for size in range(1, len(MAPPING_MODES) + 1):
        for subset in itertools.combinations(MAPPING_MODES, size):
            repos = {m: repo(str(m)) for m in subset}
            theirs = kernels_select(
                {to_kernels_mode(m): r for m, r in repos.items()}, mode=to_kernels_mode(mode)
            )
            with use_kernel_mapping({"RMSNorm": {"cpu": repos}}, inherit_mapping=False):
                try:
                    ours = select_repository("RMSNorm", Device("cpu"), mode)
                except MappingMiss as miss:
                    assert theirs is None, (subset, miss)
                    assert miss.stage == "no-compatible-mode"
                    continue
            assert theirs is not None, subset
            assert ours.repo is theirs[0], subset
            assert ours.repo_mode is repos_key(repos, ours.repo)


def repos_key(repos: dict[Mode, LocalLayerRepository], value: LocalLayerRepository) -> Mode:
    return next(m for m, r in repos.items() if r is value)


def test_capability_intervals_smallest_wins() -> None:
    wide, narrow, other, anyc = repo("wide"), repo("narrow"), repo("other"), repo("any")
    register_kernel_mapping(
        {
            "RMSNorm": {
                Device("cuda", CUDAProperties(75, 90)): wide,
                Device("cuda", CUDAProperties(80, 89)): narrow,
                Device("cuda", CUDAProperties(100, 120)): other,
                "cuda": anyc,
            }
        }
    )
    expected = {"7.5": wide, "8.0": narrow, "8.6": narrow, "9.0": wide, "10.0": other, "12.1": anyc}
    for cap, want in expected.items():
        inject(CUDA, cap)
        got = select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE)
        assert got.repo is want, cap
    inject(CUDA)  # no device capability known: only the unconstrained entry applies
    assert select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE).repo is anyc


def test_capability_without_match_or_without_device() -> None:
    register_kernel_mapping({"RMSNorm": {Device("cuda", CUDAProperties(80, 89)): repo("a")}})
    inject(CUDA, "7.0")
    with pytest.raises(MappingMiss, match="capability 70") as miss:
        select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE)
    assert miss.value.stage == "no-compatible-properties"
    inject(CUDA)
    with pytest.raises(MappingMiss, match="no cuda device capability"):
        select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE)


def test_rocm_capability_from_gfx_target() -> None:
    mi300, mi200 = repo("mi300"), repo("mi200")
    register_kernel_mapping(
        {
            "RMSNorm": {
                Device("rocm", ROCMProperties(94, 95)): mi300,
                Device("rocm", ROCMProperties(90, 90)): mi200,
            }
        }
    )
    inject(ROCM, "gfx942")
    assert select_repository("RMSNorm", Device("rocm"), Mode.TRAINING).repo is mi300
    inject(ROCM, "gfx90a")
    assert select_repository("RMSNorm", Device("rocm"), Mode.TRAINING).repo is mi200


def test_registering_the_same_key_replaces_the_entry() -> None:
    first, second = repo("first"), repo("second")
    register_kernel_mapping({"RMSNorm": {Device("cuda", CUDAProperties(80, 89)): first}})
    register_kernel_mapping({"RMSNorm": {Device("cuda", CUDAProperties(80, 89)): second}})
    register_kernel_mapping({"RMSNorm": {"cpu": {Mode.INFERENCE: first}}})
    register_kernel_mapping({"RMSNorm": {"cpu": {Mode.TRAINING: second}}})
    inject(CUDA, "8.6")
    assert select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE).repo is second
    # The cpu entry's modes were replaced as a whole, as in `kernels`: only TRAINING is left,
    # and INFERENCE falls back along its chain to it.
    got = select_repository("RMSNorm", Device("cpu"), Mode.INFERENCE)
    assert (got.repo, got.repo_mode) == (second, Mode.TRAINING)
    with pytest.raises(MappingMiss):
        select_repository("RMSNorm", Device("cpu"), Mode.TRAINING | Mode.TORCH_COMPILE)


def test_kernelize_on_cuda_picks_the_repo_for_the_injected_capability(tmp_path: Path) -> None:
    """The selection runs end to end (load, validate, bind) on CPU tensors: the chosen repo is
    what differs, so each interval gets its own real kernel."""
    paths = {tag: synth.write_kernel(tmp_path / tag) for tag in ("ampere", "hopper", "generic")}
    mapping = {
        layer: {
            Device("cuda", CUDAProperties(80, 89)): LocalLayerRepository(
                paths["ampere"], layer_name=layer
            ),
            Device("cuda", CUDAProperties(90, 99)): LocalLayerRepository(
                paths["hopper"], layer_name=layer
            ),
            "cuda": LocalLayerRepository(paths["generic"], layer_name=layer),
        }
        for layer in ("RMSNorm", "SiluAndMul")
    }
    for cap, tag in (("8.6", "ampere"), ("9.0", "hopper"), ("12.0", "generic"), ("7.5", "generic")):
        inject(CUDA, cap)
        model = make_model()
        with use_kernel_mapping(mapping):
            kernelize(model, mode=Mode.INFERENCE, device="cuda")
        report = kernelize_report(model)
        assert report is not None and report.device == "cuda"
        assert {e.status for e in report} == {LayerStatus.KERNELIZED}, report.format()
        assert {e.repo for e in report} == {str(paths[tag])}, cap
        assert {e.variant for e in report} == {"torch-universal"}


def test_mapping_misses_keep_pytorch_and_say_why() -> None:
    register_kernel_mapping(
        {
            "SiluAndMul": {"cuda": repo("gpu-only", "SiluAndMul")},
            "RMSNorm": {"cpu": {Mode.TRAINING: repo("training-only")}},
        }
    )
    model = make_model()
    # The INFERENCE | TORCH_COMPILE chain never reaches a plain TRAINING entry.
    kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    assert {e.status for e in report} == {LayerStatus.UNMAPPED}
    by_name = report.by_layer_name()
    assert by_name["SiluAndMul"].statuses == {"unmapped": 3}
    causes = {e.layer_name: e.cause for e in report}
    assert causes == {"SiluAndMul": Cause.NO_DEVICE, "RMSNorm": Cause.NO_COMPATIBLE_MODE}
    assert all("forward" not in m.__dict__ for m in model.modules())

    register_kernel_mapping({}, inherit_mapping=False)
    kernelize(model, mode=Mode.INFERENCE, device="cpu")
    report = kernelize_report(model)
    assert report is not None and {e.cause for e in report} == {Cause.NO_MAPPING}


def test_mapping_misses_raise_without_fallback_but_not_under_require(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = make_model()
    with pytest.raises(ValueError, match="No layer mapping for `RMSNorm`"):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", use_fallback=False)
    monkeypatch.setenv("KERNELD_REQUIRE", "1")
    kernelize(model, mode=Mode.INFERENCE, device="cpu")  # nothing was asked for: no error
    report = kernelize_report(model)
    assert report is not None and len(report) == len(marked_names(model))


def test_use_kernel_mapping_is_scoped() -> None:
    outer, inner = repo("outer"), repo("inner")
    register_kernel_mapping({"RMSNorm": {"cpu": outer}})
    with use_kernel_mapping({"RMSNorm": {"cuda": inner}}):
        assert select_repository("RMSNorm", Device("cpu"), Mode.INFERENCE).repo is outer
        assert select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE).repo is inner
        register_kernel_mapping({"SiluAndMul": {"cpu": repo("x", "SiluAndMul")}})
        seen_in_thread: list[str] = []

        def other_thread() -> None:
            try:
                select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE)
            except MappingMiss as miss:
                seen_in_thread.append(miss.stage)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert seen_in_thread == ["no-device"]  # the context is this thread's
        with use_kernel_mapping({"RMSNorm": {"cpu": inner}}, inherit_mapping=False):
            assert select_repository("RMSNorm", Device("cpu"), Mode.INFERENCE).repo is inner
            with pytest.raises(MappingMiss):
                select_repository("SiluAndMul", Device("cpu"), Mode.INFERENCE)
    with pytest.raises(MappingMiss):
        select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE)
    with pytest.raises(MappingMiss):  # registered inside the context: gone with it
        select_repository("SiluAndMul", Device("cpu"), Mode.INFERENCE)
    assert select_repository("RMSNorm", Device("cpu"), Mode.INFERENCE).repo is outer


def test_bad_mappings_and_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="Unsupported device type"):
        Device("gpu")
    with pytest.raises(ValueError, match="only supported for 'cuda'"):
        Device("rocm", CUDAProperties(80, 90))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be <="):
        CUDAProperties(90, 80)
    with pytest.raises(ValueError, match="mutually exclusive"):
        _ = Mode.INFERENCE | Mode.TRAINING
    with pytest.raises(ValueError, match="cannot be combined"):
        _ = Mode.FALLBACK | Mode.TORCH_COMPILE
    with pytest.raises(TypeError, match="not a layer repository"):
        register_kernel_mapping({"RMSNorm": {"cpu": "org/name"}})
    with pytest.raises(ValueError, match="Unsupported device type"):
        register_kernel_mapping({"RMSNorm": {"tpu-v9": repo("a")}})
    model = make_model()
    with pytest.raises(ValueError, match="only be used to register"):
        kernelize(model, mode=Mode.FALLBACK)
    with pytest.raises(ValueError, match="must contain"):
        kernelize(model, mode=Mode.TORCH_COMPILE)


def test_kernels_flags_and_devices_are_accepted() -> None:
    """Mappings and kernelize calls written with `kernels`' Mode and Device objects."""
    r = repo("k")
    register_kernel_mapping(
        {
            "RMSNorm": {
                kernels.Device(type="cuda", properties=kernels.CUDAProperties(80, 89)): {
                    kernels.Mode.INFERENCE | kernels.Mode.TORCH_COMPILE: r
                }
            }
        }
    )
    inject(CUDA, "8.9")
    got = select_repository("RMSNorm", Device("cuda"), Mode.INFERENCE)
    assert (got.repo, got.repo_mode) == (r, Mode.INFERENCE | Mode.TORCH_COMPILE)
    model = make_model()
    kernelize(model, mode=kernels.Mode.TRAINING, device="cpu")
    report = kernelize_report(model)
    assert report is not None and report.mode == "TRAINING"


@pytest.mark.parametrize(
    ("registered", "kernelize_mode", "what"),
    [
        (Mode.TRAINING, Mode.TRAINING, "backward"),
        (Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.INFERENCE | Mode.TORCH_COMPILE, "torch.compile"),
    ],
)
def test_an_entry_registered_for_what_its_layer_cannot_do_falls_back_unless_told_not_to(
    act_arch: Path, registered: Mode, kernelize_mode: Mode, what: str
) -> None:
    """As in `kernels` 0.19.1: the layer keeps PyTorch under the default fallback (the mode
    cannot be served; 0.17.2 raised), and `KernelizeFallback.NONE` raises (the compiled layer
    has neither backward nor torch.compile)."""
    repo = LocalLayerRepository(act_arch, layer_name="RMSNorm")
    mapping = {"RMSNorm": {"cpu": {registered: repo}}}
    model = make_model()
    with use_kernel_mapping(mapping):
        kernelize(model, mode=kernelize_mode, device="cpu")
        report = kernelize_report(model)
        assert report is not None
        norms = [e for e in report if e.layer_name == "RMSNorm"]
        assert norms and {(e.status, e.cause) for e in norms} == {
            (LayerStatus.FALLBACK, Cause.MODE_UNSUPPORTED)
        }
        expected = f"does not support {what}, needed for mode"
        assert expected in norms[0].reason
        with pytest.raises(ValueError, match=expected):
            kernelize(make_model(), mode=kernelize_mode, device="cpu", use_fallback=False)


def test_the_modes_an_entry_was_registered_for_do_not_matter_only_the_mode_asked(
    act_arch: Path,
) -> None:
    """An entry for inference and torch.compile serves a plain inference kernelize with a layer
    that cannot compile (kernels 0.19.1 looks at the mode asked for only)."""
    repo = LocalLayerRepository(act_arch, layer_name="RMSNorm")
    model = make_model()
    with use_kernel_mapping({"RMSNorm": {"cpu": {Mode.INFERENCE | Mode.TORCH_COMPILE: repo}}}):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    report = kernelize_report(model)
    assert report is not None
    assert {e.status for e in report if e.layer_name == "RMSNorm"} == {LayerStatus.KERNELIZED}


def test_torch_compile_mode_needs_a_compilable_layer(act_arch: Path, act_noarch: Path) -> None:
    for path, status in ((act_arch, LayerStatus.FALLBACK), (act_noarch, LayerStatus.KERNELIZED)):
        model = make_model()
        with use_kernel_mapping(
            {"RMSNorm": {"cpu": LocalLayerRepository(path, layer_name="RMSNorm")}}
        ):
            kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu")
        report = kernelize_report(model)
        assert report is not None
        norms = [e for e in report if e.layer_name == "RMSNorm"]
        assert {e.status for e in norms} == {status}, report.format()
        if status is LayerStatus.FALLBACK:
            assert {e.cause for e in norms} == {Cause.MODE_UNSUPPORTED}
            assert "can_torch_compile" in norms[0].reason
