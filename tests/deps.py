"""`make test-deps`: the suite's heavy set-up, made before the suite and outside every test's
timeout (issue 55), into the cache outside the clone (tests/support/testcache.py).

    python -m tests.deps            # everything this machine can run
    python -m tests.deps --list     # the steps
    python -m tests.deps venvs examples

Each step is also what its fixture calls: a hit when this ran first, else the fixture makes it
(a file run on its own). Every step is keyed by its inputs and safe to run from two clones at
once (a lock per entry, entries complete before they are used).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from examples.kernels.build import build_examples
from examples.kernels.built import BuiltExamples
from tests.conformance.suite import RELEASES as SUITE_RELEASES
from tests.conformance.suite import fetch_suite, suite_venvs
from tests.hubapi.venvs import (
    DIFFUSERS_HOOK,
    KERNELS_RELEASES,
    TF_HOOK_RELEASES,
    TRANSFORMERS_RELEASE,
    make_hook_venvs,
    make_venv,
    make_venvs,
    venv_root,
)
from tests.support.testcache import cache_dir, cache_root
from tests.variants.release_resolvers import RELEASES as RESOLVER_RELEASES
from tests.variants.release_resolvers import make_clean_venv

EXAMPLES_ENV = "KERNELD_EXAMPLES_CACHE"


def release_venvs() -> dict[str, Path]:
    """tests/hubapi: requirement (`kernels==0.16.2`, `transformers==5.25.0`) -> python."""
    wanted = [f"kernels=={r}" for r in KERNELS_RELEASES]
    wanted.append(f"transformers=={TRANSFORMERS_RELEASE}")
    return make_venvs(venv_root(), wanted)


def hook_venvs() -> dict[str, Path]:
    """tests/integrations: `kernels` release -> python of its venv with kerneld-client."""
    return make_hook_venvs(venv_root())


def tf_hook_venvs() -> dict[str, Path]:
    """tests/integrations: Transformers release -> python of its venv with kerneld-client."""
    return {
        release: make_venv(venv_root(), requirements, name=name)
        for release, (requirements, name) in TF_HOOK_RELEASES.items()
    }


def diffusers_venv() -> Path:
    """tests/integrations/test_diffusers.py: Diffusers with `kernels` and kerneld-client."""
    requirements, name = DIFFUSERS_HOOK
    return make_venv(venv_root(), requirements, name=name)


def clean_release_venvs() -> dict[str, Path]:
    """tests/variants, tests/example_kernels: release -> python of a venv with only it."""
    root = venv_root()
    with ThreadPoolExecutor(max_workers=len(RESOLVER_RELEASES)) as pool:
        futures = {
            r: pool.submit(make_clean_venv, root / f"kernels-{r}-clean", f"kernels=={r}")
            for r in RESOLVER_RELEASES
        }
        return {r: f.result() for r, f in futures.items()}


def conformance(version: str) -> tuple[Path, dict[str, Path]]:
    """tests/conformance: release `version`'s own suite and its two venvs."""
    release = SUITE_RELEASES[version]
    return fetch_suite(release), suite_venvs(release, venv_root())


def examples() -> BuiltExamples:
    """The example kernels, built for the local torch (conftest points the suite's
    KERNELD_EXAMPLES_CACHE here unless it is set)."""
    return build_examples(os.environ.get(EXAMPLES_ENV) or cache_dir("examples"))


def systemd_wheels() -> Path | None:
    """tests/systemd/test_install.py's wheelhouse (only where that test runs: root)."""
    from tests.systemd.container import unavailable_reason
    from tests.systemd.wheelhouse import wheelhouse

    return None if unavailable_reason() else wheelhouse()


def images() -> dict[str, str] | None:
    """tests/containers/test_image.py's base image and wheels (root with podman only)."""
    from tests.containers.podman import build_images

    if os.geteuid() != 0 or not shutil.which("podman"):
        return None
    return build_images()


def all_venvs() -> list[object]:
    """Every release venv of the suite, the groups side by side (pip waits on the network)."""
    groups = (release_venvs, hook_venvs, tf_hook_venvs, diffusers_venv, clean_release_venvs)
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        return [f.result() for f in [pool.submit(g) for g in groups]]


STEPS: dict[str, Callable[[], object]] = {
    "examples": examples,
    "venvs": all_venvs,
    "conformance": lambda: [conformance(v) for v in SUITE_RELEASES],
    "systemd-wheels": systemd_wheels,
    "image": images,
}


def _run(name: str) -> tuple[str, float, str | None]:
    started = time.monotonic()
    try:
        STEPS[name]()
    except Exception:  # reported with its step's name; the other steps go on
        return name, time.monotonic() - started, traceback.format_exc()
    return name, time.monotonic() - started, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("steps", nargs="*", help=f"some of {', '.join(STEPS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="name the steps and exit")
    parser.add_argument(
        "--cache-dir",
        metavar="KIND",
        help="print the cache's folder for KIND (made if missing) and exit: `make test` keeps "
        "mypy's incremental cache in `--cache-dir mypy`",
    )
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(STEPS))
        return 0
    if args.cache_dir:
        if not args.cache_dir.replace("-", "").isalnum():
            parser.error(f"--cache-dir {args.cache_dir!r}: a kind is one name (venvs, mypy, ...)")
        print(cache_dir(args.cache_dir))
        return 0
    unknown = [s for s in args.steps if s not in STEPS]
    if unknown:
        parser.error(f"no step {', '.join(unknown)}: the steps are {', '.join(STEPS)}")
    steps = args.steps or list(STEPS)
    print(f"test-deps: {', '.join(steps)} into {cache_root()}", flush=True)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(steps)) as pool:
        results = list(pool.map(_run, steps))
    failed = 0
    for name, seconds, error in results:
        print(f"test-deps: {name}: {'FAILED' if error else 'ok'} in {seconds:.1f} s", flush=True)
        if error:
            failed += 1
            print(error, file=sys.stderr)
    print(f"test-deps: done in {time.monotonic() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
