"""Isolation for the layer tests: no daemon, no store, no leftover mapping, cache, platform
facts, environment switches or deterministic-mode flag from another test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from examples.kernels.built import BuiltExamples
from kerneld_client.layers import clear_kernel_cache, register_kernel_mapping
from kerneld_client.platform import set_platform_facts

_ENV = (
    "DISABLE_KERNEL_MAPPING",
    "KERNELD_DISABLE",
    "KERNELD_REQUIRE",
    "KERNELD_FALLBACK",
    "KERNELD_ALLOW_NONDETERMINISTIC",
    "KERNELD_PLATFORM_JSON",
    "LOCAL_KERNELS",
)


@pytest.fixture(autouse=True)
def isolated_layers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    # Nobody listens here and there is no store: the client's hub path must report the daemon
    # as unavailable rather than find a host daemon.
    monkeypatch.setenv("KERNELD_SOCKET", str(tmp_path / "no-daemon" / "kerneld.sock"))
    monkeypatch.setenv("KERNELD_STORE", str(tmp_path / "no-store"))
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    register_kernel_mapping({}, inherit_mapping=False)
    clear_kernel_cache()
    yield
    register_kernel_mapping({}, inherit_mapping=False)
    clear_kernel_cache()
    set_platform_facts(None)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


@pytest.fixture(scope="session")
def act_arch(built_examples: BuiltExamples) -> Path:
    """activation v1, compiled C++ variant folder (has_backward=False)."""
    return built_examples.variant("activation", 1).path


@pytest.fixture(scope="session")
def act_noarch(built_examples: BuiltExamples) -> Path:
    """activation v1, torch-universal variant folder (pure PyTorch, has_backward=True)."""
    return built_examples.variant("activation", 1, "torch-universal").path


@pytest.fixture(scope="session")
def act_repo(act_arch: Path) -> Path:
    """activation v1 as a local repo (`build/<variant>/` for all three variants)."""
    return act_arch.parent.parent
