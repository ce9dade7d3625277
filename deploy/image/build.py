"""Build kerneld's container images from this checkout, without a container registry.

    sudo python3 deploy/image/build.py                 # the base (Debian 12), then both images
    python3 deploy/image/build.py --base python:3.11-slim   # or your own base

Three steps, each cached under --cache (default: .cache/image in the checkout):

1. The base image, unless --base names one: a minimal Debian 12 root file system made with
   `mmdebstrap` from Debian's package archive (python3, python3-venv, ca-certificates, passwd),
   imported with `<engine> import` as `localhost/kerneld-base:bookworm`. Needs root.
2. A wheelhouse: the wheels of kerneld and kerneld-client built from this checkout, and the wheels
   of their dependencies (for the job image: kerneld-client's and torch's) fetched once with pip
   from the package index. The wheels are for *this* Python (`--python`), so it must be the base's
   X.Y: the Containerfiles check it and say so.
3. `<engine> build` of deploy/image/Containerfile (the daemon, `localhost/kerneld:<version>`) and
   Containerfile.job (an example training image with kerneld-client and torch), offline
   (`--network=none`): pip installs only from the wheelhouse, the dependencies with their hashes.

The daemon image's `kerneld` user has the uid and gid of systemd/kerneld.sysusers, so the
DaemonSet, the job pods and a host install agree on who owns the store (docs/containers.md).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VERSION: str = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
    "version"
]
DAEMON_IMAGE = f"localhost/kerneld:{VERSION}"
JOB_IMAGE = f"localhost/kerneld-job-example:{VERSION}"
BASE_IMAGE = "localhost/kerneld-base:bookworm"
#: torch for the example job image: the project's pin (scripts/bootstrap), a CPU build.
TORCH = "torch==2.13.0"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd", "libstdc++6")
MIRRORS = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
#: Wheels with fixed timestamps: the same sources give the same wheel, so the image's layer with
#: kerneld in it is reused from the build cache until the code changes.
SOURCE_DATE_EPOCH = "1704067200"
SYSUSERS = REPO / "systemd" / "kerneld.sysusers"


class BuildError(Exception):
    """A step of the build failed; the message says which and what to do."""


def kerneld_uid() -> int:
    """The fixed uid of the `kerneld` user in systemd/kerneld.sysusers (also its gid)."""
    for line in SYSUSERS.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if fields[:2] == ["u", "kerneld"]:
            if not fields[2].isdigit():
                raise BuildError(f"{SYSUSERS}: the kerneld user has no fixed uid ({fields[2]!r})")
            return int(fields[2])
    raise BuildError(f"{SYSUSERS} has no `u kerneld` line")


def _run(
    argv: Sequence[str], what: str, *, timeout: float = 600, env: dict[str, str] | None = None
) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, check=False, timeout=timeout, env=env
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise BuildError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{tail}")
    out: str = done.stdout
    return out


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:12]


# ---- 1. the base ----------------------------------------------------------------------------


def base_key() -> str:
    return _key(SUITE, BASE_PACKAGES, MIRRORS, 1)


def make_base(engine: str, cache: Path) -> str:
    """The Debian 12 base image, imported from a cached mmdebstrap root file system."""
    tag = f"{BASE_IMAGE}-{base_key()}"
    exists = [engine, "image", "inspect", "--format", "{{.Id}}", tag]
    if subprocess.run(exists, capture_output=True, check=False).returncode == 0:
        return tag
    rootfs = cache / f"base-{base_key()}.tar"
    if not rootfs.exists():
        if shutil.which("mmdebstrap") is None:
            raise BuildError("mmdebstrap is not installed: apt-get install mmdebstrap")
        cache.mkdir(parents=True, exist_ok=True)
        partial = rootfs.with_suffix(".partial")
        _run(
            [
                "mmdebstrap",
                "--variant=essential",
                f"--include={','.join(BASE_PACKAGES)}",
                '--aptopt=Acquire::Languages "none"',
                *(
                    f"--dpkgopt=path-exclude=/usr/share/{d}/*"
                    for d in ("doc", "man", "locale", "info")
                ),
                "--format=tar",
                SUITE,
                str(partial),
                *MIRRORS,
            ],
            "mmdebstrap (the base root file system; needs root and Debian's package archive)",
            timeout=1200,
        )
        partial.rename(rootfs)
    _run(
        [engine, "import", "--change", 'CMD ["/bin/bash"]', str(rootfs), tag],
        f"{engine} import of {rootfs}",
    )
    _run([engine, "tag", tag, BASE_IMAGE], f"{engine} tag")
    return tag


# ---- 2. the wheelhouse ----------------------------------------------------------------------


def _dependencies(project: Path) -> list[str]:
    meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    deps: list[str] = meta["project"]["dependencies"]
    return [d for d in deps if not d.startswith("kerneld-client")]  # built from client/


def python_version(python: str) -> str:
    return _run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], "the python"
    ).strip()


def _pip(python: str, cache: Path) -> Path:
    """pip in a venv of `python`, so the wheels are for that interpreter (cached)."""
    venv = cache / f"pip-{python_version(python)}"
    pip = venv / "bin" / "pip"
    if not pip.exists():
        _run([python, "-m", "venv", "--clear", str(venv)], f"{python} -m venv")
    return pip


def dependency_wheels(pip: Path, cache: Path, requirements: Sequence[str]) -> Path:
    """A folder of the wheels of `requirements` and everything they need, fetched once."""
    reqs = sorted(set(requirements))
    dest = cache / f"wheels-{_key(str(pip), reqs)}"
    if (dest / "requirements.txt").exists():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-wheels-", dir=cache))
    try:
        # --use-pep517: Debian 12's pip would build an sdist-only project (sdnotify) with
        # `setup.py bdist_wheel`, which needs a `wheel` its venv does not have.
        _run(
            [str(pip), "wheel", "--quiet", "--disable-pip-version-check", "--use-pep517",
             "--wheel-dir", str(tmp), *reqs],
            "pip wheel (the dependencies, from the package index)",
            timeout=1800,
        )  # fmt: skip
        (tmp / "requirements.txt").write_text(hashed_requirements(tmp))
        with contextlib.suppress(OSError):  # a concurrent build made it meanwhile
            tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def hashed_requirements(wheels: Path) -> str:
    """`name==version --hash=sha256:…` for every wheel: pip installs exactly these bytes."""
    lines = ["# every dependency, pinned to the wheel built or fetched for this image"]
    for whl in sorted(wheels.glob("*.whl")):
        name, version = whl.name.split("-")[:2]
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        lines.append(f"{name}=={version} --hash=sha256:{digest}")
    return "\n".join(lines) + "\n"


def project_wheels(pip: Path, dest: Path) -> list[Path]:
    """kerneld and kerneld-client built from this checkout (a copy: no build/ left in it)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    with tempfile.TemporaryDirectory(prefix="kerneld-src-") as tmp:
        src = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, src / name)
        shutil.copytree(REPO / "kerneld", src / "kerneld", ignore=ignore)
        shutil.copytree(REPO / "client", src / "client", ignore=ignore)
        _run(
            [str(pip), "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--wheel-dir", str(dest), str(src / "client"), str(src)],
            "pip wheel (kerneld and kerneld-client from this checkout)",
            env={**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH},
            timeout=600,
        )  # fmt: skip
    return sorted(dest.glob("*.whl"))


# ---- 3. the images --------------------------------------------------------------------------


def _context(root: Path, deps: Path, app: Sequence[Path], containerfile: str) -> Path:
    """A build context: the Containerfile, deps/ (hard links when possible) and app/."""
    ctx = root / containerfile.lower().replace(".", "-")
    ctx.mkdir()
    shutil.copy2(HERE / containerfile, ctx / containerfile)
    (ctx / "deps").mkdir()
    for whl in [*deps.glob("*.whl"), deps / "requirements.txt"]:
        try:
            os.link(whl, ctx / "deps" / whl.name)
        except OSError:
            shutil.copy2(whl, ctx / "deps" / whl.name)
    (ctx / "app").mkdir()
    for whl in app:
        shutil.copy2(whl, ctx / "app" / whl.name)
    return ctx


def build_image(
    engine: str, ctx: Path, containerfile: str, tag: str, build_args: dict[str, str]
) -> None:
    argv = [engine, "build", "--network=none", "--file", str(ctx / containerfile), "--tag", tag]
    if engine == "podman":
        argv += ["--pull=never", "--layers"]
    for name, value in build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    _run([*argv, str(ctx)], f"{engine} build of {tag}", timeout=1800)


def build(engine: str, base: str | None, python: str, cache: Path) -> dict[str, str]:
    """Build both images; what was built (image names, the base, the Python)."""
    cache.mkdir(parents=True, exist_ok=True)
    if shutil.which(engine) is None:
        raise BuildError(f"{engine} is not installed: apt-get install podman")
    base = base or make_base(engine, cache)
    pip = _pip(python, cache)
    py = python_version(python)
    client_deps = _dependencies(REPO / "client")
    daemon_deps = dependency_wheels(pip, cache, [*_dependencies(REPO), *client_deps])
    job_deps = dependency_wheels(pip, cache, [*client_deps, TORCH])
    uid = kerneld_uid()
    with tempfile.TemporaryDirectory(prefix=".tmp-ctx-", dir=cache) as tmp:
        root = Path(tmp)
        app = project_wheels(pip, root / "app-wheels")
        client = [w for w in app if w.name.startswith("kerneld_client-")]
        args = {"BASE": base, "PYTHON_VERSION": py}
        build_image(
            engine,
            _context(root, daemon_deps, app, "Containerfile"),
            "Containerfile",
            DAEMON_IMAGE,
            {**args, "KERNELD_UID": str(uid), "KERNELD_GID": str(uid)},
        )
        build_image(
            engine, _context(root, job_deps, client, "Containerfile.job"), "Containerfile.job",
            JOB_IMAGE, args,
        )  # fmt: skip
    return {"daemon": DAEMON_IMAGE, "job": JOB_IMAGE, "base": base, "python": py}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--engine",
        default="podman",
        choices=("podman", "docker"),
        help="podman (default; what the tests use) or docker (BuildKit, for RUN --mount)",
    )
    p.add_argument(
        "--base",
        help=f"the base image (Python {sys.version_info[0]}.x, a shell, useradd); default: "
        f"{BASE_IMAGE}, made here with mmdebstrap",
    )
    p.add_argument(
        "--python",
        default=sys.executable,
        help="builds the wheels; must be the base's Python X.Y (default: this one)",
    )
    p.add_argument("--cache", type=Path, default=REPO / ".cache" / "image")
    args = p.parse_args(argv)
    try:
        built = build(args.engine, args.base, args.python, args.cache.resolve())
    except BuildError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
