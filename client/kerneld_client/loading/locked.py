"""The commits a `kernels.lock` pins, for `load_kernel` and `get_locked_kernel`.

Without an explicit `lockfile=`, the lock file is the one installed with the calling
package (its distribution metadata), as `kernels` reads it; either lock format is accepted.
"""

from __future__ import annotations

import os


def locked_commits(repo_id: str, lockfile: str | os.PathLike[str] | None) -> dict[str, str]:
    """Every repo -> commit of the lock file; ValueError (LockfileError) when `repo_id` is not
    locked there (a project error, as in `kernels`)."""
    from kerneld_client import lockfile as lf

    if lockfile is None:
        text, source = _caller_lockfile()
        parsed = lf.parse_lockfile(text, source=source)
    else:
        parsed = lf.load_lockfile(lockfile)
    commits: dict[str, str] = {}
    for repo, commit, _ref in parsed.pinned():
        commits.setdefault(repo, commit)
    if repo_id not in commits:
        raise ValueError(
            f"Kernel `{repo_id}` is not locked in {parsed.source}; lock it with `kernels lock`"
        )
    return commits


def _caller_lockfile() -> tuple[str, str]:
    """(text, source) of `kernels.lock` in the calling package's distribution metadata."""
    import importlib.metadata
    import inspect

    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__", "").startswith("kerneld_client"):
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    package = module.split(".")[0]
    for dist_name in importlib.metadata.packages_distributions().get(package, []):
        text = importlib.metadata.distribution(dist_name).read_text("kernels.lock")
        if text is not None:
            return text, f"{dist_name} (kernels.lock)"
    raise ValueError(
        f"could not find a `kernels.lock` in the metadata of the package of {module or '?'}; "
        "lock the project's kernels (`kernels lock`) and reinstall it, or pass lockfile="
    )
