"""The warm fast path (`kerneld_client._warm`, issue 56) gives the staged loader's answers.

Each case changes a store one way and loads the kernel in two fresh processes: through
`kerneld_client.get_kernel` (the fast path first) and through the staged loader alone
(`loader.staged_get_kernel`). The outcomes (variant, commit, source and module, or the error's
type and message) must be the same; the plain warm hits must be served by the fast path itself
(the staged loader never called) and every doubt (a deny, an untrusted publisher or tree, no pick,
a lock file gone, a build that needs more than an import) handed to the staged loader.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneld_client import _config, _loads, _warm, _warm_trust
from tests.client.support import ACTIVATION, Populated, client_env, run_client

SCRIPT = """
import json, os, sys, warnings
import torch
import kerneld_client
from kerneld_client import loader
calls = []
staged = loader.staged_get_kernel
def recording(*args, **kwargs):
    calls.append(args[0])
    return staged(*args, **kwargs)
loader.staged_get_kernel = recording
get = {get}
try:
    mod = get("{repo}", version=1, policy="error")
    info = kerneld_client.loaded_kernels()[0]
    out = {{"loaded": [info.variant, info.commit, info.source, mod.__name__]}}
except kerneld_client.KernelError as exc:
    out = {{"error": type(exc).__name__, "message": str(exc)}}
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    out["fallback"] = get("{repo}", version=1, fallback="torch-forward", policy="torch") == (
        "torch-forward"
    )
out["staged_calls"] = len(calls)
print(json.dumps(out))
"""


def _doc(store: Path) -> tuple[Path, dict[str, Any]]:
    org, name = ACTIVATION.split("/")
    path = store / "index" / "v1" / org / f"{name}.json"
    return path, json.loads(path.read_text())


def _write_doc(path: Path, doc: dict[str, Any]) -> None:
    path.chmod(0o644)
    path.write_text(json.dumps(doc))


def _picked_tree(store: Path, commit: str) -> Path:
    _, doc = _doc(store)
    entry = doc["commits"][commit]
    [pick] = entry["picks"].values()
    return store / entry["variants"][pick]["tree"]


def _edit_metadata(tree: Path, **changes: object) -> None:
    path = tree / "metadata.json"
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.chmod(0o644)
    path.write_text(json.dumps(meta))
    path.chmod(0o444)


def _deny(revision: str) -> Callable[[Path, str], None]:
    def change(store: Path, commit: str) -> None:
        path, doc = _doc(store)
        doc["denies"] = [{"revision": revision, "reason": "a bad build"}]
        _write_doc(path, doc)

    return change


def _publishers(allow: list[str]) -> Callable[[Path, str], None]:
    def change(store: Path, commit: str) -> None:
        doc = {"format": "kerneld-publishers", "version": 1, "policy": "allow", "allow": allow}
        (store / "index" / "v1" / "publishers.json").write_text(json.dumps(doc))

    return change


def _no_pick(store: Path, commit: str) -> None:
    path, doc = _doc(store)
    doc["commits"][commit]["picks"] = {}
    _write_doc(path, doc)


def _writable_file(store: Path, commit: str) -> None:
    (_picked_tree(store, commit) / "metadata.json").chmod(0o664)


def _writable_index(store: Path, commit: str) -> None:
    _doc(store)[0].chmod(0o666)


def _lock_gone(store: Path, commit: str) -> None:
    _, doc = _doc(store)
    [pick] = doc["commits"][commit]["picks"].values()
    (store / doc["commits"][commit]["variants"][pick]["lock"]).unlink()


def _python_depends(store: Path, commit: str) -> None:
    _edit_metadata(_picked_tree(store, commit), **{"python-depends": ["no-such-dist-kerneld"]})


def _bad_id(store: Path, commit: str) -> None:
    _edit_metadata(_picked_tree(store, commit), id="not an identifier")


def _import_fails(store: Path, commit: str) -> None:
    init = _picked_tree(store, commit) / "__init__.py"
    init.chmod(0o644)
    counted = 'open(__import__("os").environ["KERNELD_TEST_RUNS"], "a").write("x")\n'
    init.write_text(counted + 'raise RuntimeError("broken build")\n' + init.read_text())
    init.chmod(0o444)


CASES: dict[str, tuple[Callable[[Path, str], None] | None, bool]] = {
    # name: (the change, whether the fast path serves the load itself)
    "as published": (None, True),
    "trusted by an allow pattern": (_publishers(["kerneld-examples/*"]), True),
    "denied, every revision": (_deny("*"), False),
    "a deny of another revision": (_deny("v9"), False),
    "publisher not trusted": (_publishers(["someone-else/*"]), False),
    "no pick for this platform": (_no_pick, False),
    "a file writable by others": (_writable_file, False),
    "the index writable by others": (_writable_index, False),
    "the tree's lock file gone": (_lock_gone, False),
    "python-depends not installed": (_python_depends, False),
    "metadata id not an identifier": (_bad_id, False),
    "the kernel's own import fails": (_import_fails, True),
}


@pytest.mark.filterwarnings("ignore::kerneld_client.KernelFallbackWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_the_fast_path_and_the_staged_loader_agree(
    fresh_store: Populated, tmp_path: Path, case: str
) -> None:
    commit = fresh_store.commits[(ACTIVATION, "v1")]
    change, served = CASES[case]
    if change is not None:
        change(fresh_store.root, commit)
    outcomes = {}
    for mode, get in (("fast", "kerneld_client.get_kernel"), ("staged", "staged")):
        runs = tmp_path / f"runs-{mode}"
        env = client_env(fresh_store.root, tmp_path, KERNELD_TEST_RUNS=str(runs))
        outcomes[mode] = run_client(SCRIPT.format(get=get, repo=ACTIVATION), env)
        if change is _import_fails:  # the kernel's code ran once per call, never twice
            assert runs.read_text() == "xx", mode
    fast, staged = outcomes["fast"], outcomes["staged"]
    keys = ("loaded", "error", "fallback")
    if fast.get("error") == "DaemonUnavailable":  # its message names the backoff's state
        keys = ("error", "fallback")
    assert {k: fast.get(k) for k in keys} == {k: staged.get(k) for k in keys}
    assert fast["fallback"] is ("error" in fast)
    if served:
        assert fast["staged_calls"] == 0, fast
    else:
        assert fast["staged_calls"] >= 1, fast
    if "loaded" in fast:
        assert fast["loaded"][2] == "index"


def test_the_fast_path_reads_the_clients_variables_by_their_names() -> None:
    """The fast path reads the environment itself (`_loads.setting`; importing `_config` costs a
    warm load 0.2 ms): every name it reads is one of `_config`'s, or the home and XDG paths
    `locations` reads."""
    source = "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (_warm, _warm_trust))
    names = set(
        re.findall(r'setting\("([A-Z_0-9]+)"\)', source + Path(_loads.__file__).read_text())
    )
    known = {getattr(_config, n) for n in dir(_config) if n.startswith("ENV_")}
    known |= {"HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "KERNELD_BYTECODE_CACHE"}
    assert "KERNELD_STORE" in names and "KERNELD_PLATFORM_JSON" in names
    assert names <= known, names - known


@settings(max_examples=500)
@given(st.text(alphabet="/.ab", max_size=12))
def test_the_fast_paths_path_forms_are_pathlibs(text: str) -> None:
    """The fast path normalises the socket and store paths as `str(Path(...))` would, without
    pathlib (`_warm_trust._pure`): the same strings reach the checks and the store's identity,
    `//` roots, `.` parts and trailing slashes included."""
    assert _warm_trust._pure(text) == str(Path(text))
    advert = _warm_trust._pure(text + ".json")
    assert _warm_trust._parent(advert) == str(Path(advert).parent)


@pytest.mark.parametrize("value", [1, 1.5, None, True, [], {}])
def test_a_store_root_that_is_no_string_is_refused_as_pathlib_refuses_it(value: object) -> None:
    with pytest.raises(TypeError):
        Path(value)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _warm_trust._pure(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 200_000])
@pytest.mark.parametrize("limit", [1, 65_536, 70_000, 4 << 20, sys.maxsize])
def test_the_fast_paths_file_reads_are_opens(tmp_path: Path, size: int, limit: int) -> None:
    """`_warm_trust.read_file` (fewer system calls) reads what `open(path, "rb").read(limit)`
    reads (`.read()` for sys.maxsize: metadata.json's), and refuses what it refuses."""
    path = tmp_path / "data"
    path.write_bytes(os.urandom(size))
    with open(path, "rb") as f:
        expected = f.read() if limit == sys.maxsize else f.read(limit)
    assert _warm_trust.read_file(str(path), limit) == expected
    for missing_or_dir in (tmp_path / "absent", tmp_path):
        with pytest.raises(OSError):
            _warm_trust.read_file(str(missing_or_dir), limit)


FAKE_TORCH = """
import json, sys, types
torch = types.ModuleType("torch")
torch.__version__ = {version!r}
torch.version = types.SimpleNamespace(cuda={cuda!r}, hip={hip!r}, xpu=None)
torch.backends = types.SimpleNamespace()
torch.compiled_with_cxx11_abi = lambda: {abi!r}
torch.cuda = types.SimpleNamespace(
    is_available=lambda: True,
    current_device=lambda: 0,
    get_device_capability=lambda index: (9, 0),
    get_device_properties=lambda index: types.SimpleNamespace(gcnArchName="gfx942:sramecc+"),
)
torch._C = types.SimpleNamespace(_get_privateuse1_backend_name=lambda: "privateuseone")
sys.modules["torch"] = torch
from kerneld_client import _warm
fast = _warm.platform_key()
from kerneld_client import platform  # imported after: its own detection, not the fast path's
p = platform.Platform(platform.detect_raw())
print(json.dumps({{"fast": fast, "staged": [p.key, p.backend_type, p.device_capabilities]}}))
"""


@pytest.mark.parametrize(
    ("version", "cuda", "hip", "abi"),
    [
        ("2.13.0+cpu", None, None, True),
        ("2.12.1+cu130", "13.0", None, True),
        ("2.13.0+rocm6.4", None, "6.4.43482-0f2d60242", False),
        (" 2.14.0a0+git", "12.8", None, True),
    ],
)
def test_the_fast_paths_fingerprint_is_the_platform_modules(
    tmp_path: Path, version: str, cuda: str | None, hip: str | None, abi: bool
) -> None:
    """The fast path detects the common platforms (CPU, CUDA, ROCm under torch on Linux) itself,
    and must name them as `kerneld_client.platform` does: a torch-like module in `sys.modules`,
    both detections, the same fingerprint, backend and devices."""
    env = client_env(None, tmp_path)
    code = FAKE_TORCH.format(version=version, cuda=cuda, hip=hip, abi=abi)
    out = run_client(code, env)
    assert out["fast"] == out["staged"]
    assert os.uname().machine in out["fast"][0]
