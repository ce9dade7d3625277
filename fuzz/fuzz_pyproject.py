"""atheris target: [tool.kernels.dependencies] of a pyproject.toml (read_pyproject_dependencies)."""

from __future__ import annotations

from collections.abc import Mapping

from _harness import Target, run, workdir


def make() -> tuple[Target, Mapping[str, bytes]]:
    from tests.fuzz import invariants as inv

    root = workdir("pyproject")

    def target(data: bytes) -> None:
        inv.check_pyproject(data, root)

    seeds = {
        "deps": b'[project]\nname = "x"\n\n[tool.kernels.dependencies]\n"org/a" = 1\n"org/b" = 2\n',
        "none": b"[tool.kernels]\nx = 1\n",
    }
    return target, seeds


if __name__ == "__main__":
    run("pyproject", ["kerneld_client.lockfile"], make)
