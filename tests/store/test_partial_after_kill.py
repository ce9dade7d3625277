"""A daemon killed between a blob's commit making its partial file read-only and moving it
into `blobs/` leaves a 0444 partial; the next run (not root, as deployed) must still ingest
that blob. Run as the test daemon's unprivileged user: root would open the file regardless."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.daemon import account, daemon_dir, default_user

ROOT = Path(__file__).resolve().parents[2]

CODE = textwrap.dedent(
    """
    import hashlib, os, sys
    from pathlib import Path
    from kerneld.store import Store
    from kerneld.store.layout import Layout
    root = Path(sys.argv[1])
    data = bytes(range(256)) * 40
    sha = hashlib.sha256(data).hexdigest()
    Store.open(root).close()
    part = Layout(root).partial_path("sha256", sha)
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(data[:4000])
    os.chmod(part, 0o444)  # what BlobWriter.commit leaves when killed before the rename
    with Store.open(root) as store:
        info = store.blobs.ingest(data, size=len(data), sha256=sha)
        assert info.sha256 == sha and store.blobs.has_blob(sha)
        assert store.blobs.open_blob(sha).read() == data
    print("ok")
    """
)


def test_a_read_only_partial_left_by_a_kill_is_resumed_by_an_unprivileged_daemon() -> None:
    work = daemon_dir("kd-partial-")
    try:
        user = default_user()
        kw: dict[str, int] = {}
        if user is not None:  # as root: run as the daemon's user, as the service does
            pw = account(user)
            kw = {"user": pw.pw_uid, "group": pw.pw_gid}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")])}
        proc = subprocess.run(
            [sys.executable, "-c", CODE, str(work / "store")],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **kw,  # type: ignore[arg-type]
        )
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
