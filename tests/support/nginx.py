"""A real nginx on 127.0.0.1: serving a directory (HTTP mirror tests), or with server blocks of
its own (the site cache of deploy/site-cache/)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

NGINX_CONF = """
worker_processes 1;
daemon off;
# One process: workers would drop to `nobody` and could not read a root-owned temp dir.
master_process off;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {run}/access.log;
    client_body_temp_path {run}/body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    types {{ application/json json; }}
    default_type application/octet-stream;
    # As the distribution's nginx.conf has it (the site-cache template goes in its conf.d/).
    sendfile on;
    {servers}
}}
"""

STATIC_SERVER = """
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ try_files $uri =404; }}
    }}
"""


SITE_CACHE_TEMPLATE = (
    Path(__file__).resolve().parents[2]
    / "deploy"
    / "site-cache"
    / "kerneld-site-cache.conf.template"
)


def site_cache(
    hub_url: str, workdir: Path, *, moving_ttl: str = "30s", cache_max: str = "1g"
) -> Nginx:
    """nginx running the shipped site-cache template in front of the Hub at `hub_url`.

    Filled in as envsubst with the variable list fills it (the nginx image's templates): nginx's
    own $variables stay, and a ${KERNELD_SITE_...} this function does not know fails."""
    values = {
        "KERNELD_SITE_LISTEN": "127.0.0.1:{port}",
        "KERNELD_SITE_CACHE_DIR": str(workdir / "cache"),
        "KERNELD_SITE_CACHE_MAX": cache_max,
        "KERNELD_SITE_HUB": hub_url.rstrip("/"),
        "KERNELD_SITE_HUB_HOST": hub_url.split("://", 1)[1].rstrip("/"),
        "KERNELD_SITE_MOVING_TTL": moving_ttl,
        "KERNELD_SITE_RESOLVER": "127.0.0.1",
    }
    conf = re.sub(
        r"\$\{(KERNELD_SITE_[A-Z_]+)\}",
        lambda m: values[m.group(1)],
        SITE_CACHE_TEMPLATE.read_text(),
    )
    return Nginx(None, workdir, servers=conf)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nginx:
    """nginx in the foreground on a free loopback port; stop() ends it."""

    def __init__(self, root: Path | None, workdir: Path, servers: str | None = None) -> None:
        """Serve `root`, or run `servers` (http-context text, `{port}` its listen port)."""
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (scripts/bootstrap installs nginx-light)")
        self.root = root
        self.run_dir = workdir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        conf = self.run_dir / "nginx.conf"
        body = (
            servers.replace("{port}", str(self.port))
            if servers is not None
            else STATIC_SERVER.format(port=self.port, root=root)
        )
        conf.write_text(NGINX_CONF.format(run=self.run_dir, servers=body))
        self.proc = subprocess.Popen(
            [binary, "-c", str(conf), "-p", str(self.run_dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.url = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited: {err}")
            try:
                urllib.request.urlopen(self.url, timeout=1).close()
            except urllib.error.HTTPError:
                return  # it answers (404 for the bare root is fine)
            except OSError:
                time.sleep(0.02)
            else:
                return
        self.stop()
        raise RuntimeError("nginx did not start within 10 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
