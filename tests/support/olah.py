"""olah, a real third-party self-hosted Hub mirror, on 127.0.0.1: offline over local git repos
(the cross-check of our Hub test server), or online as a pull-through mirror of a Hub."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


@dataclass
class Olah:
    url: str
    ready_seconds: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str, probe: str) -> bool:
    parsed = urlsplit(url)
    try:
        conn = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=2)
        conn.request("GET", probe)
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


@contextlib.contextmanager
def run_olah(
    work: Path, *, probe_repo: str, mirrors: Path | None = None, upstream: str | None = None
) -> Iterator[Olah]:
    """Offline over the git repos under `mirrors`, or online in front of the Hub at `upstream`
    (http://host:port); ready once `probe_repo`'s refs answer."""
    port = _free_port()
    lines = ["[basic]", 'host = "127.0.0.1"', f"port = {port}"]
    lines += [f'mirror-netloc = "127.0.0.1:{port}"', f'mirror-lfs-netloc = "127.0.0.1:{port}"']
    lines.append(f"repos-path = {json.dumps(str(work / 'repos'))}")
    if mirrors is not None:
        lines.append(f"mirrors-path = [{json.dumps(str(mirrors))}]")
    if upstream is not None:
        scheme, netloc = upstream.rstrip("/").split("://", 1)
        lines += ['mirror-scheme = "http"', f'hf-scheme = "{scheme}"']
        lines += [f'hf-netloc = "{netloc}"', f'hf-lfs-netloc = "{netloc}"']
    lines += ["", "[accessibility]", f"offline = {'true' if upstream is None else 'false'}", ""]
    config = work / "olah.toml"
    config.write_text("\n".join(lines))
    log = (work / "olah.out").open("wb")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "olah.server", "-c", str(config), "--log-path", str(work / "logs")],
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _ready(url, f"/api/kernels/{probe_repo}/refs"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"olah did not start: {(work / 'olah.out').read_text()[-2000:]}")
            time.sleep(0.02)
        yield Olah(url=url, ready_seconds=time.perf_counter() - t0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
