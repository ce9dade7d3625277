"""Helpers of the integration tests: the environment of a hooked client process, and running
one. The children run as `python -m tests.integrations.<child> '<json>'` with the project's
interpreter, so the `kerneld_client_hook.pth` installed in its site-packages is what turns the
hook on (KERNELD_HOOK_KERNELS=1), exactly as in `KERNELD_HOOK_KERNELS=1 python train.py`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from examples.kernels.specs import ORG
from tests.client.support import client_env
from tests.support import zygote
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer

ROOT = Path(__file__).resolve().parents[2]
ACTIVATION = f"{ORG}/activation"


def hook_env(tmp: Path, hub: HubServer, daemon: DaemonProcess, **extra: str) -> dict[str, str]:
    """A client process: the hook on, huggingface_hub (and so `kernels`) pointed at the test
    server with a private cache, the daemon's socket (the store is found from its advert)."""
    settings = {
        "KERNELD_SOCKET": str(daemon.user_socket),
        "KERNELD_HOOK_KERNELS": "1",
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp / "hf-home"),
        **extra,
    }
    return client_env(None, tmp, **settings)


def run_child(
    module: str, args: Mapping[str, Any], env: Mapping[str, str], *, timeout: float = 120
) -> dict[str, Any]:
    """Run `python -m tests.integrations.<module> <json>`; its last stdout line is JSON. (A
    child that imports torch first is forked from a torch-loaded zygote: support/zygote.py.)"""
    proc = zygote.run_python(
        ["-m", f"tests.integrations.{module}", json.dumps(dict(args))],
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"{module} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def count_warnings(stderr: str, category: str) -> int:
    """How many warnings of `category` a child printed (the `file:line: Category: msg` lines)."""
    return sum(1 for line in stderr.splitlines() if f": {category}: " in line)


#: Instances of each mapped hub layer kind in the tiny Llama (two decoder layers) when kerneld's
#: decorators mark it (the hook): the rotary function is kernelized per attention layer (each has
#: its own wrapper of it, as in kernels 0.19).
LLAMA_KINDS = {"RMSNorm": 2 * 2 + 1, "SiLU": 2, "rotary_pos_emb": 2}
#: The same when `kernels` 0.17.2's decorators mark it (no hook): one rotary function, shared by
#: every attention layer.
LLAMA_KINDS_KERNELS_0172 = {**LLAMA_KINDS, "rotary_pos_emb": 1}


def kernelized(out: Mapping[str, Any]) -> dict[str, int]:
    """Kind -> kernelized instances, from a `_transformers_child` result."""
    return {kind: layer["kernelized"] for kind, layer in out["layers"].items()}


def layer_files(out: Mapping[str, Any]) -> list[str]:
    """The files the kernelized forwards come from, from a `_transformers_child` result."""
    return sorted(f for layer in out["layers"].values() for f in layer["files"])
