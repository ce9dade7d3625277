"""The warm path: a fresh process loads kernels from a populated store with no daemon at all.

Each load runs in its own interpreter (as a training process would), against a store the
daemon's own store code filled from the Hub test server; the socket path points at nothing, so
any attempt to use the RPC path would fail or fall back, which the tests detect.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from kerneld.store.locks import is_held
from tests.client.support import (
    ACTIVATION,
    IN_CHILD,
    OPS_CHECK,
    RELU2,
    Populated,
    client_env,
    run_client,
    tree_snapshot,
)

PRELUDE = (
    "import json, os, sys, time, warnings\n"
    + OPS_CHECK
    + "\nimport kerneld_client\nfrom kerneld_client import loaded_kernels\n"
    # which loads the warm fast path (`_warm`) handed to the staged loader
    + "from kerneld_client import loader as _loader\n"
    + "STAGED, _staged = [], _loader.staged_get_kernel\n"
    + "_loader.staged_get_kernel = lambda *a, **k: STAGED.append(a[0]) or _staged(*a, **k)\n"
)


def _index_doc(store: Path, repo: str) -> dict:
    org, name = repo.split("/")
    return json.loads((store / "index" / "v1" / org / f"{name}.json").read_text())


def test_warm_load_in_fresh_process_needs_no_daemon_and_no_grpc(
    shared_store: Populated, built_examples: BuiltExamples, tmp_path: Path
) -> None:
    env = client_env(shared_store.root, tmp_path)
    assert not Path(env["KERNELD_SOCKET"]).exists()
    out = run_client(
        PRELUDE
        + """
mod = kerneld_client.get_kernel("kerneld-examples/activation", version=1, policy="error")
checked = check_activation(mod, 1)
info = loaded_kernels()[0]
# The OFD read lock is held by this process: a write lock on another descriptor fails.
from kerneld_client.file_locks import OFD_WRITE, ofd_lock
fd = os.open(os.path.join(os.environ["KERNELD_STORE"], "locks", info.digest[7:] + ".lock"),
             os.O_RDWR)
try:
    ofd_lock(fd, OFD_WRITE, blocking=False)
    held = False
except BlockingIOError:
    held = True
print(json.dumps({
    "checked": checked, "module": mod.__name__, "variant": info.variant,
    "source": info.source, "commit": info.commit, "path": str(info.path), "held": held,
    "grpc": sorted(m for m in sys.modules if m == "grpc" or m.startswith("grpc.")),
    "protobuf": "google.protobuf" in sys.modules,
    "fallback": "kerneld_client.loading.fallback" in sys.modules,
    "staged": STAGED,
}))
""",
        env,
    )
    assert out["checked"] == ["silu_and_mul", "gelu_tanh_and_mul", "rms_norm"]
    assert out["grpc"] == [] and not out["protobuf"]
    assert not out["fallback"]  # nor the fallback policies' enum (0.15 ms to create)
    assert out["source"] == "index" and out["staged"] == []  # the fast path served it
    assert out["variant"] == built_examples.arch_variant  # the best accepted variant
    assert out["commit"] == shared_store.commits[(ACTIVATION, "v1")]
    meta = json.loads((Path(out["path"]) / "metadata.json").read_text())
    assert out["module"] == meta["id"]
    assert Path(out["path"]).is_relative_to(shared_store.root.resolve())
    assert out["held"] is True
    # ...and released when the process is gone.
    assert not is_held(shared_store.root / "locks" / (Path(out["path"]).name + ".lock"))


def test_loaded_kernel_shows_kernels_dataclass_fields(
    shared_store: Populated, tmp_path: Path
) -> None:
    """`dataclasses.fields(LoadedKernel)` names `kernels`' three fields, in its order, and each
    reads the loaded kernel's value (kernels 0.19.1's test_dataclass_shape, on kerneld's API)."""
    out = run_client(
        PRELUDE
        + """
import dataclasses
mod = kerneld_client.get_kernel("kerneld-examples/activation", version=1, policy="error")
info = loaded_kernels()[0]
print(json.dumps({
    "fields": [f.name for f in dataclasses.fields(type(info))],
    "instance": [f.name for f in dataclasses.fields(info)],
    "is_dataclass": dataclasses.is_dataclass(info),
    "module": info.module is mod,
    "repo": info.repo_info.repo_id,
    "name": info.metadata.name.python_name,
}))
""",
        client_env(shared_store.root, tmp_path),
    )
    assert out["fields"] == out["instance"] == ["metadata", "module", "repo_info"]
    assert out["is_dataclass"] and out["module"]
    assert out["repo"] == "kerneld-examples/activation" and out["name"] == "activation"


def test_versions_revisions_and_commits_in_one_process(
    shared_store: Populated, tmp_path: Path
) -> None:
    """v1 and v2 of one kernel side by side (distinct metadata ids), a branch given as revision,
    a commit, and a second kernel; the same tree twice is the same module."""
    commit_v1 = shared_store.commits[(ACTIVATION, "v1")]
    env = client_env(shared_store.root, tmp_path)
    out = run_client(
        PRELUDE
        + f"""
g = lambda **kw: kerneld_client.get_kernel(policy="error", **kw)
v1 = g(repo_id="{ACTIVATION}", version=1)
v2 = g(repo_id="{ACTIVATION}", revision="v2")
by_commit = g(repo_id="{ACTIVATION}", revision="{commit_v1}")
relu = g(repo_id="{RELU2}", version=1)
print(json.dumps({{
    "v1": v1.__name__, "v2": v2.__name__, "same": by_commit is v1,
    "ops_v1": check_activation(v1, 1), "ops_v2": check_activation(v2, 2),
    "relu": check_relu2(relu),
    "loaded": [(k.repo_id, k.ref, k.source) for k in loaded_kernels()],
    "grpc": "grpc" in sys.modules,
    "staged": STAGED,
}}))
""",
        env,
    )
    assert out["v1"] != out["v2"]
    assert out["same"] is True
    assert out["ops_v2"][-1] == "gelu_and_mul" and "gelu_and_mul" not in out["ops_v1"]
    assert out["relu"] == ["relu2"]
    assert [x[1] for x in out["loaded"]] == ["v1", "v2", "v1"]
    assert {x[2] for x in out["loaded"]} == {"index"}
    assert out["grpc"] is False
    assert out["staged"] == []  # every one a warm hit of the fast path


def test_lock_files_of_both_formats(shared_store: Populated, tmp_path: Path) -> None:
    commit_v2 = c_act = shared_store.commits[(ACTIVATION, "v2")]
    commit_relu = c_relu = shared_store.commits[(RELU2, "v1")]
    new = tmp_path / "new" / "kernels.lock"
    new.parent.mkdir()
    new.write_text(
        json.dumps(
            [
                {"dependency": {"repo-id": ACTIVATION, "version": 2}, "lock": {"commit": c_act}},
                {"dependency": {"repo-id": RELU2, "version": 1}, "lock": {"commit": c_relu}},
            ]
        )
    )
    old = tmp_path / "old" / "kernels.lock"
    old.parent.mkdir()
    old.write_text(json.dumps([{"repo_id": RELU2, "sha": commit_relu, "variants": {}}]))
    env = client_env(shared_store.root, tmp_path)
    out = run_client(
        PRELUDE
        + f"""
a = kerneld_client.load_kernel("{ACTIVATION}", lockfile="{new}", policy="error")
r = kerneld_client.get_locked_kernel("{RELU2}", lockfile="{old}", policy="error")
try:
    kerneld_client.load_kernel("kerneld-examples/absent", lockfile="{new}")
    missing = "loaded?!"
except ValueError as exc:
    missing = str(exc)
print(json.dumps({{
    "a": check_activation(a, 2), "r": check_relu2(r), "missing": missing,
    "loaded": [(k.repo_id, k.commit, k.source) for k in loaded_kernels()],
}}))
""",
        env,
    )
    assert out["a"][-1] == "gelu_and_mul"
    assert out["r"] == ["relu2"]
    assert "not locked" in out["missing"]
    assert out["loaded"] == [[ACTIVATION, commit_v2, "index"], [RELU2, commit_relu, "index"]]


def test_load_kernel_never_downloads(shared_store: Populated, tmp_path: Path) -> None:
    """A locked commit the store does not have: load_kernel does not fetch it (and with no
    daemon and the `hub` policy it still does not go to the Hub: it returns the fallback)."""
    lock = tmp_path / "kernels.lock"
    lock.write_text(
        json.dumps(
            [{"dependency": {"repo-id": ACTIVATION, "version": 9}, "lock": {"commit": "e" * 40}}]
        )
    )
    env = client_env(
        shared_store.root, tmp_path, KERNELD_FALLBACK="hub", HF_ENDPOINT="http://0.0.0.0:9"
    )
    out = run_client(
        PRELUDE
        + f"""
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = kerneld_client.load_kernel("{ACTIVATION}", lockfile="{lock}", fallback="torch-forward")
try:
    kerneld_client.load_kernel("{ACTIVATION}", lockfile="{lock}", policy="error")
except kerneld_client.KernelError as exc:
    err = type(exc).__name__
print(json.dumps({{"got": got, "err": err, "warnings": [str(w.message) for w in caught],
                  "hub": "huggingface_hub" in sys.modules}}))
""",
        env,
    )
    assert out["got"] == "torch-forward"
    assert out["err"] == "DaemonUnavailable"
    assert out["hub"] is False
    assert len(out["warnings"]) == 1 and "using the fallback" in out["warnings"][0]


def test_no_compatible_variant_lists_every_reason(shared_store: Populated, tmp_path: Path) -> None:
    """relu2 has only a torch 2.13 arch build: a torch 2.12 process gets a typed error with every
    variant's reason, decided from the index (no daemon asked, grpc not imported)."""
    facts = json.dumps({"torch_version": "2.12", "cxx11_abi": True, "backend": "cpu"})
    env = client_env(shared_store.root, tmp_path, KERNELD_PLATFORM_JSON=facts)
    out = run_client(
        PRELUDE
        + f"""
from kerneld_client import NoCompatibleVariant
try:
    kerneld_client.get_kernel("{RELU2}", version=1, policy="error")
    result = None
except NoCompatibleVariant as exc:
    result = {{"reasons": [[r.variant, r.accepted, r.reason] for r in exc.reasons],
              "message": str(exc), "fnf": isinstance(exc, FileNotFoundError)}}
decisions = kerneld_client.get_kernel_variants("{ACTIVATION}", version=1)
print(json.dumps({{
    "result": result, "grpc": "grpc" in sys.modules,
    "has_relu": kerneld_client.has_kernel("{RELU2}", version=1),
    "has_act": kerneld_client.has_kernel("{ACTIVATION}", version=1),
    "decisions": [[d.variant, d.accepted, d.reason] for d in decisions],
}}))
""",
        env,
    )
    result = out["result"]
    assert result is not None and result["fnf"] is True
    [(variant, accepted, reason)] = result["reasons"]
    assert variant.startswith("torch213-") and accepted is False
    assert reason == "torch 2.13 != local torch 2.12"
    assert reason in result["message"]
    assert out["grpc"] is False
    assert out["has_relu"] is False and out["has_act"] is True
    # activation: only the noarch builds fit; accepted first, best first, then the rejected.
    assert [d[0] for d in out["decisions"] if d[1]] == ["torch-cpu", "torch-universal"]
    rejected = [d for d in out["decisions"] if not d[1]]
    assert len(rejected) == 1 and "torch 2.13 != local torch 2.12" in rejected[0][2]


def test_import_never_writes_into_the_store(shared_store: Populated, tmp_path: Path) -> None:
    """As root (modes do not stop root) and with bytecode writing allowed: the tree is untouched,
    compiled code goes to the per-user cache outside the store, and a second process uses it."""
    assert os.geteuid() == 0, "this test proves the point only as root"
    commit = shared_store.commits[(ACTIVATION, "v1")]
    doc = _index_doc(shared_store.root, ACTIVATION)
    trees = [shared_store.root / v["tree"] for v in doc["commits"][commit]["variants"].values()]
    before = {t: tree_snapshot(t) for t in trees}
    cache = tmp_path / "bytecode"
    env = client_env(shared_store.root, tmp_path, KERNELD_BYTECODE_CACHE=str(cache))
    env.pop("PYTHONDONTWRITEBYTECODE")
    script = (
        PRELUDE
        + f"""
sys.dont_write_bytecode = False
mods = [kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")]
from kerneld_client.importer import import_variant
for p in {[str(t) for t in trees]!r}:
    if p != str(loaded_kernels()[0].path):
        mods.append(import_variant(p))
print(json.dumps({{"ops": [check_activation(m, 1) for m in mods]}}))
"""
    )
    first = run_client(script, env)
    assert len(first["ops"]) == len(trees) == 3
    cached = sorted(p.name for p in cache.iterdir())
    assert len(cached) >= 3
    second = run_client(script, env)
    assert second["ops"] == first["ops"]
    assert sorted(p.name for p in cache.iterdir()) == cached  # reused, nothing recompiled
    for t in trees:
        assert tree_snapshot(t) == before[t], f"{t} changed"
        assert not list(t.rglob("__pycache__")) and not list(t.rglob("*.pyc"))


@pytest.mark.slow
def test_bytecode_cache_garbage_is_ignored(shared_store: Populated, tmp_path: Path) -> None:
    cache = tmp_path / "bytecode"
    env = client_env(shared_store.root, tmp_path, KERNELD_BYTECODE_CACHE=str(cache))
    script = (
        PRELUDE
        + f"""
m = kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
print(json.dumps({{"ops": check_activation(m, 1)}}))
"""
    )
    run_client(script, env)
    entries = list(cache.iterdir())
    assert entries
    for p in entries:
        p.write_bytes(b"not marshal data")
    assert run_client(script, env)["ops"][0] == "silu_and_mul"
    for p in entries:  # a cache entry writable by others is not trusted
        p.chmod(0o666)
    assert run_client(script, env)["ops"][0] == "silu_and_mul"


def test_kernel_held_across_fork_and_loaded_after_fork(
    shared_store: Populated, tmp_path: Path
) -> None:
    """Loaded before fork: works in the child without RPC. Loaded in a forked child: works.
    Forked before any load: parent and child load independently."""
    env = client_env(shared_store.root, tmp_path)
    out = run_client(
        PRELUDE
        + IN_CHILD
        + f"""
before = in_child(lambda: check_relu2(kerneld_client.get_kernel("{RELU2}", version=1)))
act = kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
after = in_child(lambda: [
    check_activation(kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error"), 1),
    kerneld_client.get_kernel("{ACTIVATION}", version=1) is act,
    check_activation(kerneld_client.get_kernel("{ACTIVATION}", version=2, policy="error"), 2),
    "grpc" in sys.modules,
])
print(json.dumps({{"before": before, "after": after, "parent": check_activation(act, 1),
                  "relu_in_parent": any(k.repo_id == "{RELU2}" for k in loaded_kernels())}}))
""",
        env,
    )
    assert out["before"] == {"ok": ["relu2"]}
    assert out["relu_in_parent"] is False
    ops_v1, same, ops_v2, grpc_loaded = out["after"]["ok"]
    assert ops_v1 == out["parent"] and same is True
    assert ops_v2[-1] == "gelu_and_mul"
    assert grpc_loaded is False


def test_get_local_kernel_and_local_overrides(
    built_examples: BuiltExamples, tmp_path: Path
) -> None:
    """A kernel repo on local disk (no store, no daemon), and LOCAL_KERNELS redirecting get_kernel;
    the import writes nothing into the local folder, nor into the bytecode cache."""
    repo = built_examples.kernel("activation", 2).path
    relu = built_examples.kernel("relu2", 1).path
    before = tree_snapshot(repo)
    cache = tmp_path / "bytecode"
    env = client_env(
        None, tmp_path, LOCAL_KERNELS=f"{RELU2}={relu}", KERNELD_BYTECODE_CACHE=str(cache)
    )
    env.pop("PYTHONDONTWRITEBYTECODE")
    out = run_client(
        PRELUDE
        + f"""
a = kerneld_client.get_local_kernel("{repo}")
r = kerneld_client.get_kernel("{RELU2}", version=1, policy="error")
print(json.dumps({{"a": check_activation(a, 2), "r": check_relu2(r),
                  "src": [(k.variant, k.source) for k in loaded_kernels()]}}))
""",
        env,
    )
    assert out["a"][-1] == "gelu_and_mul" and out["r"] == ["relu2"]
    assert [s for _, s in out["src"]] == ["local", "local"]
    assert out["src"][0][0] == built_examples.arch_variant
    assert tree_snapshot(repo) == before
    # A local folder may be edited: its compiled code is not cached (store trees' is).
    assert not cache.exists()


@pytest.mark.parametrize("max_age", ["0"])
def test_stale_ref_with_daemon_down_serves_the_index(
    shared_store: Populated, tmp_path: Path, max_age: str
) -> None:
    """KERNELD_REF_MAX_AGE makes an old ref a question for the daemon; when it is down, the
    index's answer is still used (serve stale) rather than failing."""
    env = client_env(shared_store.root, tmp_path, KERNELD_REF_MAX_AGE=max_age)
    out = run_client(
        PRELUDE
        + f"""
m = kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
print(json.dumps({{"ops": check_activation(m, 1), "src": loaded_kernels()[0].source}}))
""",
        env,
    )
    assert out["ops"][0] == "silu_and_mul" and out["src"] == "index"


def test_same_id_from_another_folder(
    shared_store: Populated, built_examples: BuiltExamples, tmp_path: Path
) -> None:
    """The same build from another folder (here the example build the store holds) is the
    module already imported; a different build claiming the same metadata id would register
    the same ops twice, so it is refused with a typed error (and a fallback is possible)."""
    local = built_examples.variant("activation", 1).path
    edited = tmp_path / "edited"
    shutil.copytree(local, edited)
    (edited / "__init__.py").write_text((local / "__init__.py").read_text() + "\nEDITED = 1\n")
    # The same build after a standard import wrote its bytecode next to the sources (as the
    # `kernels` package does in a Hub cache snapshot): still the same build.
    compiled = tmp_path / "compiled"
    shutil.copytree(local, compiled)
    (compiled / "__pycache__").mkdir(exist_ok=True)
    (compiled / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"bytecode")
    env = client_env(shared_store.root, tmp_path)
    out = run_client(
        PRELUDE
        + f"""
store = kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
same = kerneld_client.get_local_kernel("{local}") is store
compiled = kerneld_client.get_local_kernel("{compiled}") is store
try:
    kerneld_client.get_local_kernel("{edited}")
    err = None
except kerneld_client.KernelLoadError as exc:
    err = str(exc)
print(json.dumps({{"same": same, "compiled": compiled, "err": err}}))
""",
        env,
    )
    assert out["same"] is True
    assert out["compiled"] is True
    assert out["err"] and "already imported" in out["err"]
