"""Compile torch CPU extensions with setuptools and torch's BuildExtension.

build.py runs this file in a subprocess (one per parallel worker) so that setuptools' global
state, the torch import and the compiler's chatter stay out of the caller, and so that two workers
can compile at once. It takes one argument, a JSON file with a list of jobs:

    [{"name": "_activation_0123abc", "stage": "/abs/stage", "sources": ["csrc/activation.cpp"],
      "define_macros": [["KERNEL_VERSION", "1"]], "extra_compile_args": [...],
      "extra_link_args": [...]}]

Each job builds `<stage>/lib/<name>.abi3.so` from sources relative to `<stage>`, with `<stage>`
as the working directory: the build directory is fixed, which keeps the output reproducible.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TypedDict


class Job(TypedDict):
    name: str
    stage: str
    sources: list[str]
    define_macros: list[list[str]]
    extra_compile_args: list[str]
    extra_link_args: list[str]


def _build_one(job: Job) -> float:
    """Build one extension; return the seconds it took."""
    # Untyped libraries: bind them as Any rather than sprinkle ignores.
    setuptools: Any = importlib.import_module("setuptools")
    cpp_extension: Any = importlib.import_module("torch.utils.cpp_extension")

    started = time.monotonic()
    os.chdir(job["stage"])
    ext = cpp_extension.CppExtension(
        job["name"],
        job["sources"],
        py_limited_api=True,
        define_macros=[(k, v) for k, v in job["define_macros"]],
        extra_compile_args=job["extra_compile_args"],
        extra_link_args=job["extra_link_args"],
    )
    # No ninja: one source per extension gains nothing from it, and the plain compiler path
    # keeps the command line (and so the output) simple.
    setuptools.setup(
        name=job["name"],
        version="0",
        ext_modules=[ext],
        cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=False)},
        script_args=["--quiet", "build_ext", "--build-lib", "lib", "--build-temp", "tmp"],
    )
    return time.monotonic() - started


def main(argv: list[str]) -> int:
    jobs: list[Job] = json.loads(Path(argv[1]).read_text())
    for job in jobs:
        seconds = _build_one(job)
        print(f"built {job['name']} in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
