"""The example kernels as Hub-style git repos: `<root>/kernels/<org>/<name>`, bare or not.

Each repo has branches main, v1, v2 and tags v1.0.0, v2.0.0, with fixed authors and dates, so the
same build always gives the same commit shas; the `.so` files of LFS kernels are LFS pointers with
their objects under `<git dir>/lfs/objects`. The repos are created once per cache entry (git and
git-lfs take about a second) and copied from that template on every call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock

from examples.kernels.built import BuiltExamples, BuiltKernel
from examples.kernels.digest import iter_files
from examples.kernels.specs import KERNELS, LICENSE, VERSIONS, BuildError, KernelSpec
from examples.kernels.variant_files import copy_tree_files

# Fixed commit identity and dates, so the same build gives the same commit shas anywhere.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "kerneld examples",
    "GIT_AUTHOR_EMAIL": "examples@kerneld.invalid",
    "GIT_COMMITTER_NAME": "kerneld examples",
    "GIT_COMMITTER_EMAIL": "examples@kerneld.invalid",
}
COMMIT_DATES = {
    "v1": "2026-01-01T00:00:00+00:00",
    "v2": "2026-01-02T00:00:00+00:00",
    "main": "2026-01-03T00:00:00+00:00",
}


@dataclass(frozen=True)
class HubRepo:
    """One kernel laid out as a git repo at `<root>/kernels/<org>/<name>`."""

    repo_id: str
    name: str
    path: Path  # the work tree (non-bare) or the git dir (bare)
    bare: bool
    lfs: bool
    branches: Mapping[str, str]  # branch -> commit sha
    tags: Mapping[str, str]  # tag -> commit sha (tags are lightweight)
    branch_versions: Mapping[str, int]  # branch -> kernel version it carries
    lfs_paths: tuple[str, ...]  # repo paths stored as LFS pointers
    default_branch: str = "main"

    @property
    def git_dir(self) -> Path:
        return self.path if self.bare else self.path / ".git"

    @property
    def lfs_objects_dir(self) -> Path:
        return self.git_dir / "lfs" / "objects"


@dataclass(frozen=True)
class HubRoot:
    """A folder of Hub-style kernel repos, laid out as olah's mirrors-path expects."""

    root: Path
    org: str
    bare: bool
    repos: tuple[HubRepo, ...]

    def repo(self, name: str) -> HubRepo:
        for r in self.repos:
            if name in (r.name, r.repo_id):
                return r
        raise KeyError(f"no repo {name!r}")


def _git_env(date: str | None = None) -> dict[str, str]:
    """A hermetic git: no user or system config, fixed identity and dates."""
    env = dict(os.environ)
    for name in list(env):
        if name.startswith("GIT_"):
            del env[name]
    env.update(GIT_IDENTITY)
    env.update(
        {
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "LC_ALL": "C",
        }
    )
    if date is not None:
        env["GIT_AUTHOR_DATE"] = date
        env["GIT_COMMITTER_DATE"] = date
    return env


def _git(args: list[str], cwd: Path, date: str | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], check=False, cwd=cwd, env=_git_env(date), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def _readme(spec: KernelSpec, version: int, note: str) -> str:
    return (
        "---\n"
        "library_name: kernels\n"
        f"license: {LICENSE.lower()}\n"
        "tags:\n"
        "- kernel\n"
        "---\n\n"
        f"# {spec.name}\n\n"
        f"{spec.summary}. Example kernel for kerneld's tests, version {version}.\n"
        f"{note}"
    )


def _replace_content(work: Path, kernel: BuiltKernel, spec: KernelSpec, readme: str) -> None:
    for entry in work.iterdir():
        if entry.name == ".git":
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    copy_tree_files(kernel.path / "build", work / "build")
    for path in iter_files(work / "build"):
        path.chmod(0o755 if path.suffix == ".so" else 0o644)
    (work / "README.md").write_text(readme)
    if spec.lfs:
        (work / ".gitattributes").write_text("*.so filter=lfs diff=lfs merge=lfs -text\n")


def _make_work_repo(work: Path, built: BuiltExamples, spec: KernelSpec) -> None:
    """History: v1 (branch v1, tag v1.0.0) -> v2 (branch v2, tag v2.0.0) -> README (main)."""
    work.mkdir(parents=True)
    _git(["init", "-q", "-b", "main"], work)
    if spec.lfs:
        _git(["lfs", "install", "--local"], work)
    for version in VERSIONS:
        kernel = built.kernel(spec.name, version)
        _replace_content(work, kernel, spec, _readme(spec, version, ""))
        _git(["add", "-A"], work)
        date = COMMIT_DATES[f"v{version}"]
        _git(["commit", "-q", "-m", f"{spec.name} v{version}"], work, date)
        _git(["branch", f"v{version}"], work)
        _git(["tag", f"v{version}.0.0"], work)
    latest = VERSIONS[-1]
    note = f"\n`main` carries version {latest}.\n"
    (work / "README.md").write_text(_readme(spec, latest, note))
    _git(["add", "-A"], work)
    _git(["commit", "-q", "-m", "README: point at the latest version"], work, COMMIT_DATES["main"])


def _refs(git_dir: Path, kind: str) -> dict[str, str]:
    out = _git(
        [
            "--git-dir",
            str(git_dir),
            "for-each-ref",
            "--format=%(refname:short) %(objectname)",
            kind,
        ],
        git_dir,
    )
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def _create_hub(root: Path, *, bare: bool, built: BuiltExamples) -> HubRoot:
    """Create the repos from scratch with git and git-lfs (what make_hub caches)."""
    org_dir = root / "kernels" / built.org
    org_dir.mkdir(parents=True, exist_ok=True)
    if any(spec.lfs for spec in KERNELS):
        try:
            _git(["lfs", "version"], org_dir)
        except (BuildError, OSError) as e:
            raise BuildError("git-lfs is required (apt-get install git-lfs)") from e
    repos: list[HubRepo] = []
    for spec in KERNELS:
        final = org_dir / spec.name
        if final.exists():
            shutil.rmtree(final)
        if bare:
            staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=org_dir))
            work = staging / spec.name
        else:
            work = final
        _make_work_repo(work, built, spec)
        lfs_paths: tuple[str, ...] = ()
        if spec.lfs:
            listed = _git(["lfs", "ls-files", "--all", "--name-only"], work)
            lfs_paths = tuple(sorted(set(listed.splitlines())))
        if bare:
            _git(["clone", "-q", "--bare", "--no-hardlinks", str(work), str(final)], org_dir)
            _git(["--git-dir", str(final), "remote", "remove", "origin"], org_dir)
            lfs_src = work / ".git" / "lfs" / "objects"
            if lfs_src.is_dir():
                shutil.copytree(lfs_src, final / "lfs" / "objects")
            shutil.rmtree(staging)
        git_dir = final if bare else final / ".git"
        repos.append(
            HubRepo(
                repo_id=f"{built.org}/{spec.name}",
                name=spec.name,
                path=final,
                bare=bare,
                lfs=spec.lfs,
                branches=_refs(git_dir, "refs/heads"),
                tags=_refs(git_dir, "refs/tags"),
                branch_versions={"main": VERSIONS[-1], **{f"v{v}": v for v in VERSIONS}},
                lfs_paths=lfs_paths,
            )
        )
    return HubRoot(root=root, org=built.org, bare=bare, repos=tuple(repos))


def _hub_template(built: BuiltExamples, bare: bool) -> HubRoot:
    """Repos made once per cache entry (git + LFS take ~1 s); make_hub copies them."""
    kind = "bare" if bare else "work"
    root = built.root / f"hub-{kind}"
    info = built.root / f"hub-{kind}.json"

    def load() -> HubRoot | None:
        try:
            data = json.loads(info.read_text())
        except (OSError, ValueError):
            return None
        repos = tuple(
            HubRepo(**{**r, "path": root / r["path"], "lfs_paths": tuple(r["lfs_paths"])})
            for r in data["repos"]
        )
        if not all(r.path.is_dir() for r in repos):
            return None
        return HubRoot(root=root, org=data["org"], bare=bare, repos=repos)

    if (hub := load()) is not None:
        return hub
    with FileLock(str(built.root.parent / ".lock")):
        if (hub := load()) is not None:
            return hub
        if root.exists():
            shutil.rmtree(root)
        hub = _create_hub(root, bare=bare, built=built)
        data = {
            "org": hub.org,
            "repos": [
                {
                    **{k: v for k, v in r.__dict__.items() if k != "path"},
                    "path": r.path.relative_to(root).as_posix(),
                    "branches": dict(r.branches),
                    "tags": dict(r.tags),
                    "branch_versions": dict(r.branch_versions),
                    "lfs_paths": list(r.lfs_paths),
                }
                for r in hub.repos
            ],
        }
        info.write_text(json.dumps(data, indent=2) + "\n")
    return hub


def lay_out_hub(dest: Path | str, *, bare: bool, built: BuiltExamples) -> HubRoot:
    """Copy the build's repos (made once, see `_hub_template`) to `<dest>/kernels/<org>/`,
    replacing any repos of the same names there."""
    template = _hub_template(built, bare)
    root = Path(dest).resolve()
    org_dir = root / "kernels" / built.org
    org_dir.mkdir(parents=True, exist_ok=True)
    repos: list[HubRepo] = []
    for repo in template.repos:
        final = org_dir / repo.name
        if final.exists():
            shutil.rmtree(final)
        shutil.copytree(repo.path, final, symlinks=True)
        repos.append(replace(repo, path=final))
    return HubRoot(root=root, org=built.org, bare=bare, repos=tuple(repos))
