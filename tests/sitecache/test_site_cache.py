"""The site cache of deploy/site-cache/ (real nginx, the shipped template filled in): H hosts'
daemons cold-start through it and the Hub sees no more requests than for one host; after the
cache is warm, a host still cold-starts while the Hub is down; answers that move are asked
again once their TTL is up, so a moved ref still reaches the daemons.

Each "host" is a real daemon with its own store and sockets, on the Hub test server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon.rpc import TIMEOUT, resolve_req
from tests.fixtures_hub import REPO
from tests.support.cdn import Cdn
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault
from tests.support.nginx import Nginx, nginx_binary
from tests.support.nginx import site_cache as nginx_site_cache
from tests.support.olah import run_olah

KERNELS = ((REPO, 1), (REPO, 2))  # two builds: two commits, their trees and files

needs_nginx = pytest.mark.skipif(nginx_binary() is None, reason="needs nginx (scripts/bootstrap)")


def site_cache(hub: HubServer, workdir: Path, moving_ttl: str = "30s") -> Nginx:
    """nginx running the shipped template, in front of the Hub test server."""
    return nginx_site_cache(hub.url, workdir, moving_ttl=moving_ttl)


@pytest.fixture
def hosts(
    make_daemon: Callable[..., DaemonProcess],
) -> Iterator[Callable[..., list[DaemonProcess]]]:
    count = 0

    def start(n: int, endpoint: str) -> list[DaemonProcess]:
        nonlocal count
        out = []
        for _ in range(n):
            count += 1
            # olah answers slowly on a busy machine (it asks the Hub before it serves): the
            # default 10 s per fetch failed a run that shared two cores with five other workers.
            config = {"fetch": {"timeout": "30s"}}
            out.append(make_daemon(f"host-{count}", hub_endpoint=endpoint, config=config))
        return out

    yield start


def cold_start(daemons: list[DaemonProcess]) -> None:
    """Every host resolves every kernel at once, as a job start does."""
    errors: list[BaseException] = []

    def one(d: DaemonProcess) -> None:
        try:
            with d.kernels() as kernels:
                for repo, version in KERNELS:
                    req = resolve_req(repo, version)
                    assert kernels.Resolve(req, timeout=TIMEOUT).kernel.path
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(d,)) for d in daemons]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@needs_nginx
def test_hub_requests_do_not_grow_with_hosts(
    hub_server: HubServer, hosts: Callable[..., list[DaemonProcess]], tmp_path: Path
) -> None:
    counts = {}
    for n in (1, 4):
        hub_server.reset_counts()
        with site_cache(hub_server, tmp_path / f"cache-{n}") as cache:
            cold_start(hosts(n, cache.url))
        counts[n] = hub_server.total()
    hub_server.reset_counts()
    cold_start(hosts(4, hub_server.url))  # the same 4 hosts without the cache
    direct = hub_server.total()
    assert counts[1] > 0
    assert counts[4] <= counts[1], (counts, hub_server.requests)
    assert direct >= 3 * counts[1], (direct, counts)


@needs_nginx
def test_a_warm_cache_serves_a_cold_host_while_the_hub_is_down(
    hub_server: HubServer, hosts: Callable[..., list[DaemonProcess]], tmp_path: Path
) -> None:
    with site_cache(hub_server, tmp_path / "cache", moving_ttl="1s") as cache:
        cold_start(hosts(1, cache.url))
        time.sleep(1.5)  # the answers that move are past their TTL: they would be asked again
        hub_server.inject(Fault("*", "error", status=503))
        hub_server.reset_counts()
        cold_start(hosts(2, cache.url))
        assert hub_server.total() >= 1  # it tried the Hub, which failed, and served stale


@needs_nginx
def test_cdn_redirects_are_followed_without_the_token_and_cached_once(
    make_daemon: Callable[..., DaemonProcess],
    hub_server: HubServer,
    hosts: Callable[..., list[DaemonProcess]],
    tmp_path: Path,
) -> None:
    """As on the real Hub, LFS files redirect to a CDN on another origin: a daemon follows the
    redirect and sends its Hub token to the Hub only; behind the site cache, each file is
    fetched from the CDN once for all hosts."""
    token = tmp_path / "token"
    token.write_text("hf_sitecachetoken\n")
    token.chmod(0o644)
    with Cdn() as cdn:
        hub_server.cdn = cdn
        d = make_daemon(
            "with-token",
            upstreams=[
                {"kind": "hub", "name": "hub", "endpoint": hub_server.url, "token_file": str(token)}
            ],
        )
        cold_start([d])
        assert cdn.gets(), "no file came from the CDN"
        assert not [r for r in cdn.requests if "authorization" in {k.lower() for k in r.headers}]
        assert any("hf_sitecachetoken" in r.authorization for r in hub_server.requests)
        direct = len(cdn.gets())

        with site_cache(hub_server, tmp_path / "cache") as cache:
            before = len(cdn.gets())
            cold_start(hosts(4, cache.url))
            assert len(cdn.gets()) - before == direct  # each file once, for four hosts


@pytest.mark.slow
@pytest.mark.olah
def test_olah_as_a_pull_through_mirror(
    hub_server: HubServer, hosts: Callable[..., list[DaemonProcess]], tmp_path: Path
) -> None:
    """olah online in front of the Hub (it probes repos with HEAD on API routes, which the Hub,
    and so the test server, answer): hosts cold-start through it, and a second wave of hosts
    costs the Hub less than going direct would."""
    hub_server.reset_counts()
    cold_start(hosts(1, hub_server.url))
    direct_one = hub_server.total()
    work = tmp_path / "olah"
    work.mkdir()
    with run_olah(work, probe_repo=REPO, upstream=hub_server.url) as olah:
        hub_server.reset_counts()
        cold_start(hosts(1, olah.url))
        first = hub_server.total()
        hub_server.reset_counts()
        cold_start(hosts(4, olah.url))
        assert hub_server.total() < 4 * direct_one, (first, hub_server.total(), direct_one)
