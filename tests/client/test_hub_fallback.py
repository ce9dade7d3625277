"""The `hub` fallback against the Hub test server: verified in-process download, cache reuse,
corruption caught, publisher trust, and nothing of it without `KERNELD_FALLBACK=hub`."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.kernels.built import BuiltExamples
from examples.kernels.specs import ORG
from tests.client.support import OPS_CHECK, client_env, run_client
from tests.support.hubserver import HubServer
from tests.support.hubtraffic import Fault

SCRIPT = (
    "import json, sys, warnings\n"
    + OPS_CHECK
    + """
import kerneld_client
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = kerneld_client.get_kernel("kerneld-examples/activation", fallback="torch", **KW)
    again = kerneld_client.get_kernel("kerneld-examples/activation", fallback="torch", **KW)
out = {"warnings": [str(w.message) for w in caught], "same": got is again}
if got == "torch":
    out["result"] = "torch"
else:
    info = kerneld_client.loaded_kernels()[0]
    out.update(result=check_activation(got, 1), source=info.source, path=str(info.path),
               variant=info.variant, commit=info.commit)
print(json.dumps(out))
"""
)


@pytest.fixture
def server(example_server: HubServer) -> Iterator[HubServer]:
    example_server.reset()
    example_server.set_trusted(ORG, True)
    yield example_server
    example_server.reset()
    example_server.set_trusted(ORG, True)


def _env(tmp_path: Path, server: HubServer, **extra: str) -> dict[str, str]:
    return client_env(
        tmp_path / "no-store",
        tmp_path,
        KERNELD_FALLBACK="hub",
        KERNELD_HUB_CACHE=str(tmp_path / "hub-cache"),
        HF_ENDPOINT=server.url,
        HF_HOME=str(tmp_path / "hf-home"),
        **extra,
    )


def _run(env: dict[str, str], **kw: object) -> dict:
    return run_client(SCRIPT.replace("**KW", f"**{kw!r}"), env)


def test_hub_fallback_downloads_verifies_and_loads(
    server: HubServer, built_examples: BuiltExamples, tmp_path: Path
) -> None:
    out = _run(_env(tmp_path, server), version=1)
    assert out["result"] == ["silu_and_mul", "gelu_tanh_and_mul", "rms_norm"]
    assert out["source"] == "hub" and out["same"] is True
    assert out["variant"] == built_examples.arch_variant
    assert len(out["warnings"]) == 1 and "directly from the Hub" in out["warnings"][0]
    tree = Path(out["path"])
    assert tree.is_relative_to((tmp_path / "hub-cache").resolve())
    # Exactly the variant's files, read-only; nothing else was downloaded.
    expected = sorted(built_examples.variant("activation", 1).files)
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()) == expected
    assert all(not (p.stat().st_mode & (stat.S_IWUSR | 0o022)) for p in tree.rglob("*"))
    gets = [r.path for r in server.requests if r.kind == "resolve_get"]
    assert len(gets) == len(expected)
    assert all(f"/build/{out['variant']}/" in g for g in gets)
    assert server.counts["org_overview"] == 1

    # A later process with the commit needs no network at all.
    server.reset_counts()
    again = _run(_env(tmp_path, server), revision=out["commit"])
    assert again["result"] == out["result"] and again["path"] == out["path"]
    assert server.total() == 0


def test_corrupted_download_is_caught_and_not_kept(server: HubServer, tmp_path: Path) -> None:
    fault = server.inject(Fault("*.so", "corrupt", method="GET"))
    out = _run(_env(tmp_path, server), version=1)
    assert fault.fired >= 1
    assert out["result"] == "torch"
    assert "does not match" in out["warnings"][0]
    cache = tmp_path / "hub-cache"
    leftovers = [p for p in cache.rglob("*") if p.is_dir() and p.name.startswith("torch")]
    assert leftovers == [], "a variant that failed verification was kept"


def test_untrusted_publisher_needs_trust_remote_code(server: HubServer, tmp_path: Path) -> None:
    server.set_trusted(ORG, False)
    refused = _run(_env(tmp_path, server), version=1)
    assert refused["result"] == "torch"
    assert "not a trusted kernel publisher" in refused["warnings"][0]
    assert server.counts["resolve_get"] == 0
    allowed = _run(_env(tmp_path, server), version=1, trust_remote_code=True)
    assert allowed["source"] == "hub"


def test_default_policy_never_touches_the_hub(server: HubServer, tmp_path: Path) -> None:
    env = _env(tmp_path, server)
    env.pop("KERNELD_FALLBACK")
    out = _run(env, version=1)
    assert out["result"] == "torch"
    assert server.total() == 0
    assert not (tmp_path / "hub-cache").exists()


def test_hub_fallback_reports_missing_versions(server: HubServer, tmp_path: Path) -> None:
    out = _run(_env(tmp_path, server), version=7)
    assert out["result"] == "torch"
    assert "Version 7 not found" in out["warnings"][0]
