"""Chaos client processes: `python -m chaos.client CONFIG.json` (started by the harness).

One zygote imports torch and `kerneld_client` once and forks the N client workers (N torch
imports would swamp a 2-core machine and its memory; forked workers share those pages). Each
worker loops until the end time; every operation runs in a fresh forked child, because that is
what a training job is: a new process whose loader has no memo and holds no tree locks yet.

The child loads one kernel with `kerneld_client.get_kernel` (policy `torch`, or `hub` for a
share of the operations), then, if it got a kernel:
- hashes every file of the tree it imported (`checks` compares them to the publisher's files);
- runs the kernel and compares it with PyTorch, and checks its version;
- keeps it for a while (the loader holds an OFD read lock on the tree for the process life, as a
  training job does), then reads and hashes the tree again: if GC deleted or changed it under a
  holder, this is where it shows.
It reports one JSON object through a pipe. The worker gives it `deadline + hold + grace`
seconds, then kills it and records a hang; a child that dies without reporting is a crash.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from chaos.catalog import Catalog, Choice

GRACE_S = 30.0
"""A child is killed (and a hang recorded) this long after its deadline plus its hold time."""

_stop = False


def _on_term(signum: int, frame: object) -> None:
    global _stop
    _stop = True


# ------------------------------------------------------------------------------- in the child


def hash_tree(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder` (what the process really has)."""
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            out[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def torch_fallback(version: int, factor: float) -> SimpleNamespace:
    """What a model keeps using when the kernel cannot be had: plain PyTorch."""
    import torch
    import torch.nn.functional as F

    def half(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = x.shape[-1] // 2
        return x[..., :d], x[..., d:]

    return SimpleNamespace(
        KERNEL_VERSION=version,
        VERSION=version,
        FACTOR=factor,
        silu_and_mul_alloc=lambda x: F.silu(half(x)[0]) * half(x)[1],
        gelu_and_mul_alloc=lambda x: F.gelu(half(x)[0]) * half(x)[1],
        relu2_alloc=lambda x: F.relu(x) ** 2,
        relu2_and_mul_alloc=lambda x: F.relu(half(x)[0]) ** 2 * half(x)[1],
        scale=lambda x: x * factor,
    )


def check_kernel(mod: Any, kind: str, version: int, factor: float) -> str | None:
    """Run the kernel against PyTorch; None if it is right, else what is wrong."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    a, b = x[:, :32], x[:, 32:]
    cases: list[tuple[str, Any, torch.Tensor]] = []
    if kind == "activation":
        if version != mod.KERNEL_VERSION:
            return f"KERNEL_VERSION {mod.KERNEL_VERSION}, expected {version}"
        cases.append(("silu_and_mul", lambda: mod.silu_and_mul_alloc(x), F.silu(a) * b))
        if version >= 2:
            cases.append(("gelu_and_mul", lambda: mod.gelu_and_mul_alloc(x), F.gelu(a) * b))
    elif kind == "relu2":
        if version != mod.KERNEL_VERSION:
            return f"KERNEL_VERSION {mod.KERNEL_VERSION}, expected {version}"
        cases.append(("relu2", lambda: mod.relu2_alloc(x), F.relu(x) ** 2))
        if version >= 2:
            cases.append(("relu2_and_mul", lambda: mod.relu2_and_mul_alloc(x), F.relu(a) ** 2 * b))
    elif kind == "scale":
        if version != mod.VERSION or factor != float(mod.FACTOR):
            return f"VERSION {mod.VERSION} FACTOR {mod.FACTOR}, expected {version} {factor}"
        cases.append(("scale", lambda: mod.scale(x), x * factor))
    for name, run, ref in cases:
        got = run()
        err = float((got - ref).abs().max())
        if not err <= 1e-4:
            return f"{name}: max|err| {err:.3g}"
    return None


def _selector(choice: Choice) -> dict[str, Any]:
    if choice.version is not None:
        return {"version": choice.version}
    return {"revision": choice.revision}


def perform(cat: Catalog, choice: Choice, policy: str, hold_s: float) -> dict[str, Any]:
    """One operation, in a fresh child; returns its record."""
    import kerneld_client
    from kerneld_client import KernelError

    rec: dict[str, Any] = {
        "repo": choice.repo,
        "label": choice.label,
        "kind": choice.kind,
        "commit_wanted": choice.commit,
        "policy": policy,
        "pid": os.getpid(),
        "t_start": time.time(),
    }
    t0 = time.monotonic()
    mod: Any = None
    # Under `torch` the loader is asked with policy `error` and the caller falls back itself:
    # the same as `policy="torch", fallback=obj` (the loader returns `obj` at that point), but the
    # record gets the typed error. Under `hub` the loader's own Hub fallback runs.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            mod = kerneld_client.get_kernel(
                choice.repo, policy="error" if policy == "torch" else "hub", **_selector(choice)
            )
        except KernelError as exc:
            rec["outcome"] = "fallback"
            cause = exc.__context__ if policy == "hub" else None
            rec["error"] = type(exc).__name__
            if isinstance(cause, KernelError):
                rec["error"] = f"{type(cause).__name__}+hub:{type(exc).__name__}"
            rec["message"] = str(exc)[:400]
        except Exception as exc:  # not a typed error: a bug in the loader
            rec["outcome"] = "error"
            rec["error"] = f"unexpected:{type(exc).__name__}"
            rec["message"] = traceback.format_exc()[-1500:]
    rec["latency"] = time.monotonic() - t0
    rec["t_end"] = time.time()
    rec["warnings"] = [str(w.message)[:300] for w in caught][:3]
    if mod is None:
        commit = choice.commit or ""
        version = cat.versions.get(Catalog.key(choice.repo, commit), 0)
        factor = cat.factors.get(Catalog.key(choice.repo, commit), 1.0)
        fb = torch_fallback(version, factor)
        if choice.kind != "absent":
            rec["compute_error"] = check_kernel(fb, choice.kind, version, factor)
        return rec
    loaded = [k for k in kerneld_client.loaded_kernels() if k.repo_id == choice.repo]
    if not loaded:
        rec["outcome"] = "error"
        rec["error"] = "unexpected:not-registered"
        return rec
    lk = loaded[-1]
    rec.update(
        outcome="hub" if lk.source == "hub" else "served",
        source=lk.source,
        commit=lk.commit,
        variant=lk.variant,
        path=str(lk.path),
        digest=lk.digest,
    )
    rec["files"] = hash_tree(lk.path)
    key = Catalog.key(choice.repo, lk.commit)
    version = cat.versions.get(key, -1)
    factor = cat.factors.get(key, 1.0)
    try:
        rec["compute_error"] = check_kernel(mod, choice.kind, version, factor)
    except Exception as exc:
        rec["compute_error"] = f"raised {exc!r}"
    time.sleep(hold_s)  # in use: the loader holds its OFD read lock on the tree meanwhile
    rec["held_s"] = hold_s
    try:
        rec["files_after"] = hash_tree(lk.path) if lk.path.is_dir() else None
    except OSError as exc:
        rec["files_after"] = None
        rec["after_error"] = repr(exc)
    return rec


# ------------------------------------------------------------------------------- the worker


def run_op(
    cat: Catalog, choice: Choice, policy: str, hold_s: float, limit_s: float
) -> dict[str, Any]:
    """Fork a child for one operation; collect its record, or record a hang or a crash."""
    r, w = os.pipe()
    t_start = time.time()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        code = 0
        try:
            rec = perform(cat, choice, policy, hold_s)
        except BaseException:
            rec = {
                "outcome": "error",
                "error": "unexpected:harness",
                "message": traceback.format_exc()[-1500:],
            }
            code = 1
        data = json.dumps(rec).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(w, view) :]
        os._exit(code)
    os.close(w)
    buf = bytearray()
    deadline = time.monotonic() + limit_s
    base = {
        "repo": choice.repo,
        "label": choice.label,
        "kind": choice.kind,
        "commit_wanted": choice.commit,
        "policy": policy,
        "pid": pid,
        "t_start": t_start,
    }
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {
                    **base,
                    "outcome": "hang",
                    "error": "hang",
                    "latency": limit_s,
                    "t_end": time.time(),
                }
            ready, _, _ = select.select([r], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                buf += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(r)
    if not buf:
        return {
            **base,
            "outcome": "crash",
            "error": f"crash:status={status}",
            "latency": time.time() - t_start,
            "t_end": time.time(),
        }
    got: dict[str, Any] = json.loads(buf)
    return got


def worker(index: int, cfg: dict[str, Any], cat: Catalog) -> None:
    """Run operations until the end time; one JSON line per operation in this worker's file."""
    rng = random.Random(int(cfg["seed"]) * 1000 + index)
    weights = [c.weight for c in cat.choices]
    out_path = Path(cfg["out_dir"]) / f"client-{index:03d}.jsonl"
    end = float(cfg["end_time"])
    hold_lo, hold_hi = cfg["hold_s"]
    think_lo, think_hi = cfg["think_s"]
    limit = float(cfg["deadline_s"]) + GRACE_S
    # Start spread out, as ranks of real jobs do not start in the same millisecond.
    time.sleep(rng.uniform(0, think_hi))
    with open(out_path, "a", encoding="utf-8") as out:
        n = 0
        while time.time() < end and not _stop:
            choice = rng.choices(cat.choices, weights)[0]
            policy = "hub" if rng.random() < float(cfg["hub_share"]) else "torch"
            # Some loads are long jobs: their tree ages into the oldest GC candidate while held.
            if rng.random() < float(cfg["long_hold_share"]):
                hold = rng.uniform(*cfg["long_hold_s"])
            else:
                hold = rng.uniform(hold_lo, hold_hi)
            rec = run_op(cat, choice, policy, hold, limit + hold)
            rec["client"] = index
            rec["op"] = n
            out.write(json.dumps(rec) + "\n")
            out.flush()
            n += 1
            time.sleep(rng.uniform(think_lo, think_hi))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cfg: dict[str, Any] = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    cat = Catalog.load(Path(cfg["catalog"]))
    signal.signal(signal.SIGTERM, _on_term)
    os.nice(int(cfg.get("nice", 0)))
    import torch

    torch.set_num_threads(1)
    import kerneld_client.loader  # noqa: F401  (light; grpc and huggingface_hub load per op)
    from kerneld_client.platform import platform_facts

    platform_facts()  # detected once, inherited by every child
    pids: list[int] = []
    for i in range(int(cfg["clients"])):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                worker(i, cfg, cat)
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    failed = 0
    for pid in pids:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        failed += status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
