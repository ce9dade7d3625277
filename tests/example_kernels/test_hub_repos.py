"""The example kernels as Hub-style git repos: refs, versions, LFS objects, bare copies."""

from __future__ import annotations

import io
import os
import subprocess
import zipfile
from pathlib import Path

from examples.kernels.build import make_hub, make_hub_root
from examples.kernels.built import BuiltExamples, BuiltVariant
from examples.kernels.hub import HubRoot
from examples.kernels.specs import ORG
from examples.kernels.toolchain import local_arch_variant


def git(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"})
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True)
    return out.stdout.decode(errors="replace").strip()


def _version_py(cwd: Path, ref: str, built: BuiltVariant) -> str:
    """`_version.py` of a build in the repo: a file of it, or inside its archive (zip layout)."""
    folder = f"{ref}:build/{built.variant}"
    if built.layout != "zip":
        return git("show", f"{folder}/_version.py", cwd=cwd)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    archive = subprocess.run(
        ["git", "show", f"{folder}/{built.module_id}.zip"], cwd=cwd, env=env, capture_output=True
    ).stdout
    return zipfile.ZipFile(io.BytesIO(archive)).read("_version.py").decode()


def _check_repo_refs(hub: HubRoot) -> None:
    for repo in hub.repos:
        assert set(repo.branches) == {"main", "v1", "v2"}
        assert repo.tags == {"v1.0.0": repo.branches["v1"], "v2.0.0": repo.branches["v2"]}
        assert len(set(repo.branches.values())) == 3
        assert repo.path == hub.root / "kernels" / hub.org / repo.name


def test_hub_repos_layout_branches_and_versions(
    example_hub: HubRoot, built_examples: BuiltExamples
):
    _check_repo_refs(example_hub)
    assert example_hub.repo("kerneld-examples/activation").lfs
    assert not example_hub.repo("relu2").lfs
    arch = built_examples.arch_variant
    for repo in example_hub.repos:
        cwd = repo.path
        assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=cwd) == "main"
        assert git("status", "--porcelain", cwd=cwd) == ""
        # main carries v2's build; v1 and v2 differ and say so in _version.py.
        assert git("rev-parse", "main:build", cwd=cwd) == git("rev-parse", "v2:build", cwd=cwd)
        for version in (1, 2):
            kernel = built_examples.kernel(repo.name, version)
            listed = git("ls-tree", "-r", "--name-only", f"v{version}", "build", cwd=cwd)
            expected = sorted(f"build/{v.variant}/{f}" for v in kernel.variants for f in v.files)
            assert sorted(listed.splitlines()) == expected
            built = built_examples.variant(repo.name, version)
            assert built.variant in (arch, local_arch_variant("new"))
            version_py = _version_py(cwd, f"v{version}", built)
            assert f'__version__ = "{version}.0.0"' in version_py
        readme = git("show", "main:README.md", cwd=cwd)
        assert readme.startswith("---\nlibrary_name: kernels\n")


def test_hub_repo_lfs_objects(example_hub: HubRoot, built_examples: BuiltExamples):
    repo = example_hub.repo("activation")
    assert (repo.path / ".gitattributes").read_text().startswith("*.so filter=lfs")
    for version in (1, 2):
        v = built_examples.variant("activation", version)
        path = f"build/{v.variant}/{v.library}"
        assert path in repo.lfs_paths
        pointer = git("cat-file", "-p", f"v{version}:{path}", cwd=repo.path)
        assert pointer.splitlines()[:2] == [
            "version https://git-lfs.github.com/spec/v1",
            f"oid sha256:{v.library_sha256}",
        ]
        sha = v.library_sha256
        assert sha is not None
        obj = repo.lfs_objects_dir / sha[:2] / sha[2:4] / sha
        assert obj.read_bytes() == (v.path / v.library).read_bytes()  # type: ignore[operator]
    # The work tree holds the real library, not the pointer.
    v2 = built_examples.variant("activation", 2)
    assert (repo.path / "build" / v2.variant / v2.library).read_bytes()[:4] == b"\x7fELF"  # type: ignore[operator]

    plain = example_hub.repo("relu2")
    assert plain.lfs_paths == () and not (plain.path / ".gitattributes").exists()
    v = built_examples.variant("relu2", 1)
    blob = subprocess.run(
        ["git", "cat-file", "blob", f"v1:build/{v.variant}/{v.library}"],
        cwd=plain.path,
        capture_output=True,
        check=True,
    ).stdout
    assert blob == (v.path / v.library).read_bytes()  # type: ignore[operator]


def test_bare_hub_has_the_same_commits(example_hub: HubRoot, example_hub_bare: HubRoot):
    _check_repo_refs(example_hub_bare)
    for bare in example_hub_bare.repos:
        work = example_hub.repo(bare.name)
        assert bare.bare and bare.git_dir == bare.path
        assert git("rev-parse", "--is-bare-repository", cwd=bare.path) == "true"
        assert "[remote" not in (bare.path / "config").read_text()  # no path to the staging repo
        # Fixed authors and dates: built twice, the repos have identical commit shas.
        assert bare.branches == work.branches and bare.tags == work.tags
        assert bare.lfs_paths == work.lfs_paths
        objects = sorted(p.name for p in bare.lfs_objects_dir.rglob("*") if p.is_file())
        assert objects == sorted(p.name for p in work.lfs_objects_dir.rglob("*") if p.is_file())
        assert len(objects) == (2 if bare.lfs else 0)


def test_make_hub_root_replaces_existing_repos(tmp_path: Path, example_hub: HubRoot):
    root = make_hub_root(tmp_path / "hub")  # builds (here: a cache hit) by itself
    assert root == tmp_path / "hub"
    junk = root / "kernels" / ORG / "relu2" / "junk"
    junk.write_text("x")
    again = make_hub(root)
    assert not junk.exists()
    assert again.repo("relu2").branches == example_hub.repo("relu2").branches
