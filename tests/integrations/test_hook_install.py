"""The hook's own promises: the `.pth` file is installed with the package; off (unset or "0")
it imports nothing; on, it waits for `import kernels` and then patches it; an unknown `kernels`
gets one warning and no patch; a broken hook never stops the interpreter; `install()` and
`uninstall()` are idempotent and give `kernels` its functions back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kerneld_client.integrations import kernels as hook
from tests.integrations.support import ROOT, count_warnings

PTH = "kerneld_client_hook.pth"
PROBE = """
import json, sys
print(json.dumps({
    "kerneld": sorted(m for m in sys.modules if m.startswith("kerneld_client")),
    "finders": [type(f).__name__ for f in sys.meta_path],
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in
                    ("kernels", "torch", "grpc", "huggingface_hub", "kerneld")),
}))
"""


def python(code: str, env_extra: dict[str, str] | None = None, **kw: Any) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELD_", "PYTHON"))}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=kw.get("cwd", ROOT),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def probe(env_extra: dict[str, str] | None = None, code: str = "") -> dict[str, Any]:
    out = python(code + PROBE, env_extra)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    result["stderr"] = out.stderr
    return result


def test_the_pth_file_is_installed_in_site_packages() -> None:
    """`pip install` (editable or not) puts it where the interpreter reads it at start."""
    installed = Path(sysconfig.get_paths()["purelib"]) / PTH
    assert installed.is_file(), "reinstall the package: pip install -e '.[dev]'"
    assert installed.read_text() == (ROOT / "client" / PTH).read_text()


@pytest.mark.parametrize("value", [None, "0", "off", ""])
def test_off_imports_nothing(value: str | None) -> None:
    out = probe(None if value is None else {"KERNELD_HOOK_KERNELS": value})
    assert out["kerneld"] == [] and "KernelsFinder" not in out["finders"]
    assert out["stderr"] == ""


def test_on_waits_for_kernels_then_patches_it() -> None:
    out = probe({"KERNELD_HOOK_KERNELS": "1"})
    assert "kerneld_client.integrations._autohook" in out["kerneld"]
    assert out["finders"][0] == "KernelsFinder"
    assert out["heavy"] == []  # neither kernels nor torch until the program imports them
    code = """
    import kernels
    import kernels.layer.layer as layer
    from kerneld_client.integrations import kernels as hook
    assert hook.installed()
    assert getattr(kernels.load.get_kernel_with_resolver, "_kerneld_hook", False)
    assert getattr(layer.select_revision_or_version, "_kerneld_hook", False)
    """
    after = probe({"KERNELD_HOOK_KERNELS": "1"}, textwrap.dedent(code))
    assert "KernelsFinder" not in after["finders"]  # done: out of the import path
    assert after["stderr"] == ""


def test_install_before_kernels_is_imported_with_the_hook_on() -> None:
    """install() imports `kernels`, which runs the start-up hook's install() inside it: one
    hook, and uninstall() still finds kernels' own functions to give back."""
    code = """
    import json
    from kerneld_client.integrations import kernels as hook
    assert hook.install() is True
    import kernels
    wrapped = kernels.load.get_kernel_with_resolver
    hook.uninstall()
    print(json.dumps({
        "wrapped": getattr(wrapped, "_kerneld_hook", False),
        "restored": not getattr(kernels.load.get_kernel_with_resolver, "_kerneld_hook", False),
    }))
    """
    out = python(code, {"KERNELD_HOOK_KERNELS": "1"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"wrapped": True, "restored": True}


@pytest.fixture
def fake_kernels(tmp_path: Path) -> Iterator[Path]:
    """A directory to put first on PYTHONPATH with a `kernels` package of our making."""
    (tmp_path / "kernels").mkdir()
    yield tmp_path


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ('__version__ = "0.16.0"\n', "kernels 0.16.0 is not a version the kerneld hook knows"),
        ('__version__ = "0.18.1"\n', "kernels 0.18.1 is not a version the kerneld hook knows"),
        ('__version__ = "0.17.2"\n', "kernels 0.17.2 does not look as the kerneld hook expects"),
    ],
)
def test_an_unknown_kernels_gets_one_warning_and_no_hook(
    fake_kernels: Path, source: str, says: str
) -> None:
    (fake_kernels / "kernels" / "__init__.py").write_text(source)
    code = """
    import json, kernels
    from kerneld_client.integrations import kernels as hook
    print(json.dumps({"installed": hook.installed(), "again": hook.install()}))
    """
    out = python(code, {"KERNELD_HOOK_KERNELS": "1", "PYTHONPATH": str(fake_kernels)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"installed": False, "again": False}
    assert count_warnings(out.stderr, "KerneldHookWarning") == 1, out.stderr
    assert says in out.stderr


def test_a_broken_hook_never_stops_the_interpreter(tmp_path: Path) -> None:
    """Even a kerneld_client that cannot be imported costs one warning, not the process."""
    broken = tmp_path / "kerneld_client"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    out = python("print('alive')", {"KERNELD_HOOK_KERNELS": "1", "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0 and out.stdout == "alive\n", out.stderr
    assert count_warnings(out.stderr, "RuntimeWarning") == 1, out.stderr
    assert "the kernels hook could not start" in out.stderr and "broken install" in out.stderr


@pytest.fixture
def kernels_mod() -> Iterator[Any]:
    """The real `kernels`, given back unhooked whatever the test did."""
    import kernels

    yield kernels
    hook.uninstall()


def test_install_and_uninstall_in_process(kernels_mod: Any) -> None:
    import kernels.layer.func as func
    import kernels.layer.layer as layer

    originals = (
        kernels_mod.load.get_kernel_with_resolver,
        layer.select_revision_or_version,
        kernels_mod.has_kernel,
    )
    assert hook.install() is True and hook.installed()
    assert hook.install() is True  # idempotent: wrapped once
    wrapped = kernels_mod.load.get_kernel_with_resolver
    assert wrapped is not originals[0] and getattr(wrapped, "_kerneld_hook", False)
    assert getattr(layer.get_kernel_with_resolver, "_kerneld_hook", False)
    assert getattr(func.select_revision_or_version, "_kerneld_hook", False)
    assert kernels_mod.load.has_kernel is kernels_mod.has_kernel
    hook.uninstall()
    hook.uninstall()
    assert not hook.installed()
    restored = (
        kernels_mod.load.get_kernel_with_resolver,
        layer.select_revision_or_version,
        kernels_mod.has_kernel,
    )
    assert restored == originals


def test_unrecognised_version_in_process(kernels_mod: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels_mod, "__version__", "0.19.0")
    monkeypatch.setattr(hook, "_refused", False)
    original = kernels_mod.load.get_kernel_with_resolver
    with pytest.warns(hook.KerneldHookWarning, match=r"kernels 0\.19\.0 .*>=0\.17\.2,<0\.18"):
        assert hook.install() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hook.install() is False  # said once is enough
    assert not hook.installed()
    assert kernels_mod.load.get_kernel_with_resolver is original


@pytest.mark.parametrize(
    ("version", "known"),
    [
        ("0.17.2", True),
        ("0.17.9", True),
        ("0.17.2.dev0", True),
        ("0.17.1", False),
        ("0.18.0", False),
        ("1.0.0", False),
        ("garbage", False),
    ],
)
def test_recognised_versions(version: str, known: bool) -> None:
    assert hook.recognised(version) is known
