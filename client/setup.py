"""Packaging beyond what pyproject.toml can say: install `kerneld_client_hook.pth` at the
top of site-packages, where the interpreter reads it at start (KERNELD_HOOK_KERNELS=1 routes the
`kernels` package through kerneld; unset, the line costs a dictionary lookup).

A .pth file lives outside any package, so `build_py` copies it next to the packages: into the
wheel's root for a normal build, and for an editable install (`pip install -e .`, whose build
directory is thrown away) into the editable wheel, which setuptools stages in `install_lib`.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "kerneld_client_hook.pth"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH)


class BuildPyWithPth(build_py):
    """build_py that also ships the start-up hook file."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        self.mkpath(target)
        self.copy_file(SOURCE, os.path.join(target, PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
