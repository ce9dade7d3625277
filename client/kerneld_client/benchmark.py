"""`Benchmark`, the base class of `kernels`' benchmark scripts (`kernels benchmark <repo>`).

kerneld runs no benchmarks itself: the class is here so that a script written for `kernels`
(`class MyBench(Benchmark): ...`) imports and subclasses the same name whichever serves
`kernels`. Its runner is the `kernels` command line, which stays `kernels`' own.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Benchmark"]


class Benchmark:
    """Subclass with `setup()`, `benchmark_<name>()` and optionally `verify_<name>()` methods;
    the runner sets `kernel` (the loaded kernel) and `device`, and compares `out` with what a
    `verify_<name>()` returns."""

    #: A seed the runner sets before `setup()`, for reproducible inputs (None: no seed).
    seed: int | None = None
    #: The device the runner benchmarks on.
    device: str = "cpu"

    def __init__(self) -> None:
        self.kernel: Any = None
        self.out: Any = None

    def setup(self) -> None:
        """Create the inputs as attributes (called once before the timed runs)."""
