"""Platform facts of this process: detection rules (with fake torch modules, since there is no
GPU here), the env-var override, caching, and a light import graph."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform as stdlib_platform
import subprocess
import sys
import sysconfig
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

import kerneld_client.platform as kplatform
from kerneld_client.device_names import normalise_machine
from kerneld_client.platform import (
    ENV_VAR,
    detect_platform_facts,
    facts_from_json,
    platform_facts,
    reset_platform_facts,
    set_platform_facts,
)
from kerneld_client.variants import Backend, BackendType, PlatformFacts, decide

ROOT = Path(__file__).resolve().parent.parent
B = BackendType


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv(ENV_VAR, raising=False)
    set_platform_facts(None)
    reset_platform_facts()
    yield
    set_platform_facts(None)
    reset_platform_facts()


def fake_torch(
    *,
    version: str = "2.13.0",
    cuda: str | None = None,
    hip: str | None = None,
    xpu: str | None = None,
    mps: bool = False,
    tpu: bool = False,
    neuron: bool = False,
    privateuse: str = "privateuseone",
    cxx11: bool = True,
    available: bool = True,
    capability: tuple[int, int] = (9, 0),
    gcn: str = "gfx942:sramecc+:xnack-",
) -> types.SimpleNamespace:
    """A torch-shaped object with only what detection reads."""
    backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps))
    if tpu:
        backends.tpu = types.SimpleNamespace()
    torch = types.SimpleNamespace(
        __version__=version,
        version=types.SimpleNamespace(cuda=cuda, hip=hip, xpu=xpu),
        backends=backends,
        compiled_with_cxx11_abi=lambda: cxx11,
        cuda=types.SimpleNamespace(
            is_available=lambda: available,
            current_device=lambda: 0,
            get_device_capability=lambda index=0: capability,
            get_device_properties=lambda index=0: types.SimpleNamespace(gcnArchName=gcn),
        ),
        _C=types.SimpleNamespace(_get_privateuse1_backend_name=lambda: privateuse),
    )
    if neuron:
        torch.neuron = types.SimpleNamespace()
    return torch


@pytest.fixture
def on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stdlib_platform, "system", lambda: "Linux")
    monkeypatch.setattr(stdlib_platform, "machine", lambda: "x86_64")


# ------------------------------------------------------------------------------------------
# This process on this machine
# ------------------------------------------------------------------------------------------


def test_this_process() -> None:
    torch = pytest.importorskip("torch")
    f = platform_facts()
    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    assert f.torch_version == (major, minor)
    assert f.os == stdlib_platform.system().lower()
    assert f.cpu == normalise_machine(stdlib_platform.machine(), f.os)
    assert f.python_version == tuple(sys.version_info[:3])
    assert f.free_threaded == bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    assert f.backend_explicit is False
    if f.os == "linux":
        assert f.cxx11_abi is torch.compiled_with_cxx11_abi()
    if torch.version.cuda is None and torch.version.hip is None:
        assert f.backend == Backend(B.CPU) and f.device_capabilities == ()
    assert platform_facts() is f  # cached


@pytest.mark.skipif(
    stdlib_platform.machine() != "x86_64" or sys.platform != "linux",
    reason="the literal facts are those of the x86_64 Linux CPU-torch build machine",
)
def test_this_machine_literally() -> None:
    torch = pytest.importorskip("torch")
    if not torch.__version__.startswith("2.13.") or torch.version.cuda or torch.version.hip:
        pytest.skip(f"not the CPU torch 2.13 build machine (torch {torch.__version__})")
    f = platform_facts()
    assert (f.torch_version, f.cxx11_abi, f.backend, f.cpu, f.os) == (
        (2, 13),
        True,
        Backend(B.CPU),
        "x86_64",
        "linux",
    )
    order = [
        "torch-stable-abi210-cpu-x86_64-linux",
        "torch213-cpu-x86_64-linux",
        "torch213-cxx11-cpu-x86_64-linux",
        "torch-cpu",
        "torch-universal",
    ]
    assert [d.variant for d in decide(reversed(order), f) if d.accepted] == order


# ------------------------------------------------------------------------------------------
# Detection rules, with fake torch modules
# ------------------------------------------------------------------------------------------

BACKEND_CASES = [
    ("cpu", fake_torch(), Backend(B.CPU), ()),
    ("cuda", fake_torch(cuda="13.0"), Backend(B.CUDA, (13, 0)), ("9.0",)),
    (
        "cuda-3part",
        fake_torch(cuda="12.8.1", capability=(8, 6)),
        Backend(B.CUDA, (12, 8)),
        ("8.6",),
    ),
    ("rocm", fake_torch(hip="6.4.43484-123abc"), Backend(B.ROCM, (6, 4)), ("gfx942",)),
    ("mps", fake_torch(mps=True), Backend(B.METAL), ()),
    ("xpu", fake_torch(xpu="20250301"), Backend(B.XPU, (2025, 3)), ()),
    ("xpu-odd", fake_torch(xpu="?"), Backend(B.XPU), ()),
    ("tpu-first", fake_torch(tpu=True, cuda="12.8"), Backend(B.TPU), ()),
    ("neuron-before-cuda", fake_torch(neuron=True, cuda="12.8"), Backend(B.NEURON), ()),
    ("cuda-before-mps", fake_torch(cuda="12.8", mps=True), Backend(B.CUDA, (12, 8)), ("9.0",)),
    ("npu-no-torch_npu", fake_torch(privateuse="npu"), Backend(B.CANN), ()),
    ("cuda-no-device", fake_torch(cuda="13.0", available=False), Backend(B.CUDA, (13, 0)), ()),
]


@pytest.mark.usefixtures("on_linux")
@pytest.mark.parametrize(
    ("torch", "backend", "caps"),
    [c[1:] for c in BACKEND_CASES],
    ids=[c[0] for c in BACKEND_CASES],
)
def test_backend_detection(torch: Any, backend: Backend, caps: tuple[str, ...]) -> None:
    f = detect_platform_facts(torch_module=torch)
    assert f.backend == backend
    assert f.device_capabilities == caps
    assert f.torch_version == (2, 13) and f.cxx11_abi is True
    assert not f.backend_explicit


@pytest.mark.usefixtures("on_linux")
def test_cann_version_from_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    env = types.ModuleType("torch_npu.utils.collect_env")
    env.get_cann_version = lambda: "8.1.RC1"  # type: ignore[attr-defined]
    for name in ("torch_npu", "torch_npu.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torch_npu.utils.collect_env", env)
    f = detect_platform_facts(torch_module=fake_torch(privateuse="npu"))
    assert f.backend == Backend(B.CANN, (8, 1))
    assert [d.variant for d in decide(["torch-npu", "torch-cann"], f) if d.accepted] == [
        "torch-cann"
    ]


@pytest.mark.usefixtures("on_linux")
def test_probe_devices_off_and_failing_probe() -> None:
    f = detect_platform_facts(torch_module=fake_torch(cuda="13.0"), probe_devices=False)
    assert f.device_capabilities == ()
    broken = fake_torch(cuda="13.0")

    def boom(index: int = 0) -> tuple[int, int]:
        raise RuntimeError("no CUDA driver")

    broken.cuda.get_device_capability = boom
    assert detect_platform_facts(torch_module=broken).device_capabilities == ()


@pytest.mark.usefixtures("on_linux")
def test_no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kplatform, "_cudart_backend", lambda: None)
    f = detect_platform_facts(torch_module=None)
    assert (f.torch_version, f.cxx11_abi, f.backend) == (None, None, Backend(B.CPU))
    monkeypatch.setattr(
        kplatform, "_cudart_backend", lambda: {"type": "cuda", "version": "12.8", "explicit": False}
    )
    f = detect_platform_facts(torch_module=None)
    assert f.backend == Backend(B.CUDA, (12, 8))
    names = ["torch29-cxx11-cu128-x86_64-linux", "torch-cuda", "torch-universal"]
    assert [d.variant for d in decide(names, f) if d.accepted] == ["torch-cuda", "torch-universal"]


def test_cudart_probe_does_not_crash() -> None:
    b = kplatform._cudart_backend()
    assert b is None or b["type"] == "cuda"


def test_broken_torch_is_treated_as_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return object() if name == "torch" else real(name, *a)

    def import_module(name: str, *a: Any) -> Any:
        raise OSError("libtorch_cpu.so: cannot open shared object file")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib, "import_module", import_module)
    assert kplatform._import_torch() is None


@pytest.mark.parametrize(
    ("machine", "os_name", "cpu"),
    [
        ("arm64", "darwin", "aarch64"),
        ("x86_64", "darwin", "x86_64"),
        ("AMD64", "windows", "x86_64"),
        ("ARM64", "windows", "ARM64"),
        ("aarch64", "linux", "aarch64"),
        ("arm64", "linux", "arm64"),
        ("x86_64", "linux", "x86_64"),
    ],
)
def test_cpu_names(machine: str, os_name: str, cpu: str) -> None:
    assert normalise_machine(machine, os_name) == cpu


def test_macos_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stdlib_platform, "system", lambda: "Darwin")
    monkeypatch.setattr(stdlib_platform, "machine", lambda: "arm64")
    monkeypatch.setattr(stdlib_platform, "mac_ver", lambda: ("26.1", ("", "", ""), "arm64"))
    f = detect_platform_facts(torch_module=fake_torch(mps=True))
    assert (f.cpu, f.os, f.macos_version, f.cxx11_abi) == ("aarch64", "darwin", (26, 1), None)
    assert f.backend == Backend(B.METAL)
    names = ["torch213-metal-aarch64-darwin", "torch213-cxx11-metal-aarch64-darwin", "torch-metal"]
    assert [d.variant for d in decide(names, f) if d.accepted] == [names[0], names[2]]


def test_windows_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stdlib_platform, "system", lambda: "Windows")
    monkeypatch.setattr(stdlib_platform, "machine", lambda: "AMD64")
    f = detect_platform_facts(torch_module=fake_torch(cuda="12.6"))
    assert (f.cpu, f.os, f.macos_version, f.cxx11_abi) == ("x86_64", "windows", None, None)
    ok = [d.variant for d in decide(["torch213-cu126-x86_64-windows"], f) if d.accepted]
    assert ok == ["torch213-cu126-x86_64-windows"]


def test_free_threaded_is_the_build_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    # POSIX builds say so in sys.abiflags ("t"); without abiflags (Windows) sysconfig answers.
    monkeypatch.setattr(sys, "abiflags", sys.abiflags + "t")
    assert detect_platform_facts(torch_module=fake_torch()).free_threaded
    monkeypatch.delattr(sys, "abiflags")
    real = sysconfig.get_config_var
    monkeypatch.setattr(
        sysconfig, "get_config_var", lambda k: 1 if k == "Py_GIL_DISABLED" else real(k)
    )
    f = detect_platform_facts(torch_module=fake_torch())
    assert f.free_threaded


def test_tvm_ffi_version_from_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    assert detect_platform_facts(torch_module=fake_torch()).tvm_ffi_version is None
    real_find, real_version = importlib.util.find_spec, importlib.metadata.version

    def find_spec(name: str, *a: Any) -> Any:
        return object() if name == "tvm_ffi" else real_find(name, *a)

    def version(dist: str) -> str:
        return "0.1.3" if dist == "apache-tvm-ffi" else real_version(dist)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "version", version)
    assert detect_platform_facts(torch_module=fake_torch()).tvm_ffi_version == (0, 1)
    assert "tvm_ffi" not in sys.modules


# ------------------------------------------------------------------------------------------
# Override, env var, caching, explicit backend
# ------------------------------------------------------------------------------------------

CUDA_JSON = json.dumps(
    {"torch_version": "2.13", "cxx11_abi": True, "backend": "cu130", "device_capabilities": ["9.0"]}
)


def test_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, CUDA_JSON)
    f = platform_facts()
    assert f.backend == Backend(B.CUDA, (13, 0)) and f.device_capabilities == ("9.0",)
    assert f.os == stdlib_platform.system().lower()  # missing keys: this interpreter's
    assert f.python_version == tuple(sys.version_info[:3])
    assert f.tvm_ffi_version is None
    cpu = platform_facts("cpu")
    assert cpu.backend == Backend(B.CPU) and cpu.backend_explicit and not cpu.device_capabilities
    assert platform_facts("cuda").backend_explicit
    with pytest.raises(ValueError, match="supported backends: cpu, cuda"):
        platform_facts("rocm")
    assert platform_facts() is f


def test_env_var_full_object_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    f = PlatformFacts(
        cpu="aarch64",
        os="darwin",
        torch_version=(2, 12),
        backend=Backend(B.METAL),
        python_version=(3, 13, 2),
        free_threaded=True,
        macos_version=(26, 0, 1),
        tvm_ffi_version=(0, 2),
    )
    monkeypatch.setenv(ENV_VAR, json.dumps(f.to_dict()))
    assert platform_facts() == f


@pytest.mark.parametrize("bad", ["{", "[1, 2]", '{"cpu": 5}', '{"gpu": "h200"}'])
def test_env_var_invalid(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(ENV_VAR, bad)
    with pytest.raises(ValueError, match=ENV_VAR):
        platform_facts()
    with pytest.raises(ValueError, match=ENV_VAR):
        facts_from_json(bad)


def test_set_platform_facts_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, CUDA_JSON)
    pinned = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 9))
    set_platform_facts(pinned)
    assert platform_facts() is pinned
    set_platform_facts(None)
    assert platform_facts().backend.type is B.CUDA


def test_detected_once_even_from_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def slow_detect(**kw: Any) -> dict[str, Any]:
        calls.append(1)
        time.sleep(0.05)
        return PlatformFacts(cpu="x86_64", os="linux").to_dict()

    monkeypatch.setattr(kplatform, "detect_raw", slow_detect)
    results: list[PlatformFacts] = []
    threads = [threading.Thread(target=lambda: results.append(platform_facts())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(r) for r in results}) == 1
    platform_facts(refresh=True)
    assert len(calls) == 2
    reset_platform_facts()
    platform_facts()
    assert len(calls) == 3


# ------------------------------------------------------------------------------------------
# Import graph
# ------------------------------------------------------------------------------------------

HEAVY = ("grpc", "google.protobuf", "huggingface_hub", "torch", "kerneld", "packaging", "kernels")


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_import_graph_is_light() -> None:
    mods = _modules_after("import kerneld_client.variants, kerneld_client.platform")
    assert _heavy(mods) == []
    assert "kerneld_client.wire" not in mods and "kerneld_client.proto" not in mods


def test_env_var_facts_need_no_torch() -> None:
    mods = _modules_after(
        "from kerneld_client.platform import platform_facts\n"
        "from kerneld_client.variants import decide\n"
        "decide(['torch-cuda'], platform_facts('cpu'))",
        env={ENV_VAR: CUDA_JSON},
    )
    assert _heavy(mods) == []


def test_probe_sees_imports() -> None:
    assert "google.protobuf" in _modules_after("import kerneld_client.wire")


@pytest.mark.parametrize(
    "torch",
    [
        fake_torch(),
        fake_torch(version="2.12.1+cu128", cuda="12.8"),
        fake_torch(version="2.9.0a0+git", hip="6.4.43482-0f2d60242", cxx11=False),
        fake_torch(xpu="20250301"),
        fake_torch(mps=True),
        fake_torch(privateuse="npu"),
        fake_torch(tpu=True),
        None,
    ],
    ids=["cpu", "cuda", "rocm", "xpu", "mps", "npu", "tpu", "no-torch"],
)
def test_detection_is_already_in_the_form_the_daemon_fingerprints(torch: Any) -> None:
    """A warm load fingerprints its detection without building `PlatformFacts`; the daemon
    fingerprints the `PlatformFacts` the client sent. Both must be the same string, so the
    detected dict must be exactly `to_dict()` of the facts parsed from it."""
    from kerneld_client.variants import fingerprint

    raw = kplatform.detect_raw(torch_module=torch)
    facts = PlatformFacts.from_dict(raw)
    assert raw == facts.to_dict()
    platform = kplatform.Platform(raw)
    assert platform.key == fingerprint(facts.to_dict()) == kplatform.Platform.of(facts).key
    assert platform.facts == facts


def test_the_warm_path_platform_does_not_import_the_variant_rules() -> None:
    """Detection and the fingerprint need none of the rules' enums and dataclasses (4 ms of
    import); the facts are built when a slower path asks for them."""
    code = (
        "import sys, json\n"
        "from kerneld_client.platform import current_platform\n"
        "p = current_platform()\n"
        "before = sorted(m for m in sys.modules if m.startswith('kerneld_client.variants'))\n"
        "p.facts\n"
        "after = 'kerneld_client.variants.choice' in sys.modules or "
        "'kerneld_client.variants.facts' in sys.modules\n"
        "print(json.dumps({'before': before, 'key': p.key, 'after': after}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] == [
        "kerneld_client.variants",
        "kerneld_client.variants.fingerprints",
        "kerneld_client.variants.versions",
    ]
    assert result["after"] is True
    assert result["key"] == kplatform.Platform.of(detect_platform_facts()).key


def test_an_explicit_backend_is_its_own_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    set_platform_facts(
        PlatformFacts(
            cpu="x86_64", os="linux", torch_version=(2, 13), backend=Backend(B.CUDA, (13, 0))
        )
    )
    gpu = kplatform.current_platform()
    cpu = kplatform.current_platform("cpu")
    assert gpu.backend_type == "cuda" and cpu.backend_type == "cpu"
    assert gpu.key != cpu.key and cpu.facts.backend_explicit
    with pytest.raises(ValueError, match="Invalid backend"):
        kplatform.current_platform("rocm")
