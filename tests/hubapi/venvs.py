"""Throw-away virtual environments with one released `kernels` each, from the package registry.

Each venv holds only what pip resolves for its requirements (`kernels==0.19.1`, optionally the
kerneld-client distribution in client/ with its start-up hook `.pth`), so a test of an
"unmodified release" sees that release's own huggingface_hub and nothing of the project's:
no sigstore, Transformers, grpc or kerneld_client unless pip put them there.

The one thing not installed per venv is torch (the registry would bring a multi-GB CUDA build,
and the local CPU wheel takes a minute to unpack). A `torch-only-<key>/` folder beside the venvs
holds hard links (copies across file systems) of torch, the distributions it requires and numpy
(torch warns without it), taken from the project's venv, and one `.pth` line appends it *after*
the venv's site-packages: the venv's own copies of shared requirements (typing_extensions,
filelock, fsspec) win, and nothing else of the project's is importable.

The venvs live in the suite's cache outside the clone (tests/support/testcache.py; `make
test-deps` makes them before the suite), each named by a hash of its requirements and the
interpreter, so later runs and later clones reuse them.

A venv whose requirements name this checkout's client (CLIENT_REQUIREMENT) runs the work
tree's code, so it cannot be shared between clones; rebuilding a dozen of them per clone cost
~6 minutes on a busy machine (issue 55). It is made of layers instead: the shared venv of the
other requirements plus the client's own dependencies (one per requirement list, every clone
reuses it), the clone's `pip install --no-deps --editable client/` (one per clone), and a
nearly empty venv per pair whose one `.pth` adds both with `site.addsitedir`, which reads
their `.pth` files (the editable finder, the start-up hook, torch) as the interpreter reads its
own site-packages at start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from tests.support.testcache import (
    cache_dir,
    content_key,
    interpreter_key,
    link_tree,
    locked,
    staging,
)
from tests.support.watchdog import run_until_stalled
from tests.support.zygote import run_python

#: The newest 0.14 and 0.16 releases, 0.17.2, 0.18.3 and the newest (issue 24, issue 40).
KERNELS_RELEASES = ("0.14.1", "0.16.2", "0.17.2", "0.18.3", "0.19.1")
#: The releases the start-up hook serves (issue 40): each tested in a venv with kerneld-client.
HOOK_RELEASES = ("0.17.2", "0.18.3", "0.19.1")
#: The newest Transformers: it requires kernels>=0.19.1,<0.20.
TRANSFORMERS_RELEASE = "5.25.0"
#: A pip install is killed only after this long with no CPU used (tests/support/watchdog.py).
INSTALL_STALL_S = 300
CLIENT = Path(__file__).resolve().parents[2] / "client"
#: The requirement that installs kerneld-client (editable: the venv runs the work tree's code).
CLIENT_REQUIREMENT = f"--editable={CLIENT}"
TORCH_ONLY = "torch-only"
#: Transformers release -> its hook venv's requirements and name (tests/integrations).
TF_HOOK_RELEASES = {
    "5.22.2": (["transformers[kernels]==5.22.2", CLIENT_REQUIREMENT], "tf-hook-5.22.2"),
    "5.25.0": (["transformers==5.25.0", CLIENT_REQUIREMENT], "tf-hook"),
}

#: Diffusers' hub attention backends through the hook (issue 53). Diffusers does not require
#: `kernels`: a user installs it beside, here the newest release the hook serves.
DIFFUSERS_RELEASE = "0.42.1"
DIFFUSERS_HOOK = (
    [f"diffusers=={DIFFUSERS_RELEASE}", f"kernels=={HOOK_RELEASES[-1]}", CLIENT_REQUIREMENT],
    "diffusers-hook",
)


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _closure(name: str) -> list[metadata.Distribution]:
    """`name`'s distribution and every one it requires (no extras), as installed here."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = _requirement_name(todo.pop())
        if key in seen:
            continue
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue  # an optional or platform-specific requirement not installed here
        seen[key] = dist
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(req)
    return list(seen.values())


def venv_root() -> Path:
    """The cache's folder of venvs (the fixtures' and `make test-deps`'s `root`)."""
    return cache_dir("venvs")


def torch_only(root: Path) -> Path:
    """`root/torch-only-<key>`: torch and its requirements as installed in the project's venv
    (the key: their versions and the interpreter); made once, atomically."""
    dists = _closure("torch") + _closure("numpy")  # torch warns at import without numpy
    key = content_key(interpreter_key(), sorted(f"{d.name}=={d.version}" for d in dists))
    folder = root / f"{TORCH_ONLY}-{key}"
    with locked(folder):
        if (folder / ".done").exists():
            return folder
        with staging(folder) as tmp:
            for dist in dists:
                base = Path(str(dist.locate_file("")))
                files = dist.files or []
                tops = {Path(str(f)).parts[0] for f in files if not str(f).startswith("..")}
                for top in tops:
                    source, dest = base / top, tmp / top
                    if source.exists() and not dest.exists() and not top.endswith(".pth"):
                        link_tree(source, dest)
            (tmp / ".done").write_text("")
    return folder


def make_venv(
    root: Path, requirements: list[str], *, name: str | None = None, with_torch: bool = True
) -> Path:
    """A venv at `root/<name>-<key>` with `requirements` (`kernels==0.16.2`,
    CLIENT_REQUIREMENT) and what pip resolves for them, plus torch through `torch-only-<key>/`
    unless `with_torch` is False; its python. The key hashes the requirements, the interpreter
    and the torch folder; a venv a previous call finished (`.installed`) is reused, one left
    half-made by a killed run is made again, and a second process waits on the first's lock.

    The venv has no pip of its own: the project's pip installs into it (`pip --python`), which
    saves the seconds `ensurepip` spends copying pip into every venv. Requirements naming
    CLIENT_REQUIREMENT get a layered venv (the module's docstring)."""
    if CLIENT_REQUIREMENT in requirements:
        others = [r for r in requirements if r != CLIENT_REQUIREMENT]
        return _with_client(root, others, name=name, with_torch=with_torch)
    torch = torch_only(root) if with_torch else None
    base = name or "+".join(r.replace("==", "-") for r in requirements)
    key = content_key(interpreter_key(), requirements, torch.name if torch else None)

    def make(folder: Path) -> str:
        _install_venv(folder, requirements, torch)
        return "\n".join(requirements)

    return _venv_once(root / f"{base}-{key}", make)


def _venv_once(folder: Path, make: Callable[[Path], str]) -> Path:
    """The venv at `folder`, made by `make(folder)` unless a previous call finished it
    (`.installed`, holding what `make` returned); one left half-made by a killed run is made
    again, and a second process waits on the first's lock. Its python."""
    python = folder / "bin" / "python"
    done = folder / ".installed"
    with locked(folder):
        if done.exists():
            return python
        shutil.rmtree(folder, ignore_errors=True)  # half-made by a run that was killed
        done.write_text(make(folder) + "\n")
    return python


def _install_venv(folder: Path, requirements: list[str], torch: Path | None) -> None:
    python = _new_venv(folder)
    _pip_install(python, requirements)
    if torch is not None:
        add_torch_layer(python, torch)


def add_torch_layer(python: Path, torch: Path) -> None:
    """Put the torch layer (`torch_only`) on the path of the venv of `python`: its imports and
    its pip see torch as installed."""
    Path(purelib(python), "zz-torch-only.pth").write_text(f"{torch}\n")


def _new_venv(folder: Path) -> Path:
    """An empty venv at `folder` (no pip: the project's pip installs into it); its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    return folder / "bin" / "python"


def _pip_install(python: Path, args: list[str]) -> None:
    """The project's pip installs `args` into the venv of `python`, killed only when stalled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_TARGET", "PYTHON"))}
    proc = run_until_stalled(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *args,
        ],
        stall_s=INSTALL_STALL_S,
        what=f"pip install {' '.join(args)}",
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"pip install {' '.join(args)} failed (the package registry must be "
            f"reachable; `make test-deps` makes every venv before the suite):\n"
            f"{proc.stdout}\n{proc.stderr}"
        )


def purelib(python: Path) -> str:
    """The site-packages folder of the venv of `python`."""
    return subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def client_dependencies() -> list[str]:
    """What client/pyproject.toml says kerneld-client requires (its extras aside)."""
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return list(project["dependencies"])


def _client_layer(root: Path) -> Path:
    """`root/client-<key>`: this clone's `pip install --no-deps --editable client/` in a venv
    of its own (the key: the clone's path, its packaging files and the interpreter); its
    python."""
    packaging = [
        (CLIENT / f).read_text(encoding="utf-8")
        for f in ("pyproject.toml", "setup.py", "kerneld_client_hook.pth")
    ]

    def make(folder: Path) -> str:
        _pip_install(_new_venv(folder), ["--no-deps", CLIENT_REQUIREMENT])
        return str(CLIENT)

    key = content_key(interpreter_key(), str(CLIENT), packaging)
    return _venv_once(root / f"client-{key}", make)


def _with_client(
    root: Path, requirements: list[str], *, name: str | None, with_torch: bool
) -> Path:
    """A venv with `requirements` and this clone's client: the shared venv of `requirements`
    and the client's dependencies, and this clone's client layer, added in that order by one
    `.pth` in a venv of their own (see the module's docstring); its python."""
    base = name or "+".join(r.replace("==", "-") for r in requirements) + "+client"
    shared = make_venv(
        root, [*requirements, *client_dependencies()], name=f"{base}-shared", with_torch=with_torch
    )
    client = _client_layer(root)

    def make(folder: Path) -> str:
        python = _new_venv(folder)
        layers = "; ".join(f"site.addsitedir({purelib(p)!r})" for p in (shared, client))
        Path(purelib(python), "00-kerneld-test-layers.pth").write_text(f"import site; {layers}\n")
        return f"{shared.parent.parent}\n{client.parent.parent}"

    key = content_key(shared.parent.parent.name, client.parent.parent.name)
    return _venv_once(root / f"{base}-{key}", make)


def make_venvs(root: Path, requirements: list[str]) -> dict[str, Path]:
    """One venv per requirement, built side by side; requirement -> python."""
    torch_only(root)
    with ThreadPoolExecutor(max_workers=len(requirements)) as pool:
        futures = {r: pool.submit(make_venv, root, [r]) for r in requirements}
        return {r: f.result() for r, f in futures.items()}


def make_hook_venvs(root: Path, releases: tuple[str, ...] = HOOK_RELEASES) -> dict[str, Path]:
    """One venv per `kernels` release with kerneld-client (and its hook) beside it; release ->
    python."""
    torch_only(root)
    with ThreadPoolExecutor(max_workers=len(releases)) as pool:
        futures = {
            r: pool.submit(
                make_venv, root, [f"kernels=={r}", CLIENT_REQUIREMENT], name=f"hook-kernels-{r}"
            )
            for r in releases
        }
        return {r: f.result() for r, f in futures.items()}


def run_in_venv(
    python: Path, script: Path, args: dict[str, Any], env: dict[str, str], timeout: float = 300
) -> dict[str, Any]:
    """Run a child script by path in a venv's python, from `env["HOME"]` (else /); the JSON
    object its last stdout line holds. A script that imports torch first is forked from that
    python's zygote (tests/support/zygote.py)."""
    proc = run_python(
        [str(script), json.dumps(args)],
        env=env,
        cwd=Path(env.get("HOME", "/")),
        timeout=timeout,
        python=python,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out
