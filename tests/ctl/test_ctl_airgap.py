"""The air-gapped round trip with real compiled kernels, through the real CLI.

Connected side: a store filled from the Hub test server by the daemon's own `Resolver`, exported
as a signed tar. Air-gapped side: the Hub unreachable, a fresh store, `mirror import` checking the
signature; the published trees must be byte-identical, and `kerneld_client` (no daemon, no
network) must load the kernel from there and run its ops.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneld.pipeline.resolve import KernelSpec, Resolver
from kerneld.store import Store
from kerneld.upstream.hub import HubUpstream
from kerneld_client.platform import detect_platform_facts
from tests.support.ctl import ctl_env, run_ctl, run_ctl_tty, tree_bytes
from tests.support.hubserver import HubServer

ACTIVATION = "kerneld-examples/activation"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def example_server(example_hub_root: Path) -> Iterator[HubServer]:
    with HubServer(example_hub_root, trusted_orgs={"kerneld-examples": True}) as server:
        yield server


@pytest.fixture(scope="module")
def connected_store(
    tmp_path_factory: pytest.TempPathFactory, example_server: HubServer
) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("connected") / "store"
    facts = detect_platform_facts(probe_devices=False)
    with Store.open(root) as store:
        resolver = Resolver(store, [HubUpstream(endpoint=example_server.url, token=False)])
        spec = KernelSpec(ACTIVATION, version=1)
        commit = resolver.resolve(spec, facts).commit
        for name in resolver.variant_names(ACTIVATION, commit):
            resolver.resolve(spec, facts, variant=name)
    return root, commit


def test_signed_air_gapped_round_trip(
    tmp_path: Path, connected_store: tuple[Path, str], example_server: HubServer
) -> None:
    source, commit = connected_store
    home = tmp_path / "home"
    keys = str(tmp_path / "keys")
    key = run_ctl("key", "generate", "site-1", "--key-dir", keys, "--json", home=home).json()
    bundle = tmp_path / "usb" / "kernels.tar"
    exported = run_ctl_tty(  # as an admin at a terminal sees it
        "mirror",
        "export",
        "--store",
        str(source),
        "--to",
        str(bundle),
        f"{ACTIVATION}:1",
        "--sign-key",
        "site-1",
        "--key-dir",
        keys,
        home=home,
    )
    assert exported.rc == 0, exported.stdout
    text = ANSI.sub("", exported.stdout)
    assert "━" in text and "blobs" in text  # the progress bar
    assert f"exported {ACTIVATION}@{commit[:7]}" in text

    # the other side of the air gap: no Hub, a brand-new store
    offline = {"HF_ENDPOINT": UNREACHABLE, "HF_HUB_OFFLINE": "1"}
    dest = tmp_path / "airgapped" / "store"
    imported = run_ctl(
        "mirror",
        "import",
        "--store",
        str(dest),
        "--from",
        str(bundle),
        "--trust",
        f"site-1={key['public_key']}",
        "--json",
        home=home,
        env=offline,
    )
    assert imported.rc == 0, imported.stderr
    report = imported.json()
    assert report["ok"] and report["signed_by"] == ["site-1"]
    assert f"{ACTIVATION}@v1 -> {commit}" in report["refs_set"]

    with Store.open(source, read_only=True) as a, Store.open(dest, read_only=True) as b:
        names = a.catalog.variants(ACTIVATION, commit)
        assert names and b.catalog.variants(ACTIVATION, commit) == names
        for name in names:
            ta, tb = (
                a.catalog.lookup(ACTIVATION, commit, name),
                b.catalog.lookup(ACTIVATION, commit, name),
            )
            assert ta is not None and tb is not None
            assert ta.digest == tb.digest
            assert tree_bytes(ta.path) == tree_bytes(tb.path)

    # kerneld_client on the air-gapped host: no daemon, no network, just the imported store
    code = textwrap.dedent(
        """
        import json, torch, kerneld_client
        mod = kerneld_client.get_kernel("kerneld-examples/activation", version=1, policy="error")
        x = torch.randn(4, 16)
        a, b = x[:, :8], x[:, 8:]
        torch.testing.assert_close(mod.silu_and_mul_alloc(x), torch.nn.functional.silu(a) * b)
        info = kerneld_client.loaded_kernels()[0]
        print(json.dumps({"file": mod.__file__, "variant": info.variant}))
        """
    )
    env = ctl_env(
        home,
        {
            **offline,
            "KERNELD_STORE": str(dest),
            "KERNELD_SOCKET": str(tmp_path / "no-daemon.sock"),
            "PYTHONDONTWRITEBYTECODE": "1",
        },
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().is_relative_to(dest.resolve())
