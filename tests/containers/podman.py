"""podman for the image recipe's test, set up for this machine, and the recipe's build of both
images into the suite's cache outside the clone (issue 55: `make test-deps` pays for the base
and the wheels once per machine; tests/support/testcache.py).

The cache: $KERNELD_IMAGE_CACHE, else `<suite cache>/image`. The podman environment (an image
store of the test's own and a containers.conf) is written there only when asked for, never at
collection.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.testcache import cache_dir, locked

REPO = Path(__file__).resolve().parents[2]
#: The environment podman runs with in the test (filled by `podman_env()`).
ENV: dict[str, str] = {}


def image_cache() -> Path:
    """The base's root file system, the wheels and the image store: kept between runs."""
    configured = os.environ.get("KERNELD_IMAGE_CACHE")
    return Path(configured) if configured else cache_dir("image")


def podman_env() -> dict[str, str]:
    """The test's own image store in the cache (kept between runs) and a containers.conf."""
    conf = image_cache() / "containers"
    conf.mkdir(parents=True, exist_ok=True)
    fs = Path("/proc/filesystems").read_text()
    driver = "overlay" if re.search(r"\soverlay$", fs, re.MULTILINE) else "vfs"
    (conf / "storage.conf").write_text(
        f'[storage]\ndriver = "{driver}"\ngraphroot = "{conf / "storage"}"\n'
        f'runroot = "{conf / "run"}"\n'
    )
    # crun does not run under hybrid cgroups (v1 controllers with a v2 mount); runc does.
    pure_v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    runtime = "crun" if pure_v2 and shutil.which("crun") else "runc"
    nofile = min(int(subprocess.check_output(["sh", "-c", "ulimit -Hn"]).strip()), 65536)
    (conf / "containers.conf").write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=4096:4096"]\n'
        f'[engine]\nruntime = "{runtime}"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
    )
    ENV.update(
        {
            **os.environ,
            "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"),
            "CONTAINERS_CONF": str(conf / "containers.conf"),
        }
    )
    return ENV


def build_images() -> dict[str, str]:
    """Both images, built by deploy/image/build.py as a site would run it (one build at a time
    per cache: a second clone waits); image kind -> name."""
    assert shutil.which("podman"), "podman is missing: run scripts/bootstrap"
    cache = image_cache()
    with locked(cache / "build"):
        env = podman_env()
        t0 = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(REPO / "deploy" / "image" / "build.py"),
             "--python", sys.executable, "--cache", str(cache)],
            env=env, capture_output=True, text=True, timeout=840, check=False,
        )  # fmt: skip
    assert done.returncode == 0, f"deploy/image/build.py failed:\n{done.stdout}\n{done.stderr}"
    built: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"images built in {time.monotonic() - t0:.1f}s: {built}")
    return built
