"""Helpers for kerneldctl tests: run the real CLI (with or without a terminal), fill stores.

`run_ctl` runs the installed `kerneldctl` console script of this venv in a subprocess with an
isolated HOME/XDG environment (so a developer's own daemon, store or keys are never touched).
`run_ctl_tty` does the same with stdout and stderr on a pseudo-terminal, the way a person at a
terminal sees the progress bars.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneld.store import Store, TreeFile

KERNELDCTL = str(Path(sys.executable).with_name("kerneldctl"))


def ctl_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment with a private HOME, no daemon sockets and no inherited kerneld/HF vars."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KERNELD_", "HF_", "XDG_")) and k not in ("LOCAL_KERNELS",)
    }
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "HOME": str(home),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "HF_HOME": str(home / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "0",
            "COLUMNS": "120",
        }
    )
    env.update(extra or {})
    return env


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_ctl(
    *args: str,
    home: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> Result:
    proc = subprocess.run(
        [KERNELDCTL, *args],
        capture_output=True,
        text=True,
        env=ctl_env(home, env),
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def run_ctl_tty(
    *args: str, home: Path, env: Mapping[str, str] | None = None, timeout: float = 60
) -> Result:
    """Run with stdout and stderr on a pty (a terminal); returns everything written to it."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [KERNELDCTL, *args],
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env={**ctl_env(home, env), "TERM": "xterm-256color"},
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"kerneldctl {' '.join(args)} did not finish")
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            # drain what is left
            try:
                while data := os.read(master, 65536):
                    chunks.append(data)
            except OSError:
                pass
            break
    os.close(master)
    rc = proc.wait(timeout=10)
    return Result(rc, b"".join(chunks).decode("utf-8", "replace"), "")


# ---- stores -----------------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def variant_files(
    ident: str, extra: Mapping[str, bytes] | None = None, **metadata: object
) -> dict[str, bytes]:
    """A small variant with a metadata.json whose digest covers every other file (`metadata`:
    more metadata.json keys)."""
    files = {"__init__.py": f"NAME = {ident!r}\n".encode(), **(extra or {})}
    digest = {p: base64.b64encode(hashlib.sha256(d).digest()).decode() for p, d in files.items()}
    meta = {
        "id": ident,
        "name": "k",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": digest},
        **metadata,
    }
    files["metadata.json"] = json.dumps(meta, sort_keys=True).encode()
    return files


def publish(
    store: Store,
    repo: str,
    commit: str,
    variant: str,
    files: Mapping[str, bytes],
    *,
    refs: tuple[str, ...] = (),
    lfs: tuple[str, ...] = (),
    executable: tuple[str, ...] = (),
) -> str:
    """Ingest and publish one variant; upstream ids as the Hub gives them (LFS: sha256)."""
    tree_files = []
    for path, data in files.items():
        info = store.blobs.ingest(data, size=len(data), sha256=sha256(data))
        tree_files.append(
            TreeFile(
                path,
                info.sha256,
                len(data),
                mode=0o100755 if path in executable else 0o100644,
                upstream_id=sha256(data) if path in lfs else git_sha1(data),
            )
        )
    tree = store.trees.publish_tree(repo, commit, variant, tree_files)
    for ref in refs:
        store.names.set_ref(repo, ref, commit)
    return tree.digest


def tree_bytes(path: Path) -> dict[str, bytes]:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }
