"""The start-up half of the `kernels` hook, run by `kerneld_client_hook.pth` when
KERNELD_HOOK_KERNELS is on.

It must cost next to nothing and never break the interpreter: it imports neither `kernels` nor
torch (most processes never load a kernel), only puts a finder on `sys.meta_path` that waits for
`import kernels`, lets that import finish, then calls `kerneld_client.integrations.kernels
.install()`. Every failure becomes one warning and the process goes on with plain `kernels`.
The `kernels` command line itself (`kernels download`, `kernels lock`...) is left alone: it is
`kernels`' tool, and what it downloads or locks must be what `kernels` would.
"""

from __future__ import annotations

import sys

from kerneld_client.integrations._after_import import AfterImport, warn

ENV = "KERNELD_HOOK_KERNELS"
TARGET = "kernels"
_ON = ("1", "true", "yes", "on")


def enabled(value: str | None) -> bool:
    """Whether a KERNELD_HOOK_KERNELS value turns the hook on (the .pth line uses the same set)."""
    return (value or "").strip().lower() in _ON


def _kernels_cli() -> bool:
    argv = getattr(sys, "argv", None) or [""]
    return str(argv[0]).rsplit("/", 1)[-1] == TARGET


def _hook_now() -> None:
    """`kernels` is imported: route it through kerneld (install() warns about what it refuses)."""
    if _kernels_cli():
        return
    try:
        from kerneld_client.integrations import kernels as hook

        hook.install()
    except Exception as exc:
        warn(f"kerneld: could not hook the kernels package ({exc!r}); it works as usual")


class KernelsFinder(AfterImport):
    """Waits for `import kernels`, then installs the hook."""

    target = TARGET

    def then(self) -> None:
        _hook_now()


def activate() -> None:
    """Hook `kernels` now if it is already imported, else when it is."""
    try:
        if TARGET in sys.modules:
            _hook_now()
        else:
            KernelsFinder().insert()
    except Exception as exc:
        warn(f"kerneld: {ENV} is set, but the kernels hook could not start ({exc!r})")
