"""Named crash points, for tests that kill the store at a precise step.

Production code calls :func:`point` at every step boundary of ingest, publish and GC; it costs
one global lookup when no hook is installed. A test installs a hook (for example one that sends
SIGKILL to its own process on the Nth call) to prove that an interruption there is harmless.
"""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[str], None] | None = None


def point(name: str) -> None:
    """Mark a step boundary named ``name`` (e.g. ``"blob.before_rename"``)."""
    if _hook is not None:
        _hook(name)


def set_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or with ``None`` remove) the process-wide fault hook."""
    global _hook
    _hook = hook
