"""Helpers for the client tests: populated stores (the daemon's side, without a daemon) and
fresh client processes whose output is JSON.

A store is filled the way the daemon fills it: `Resolver` over the Hub test server and the real
`Store` (verified ingest, read-only trees, published index), or `publish_synthetic` for
small pure-Python kernels the examples do not cover (CUDA archs, kernel-depends).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.kernels.hub import HubRoot
from examples.kernels.specs import ORG
from kerneld.pipeline.resolve import KernelSpec, Resolver
from kerneld.store import Store, TreeFile
from kerneld.upstream.hub import HubUpstream
from kerneld.upstream.retry import RetryPolicy
from kerneld_client.platform import detect_platform_facts
from kerneld_client.variants import PlatformFacts
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]
ACTIVATION = f"{ORG}/activation"
RELU2 = f"{ORG}/relu2"
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, timeout=5)


def local_facts() -> PlatformFacts:
    """This machine's facts without device probing (what a child process will detect)."""
    return detect_platform_facts(probe_devices=False)


@dataclass(frozen=True)
class Populated:
    root: Path
    commits: Mapping[tuple[str, str], str]  # (repo, ref) -> commit


def populate(
    root: Path,
    hub_url: str,
    hub: HubRoot,
    wanted: Iterable[tuple[str, str]],
    *,
    all_variants: bool = True,
) -> Populated:
    """Fill the store at `root` like the daemon would: resolve each (repo, ref) against the Hub
    test server and fetch every variant (or only the best one), then close the store."""
    facts = local_facts()
    commits: dict[tuple[str, str], str] = {}
    store = Store.open(root, min_age_s=0)
    try:
        resolver = Resolver(store, [HubUpstream(endpoint=hub_url, token=False, policy=FAST)])
        for repo, ref in wanted:
            spec = (
                KernelSpec(repo, version=int(ref[1:]))
                if ref[:1] == "v" and ref[1:].isdigit()
                else KernelSpec(repo, revision=ref)
            )
            res = resolver.resolve(spec, facts)
            commits[(repo, ref)] = res.commit
            if all_variants:
                for name in resolver.variant_names(repo, res.commit):
                    resolver.resolve(spec, facts, variant=name)
    finally:
        store.close()
    del hub
    return Populated(root, commits)


def _b64(algorithm: str, data: bytes) -> str:
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode()


def synthetic_metadata(
    files: Mapping[str, bytes],
    *,
    kid: str,
    name: str,
    backend: Mapping[str, Any],
    version: int = 1,
    depends: list[dict[str, Any]] | None = None,
) -> bytes:
    doc: dict[str, Any] = {
        "id": kid,
        "name": name,
        "version": version,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": dict(backend),
        "digest": {
            "algorithm": "sha256",
            "files": {p: _b64("sha256", b) for p, b in files.items()},
        },
    }
    if depends:
        doc["kernel-depends"] = depends
    return json.dumps(doc).encode()


def publish_synthetic(
    root: Path,
    repo: str,
    commit: str,
    variants: Mapping[str, Mapping[str, bytes]],
    *,
    refs: Mapping[str, str] | None = None,
    upstream_variants: Iterable[str] | None = None,
) -> dict[str, Path]:
    """Publish pure-Python variant folders (each must contain its metadata.json) into the store
    at `root`; set refs and the upstream variant list; return variant -> tree path."""
    paths: dict[str, Path] = {}
    with Store.open(root, min_age_s=0) as store:
        for variant, files in variants.items():
            tree_files = []
            for path, data in files.items():
                info = store.blobs.ingest(
                    data, size=len(data), sha256=hashlib.sha256(data).hexdigest()
                )
                tree_files.append(TreeFile(path, info.sha256, len(data)))
            paths[variant] = store.trees.publish_tree(repo, commit, variant, tree_files).path
        for ref, target in (refs or {}).items():
            store.names.set_ref(repo, ref, target)
        if upstream_variants is not None:
            store.names.set_upstream_variants(repo, commit, upstream_variants)
    return paths


def client_env(store: Path | None, tmp: Path, **extra: str) -> dict[str, str]:
    """Environment of a client process: this store, a socket path nobody listens on, a private
    home (so no user-level daemon or cache leaks in)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KERNELD_", "HF_", "LOCAL_KERNELS", "GRPC_"))
    }
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env.update(
        {
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "KERNELD_SOCKET": str(tmp / "no-daemon" / "kerneld.sock"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    if store is not None:
        env["KERNELD_STORE"] = str(store)
    env.update(extra)
    return env


def run_client(
    code: str,
    env: Mapping[str, str],
    *,
    timeout: float = 120,
    check: bool = True,
    fresh: bool = False,
) -> dict[str, Any]:
    """Run `code` as a new `python -c` process; it must print one JSON object as its last line.
    A script that imports torch first is forked from a process that imported torch already
    (tests/support/zygote.py), unless `fresh`: the suite's jobs import torch first, as training
    scripts do, where what they test does not need a process without it."""
    argv = ["-c", textwrap.dedent(code)]
    if fresh:
        proc = subprocess.run(
            [sys.executable, *argv],
            env=dict(env),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    else:
        proc = zygote.run_python(argv, env=env, cwd=ROOT, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"client exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise AssertionError(f"client printed nothing (rc {proc.returncode}):\n{proc.stderr}")
    out: dict[str, Any] = json.loads(lines[-1])
    out["_stderr"] = proc.stderr
    out["_rc"] = proc.returncode
    return out


def tree_snapshot(folder: Path) -> dict[str, tuple[int, int, float]]:
    """Every path below `folder` with (mode, size, mtime): a write of any kind changes it."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            out[str(p.relative_to(folder))] = (st.st_mode, st.st_size, st.st_mtime)
    st = folder.lstat()
    out["."] = (st.st_mode, st.st_size, st.st_mtime)
    return out


# Op checks shared by the in-process tests and the client scripts: every op against PyTorch.
OPS_CHECK = """
import torch
torch.manual_seed(0)


def check_activation(mod, version):
    x = torch.randn(4, 16)
    d = x.shape[-1] // 2
    a, b = x[:, :d], x[:, d:]
    checked = []
    torch.testing.assert_close(mod.silu_and_mul_alloc(x), torch.nn.functional.silu(a) * b)
    out = torch.empty(4, d)
    assert mod.silu_and_mul(out, x) is out
    torch.testing.assert_close(out, torch.nn.functional.silu(a) * b)
    checked.append("silu_and_mul")
    gelu_tanh = torch.nn.functional.gelu(a, approximate="tanh") * b
    torch.testing.assert_close(mod.gelu_tanh_and_mul_alloc(x), gelu_tanh)
    checked.append("gelu_tanh_and_mul")
    w = torch.randn(16)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(mod.rms_norm_alloc(x, w, 1e-6), ref)
    checked.append("rms_norm")
    if version >= 2:
        torch.testing.assert_close(
            mod.gelu_and_mul_alloc(x), torch.nn.functional.gelu(a) * b
        )
        checked.append("gelu_and_mul")
    else:
        assert not hasattr(mod, "gelu_and_mul"), "v1 must not have gelu_and_mul"
    return checked


def check_relu2(mod):
    x = torch.randn(8, 8)
    torch.testing.assert_close(mod.relu2(torch.empty_like(x), x), torch.relu(x) ** 2)
    return ["relu2"]
"""


# For client scripts that fork: `in_child(fn)` runs `fn` in a forked child and returns what it
# returned as {"ok": value} (JSON-able), or {"error": repr} if it raised.
IN_CHILD = """
def in_child(fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            payload = json.dumps({"ok": fn()})
        except BaseException as exc:
            payload = json.dumps({"error": repr(exc)})
        os.write(w, payload.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)
"""
