"""The Python dependencies a build declares (`metadata.json` `python-depends`), checked before
any of its code runs, as `kernels` checks them: a build that needs a distribution this
interpreter does not have is refused with a ValueError naming it, instead of failing inside its
import (or, in a layer, being taken for an outage).

kerneld's rule is that each listed distribution is installed (`importlib.metadata`); `kernels`
also keeps an allow-list of names, which kerneld does not: an installed distribution is the
job's own choice.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kerneld_client.errors import DependencyMissing

__all__ = ["check_python_depends"]

_NAME_END = re.compile(r"[\s<>=!~;\[(]")


def check_python_depends(folder: Path, variant: str) -> None:
    """DependencyMissing (a ValueError) when a `python-depends` entry is not installed."""
    try:
        doc = json.loads((folder / "metadata.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the loader reads it too, and says what is wrong with it
    wanted = doc.get("python-depends") if isinstance(doc, dict) else None
    if not isinstance(wanted, list) or not wanted:
        return
    from importlib import metadata

    module = str(doc.get("name") or folder.name).replace("-", "_")
    for entry in wanted:
        name = _NAME_END.split(str(entry).strip(), maxsplit=1)[0]
        if not name:
            continue
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise DependencyMissing(
                f"Kernel module `{module}` uses Python dependency `{name}`, which is not "
                "installed in this interpreter",
                variant=variant,
                hint=f"install {name} (pip install {name})",
            ) from None
