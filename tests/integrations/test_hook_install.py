"""The hook's own promises: the `.pth` file is installed with the package; off (unset or "0")
it imports nothing; on, it waits for `import kernels` and then binds its public names to
kerneld_client's, touching none of `kernels`' private modules; the `kernels` command line stays
`kernels`'; a release it cannot serve gets one warning that says what the job gets instead, and
no hook; a broken hook never stops the interpreter; `install()` and `uninstall()` are idempotent
and give `kernels` its names back."""

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


def test_on_waits_for_kernels_then_binds_its_public_names() -> None:
    out = probe({"KERNELD_HOOK_KERNELS": "1"})
    assert "kerneld_client.integrations._autohook" in out["kerneld"]
    assert out["finders"][0] == "KernelsFinder"
    assert out["heavy"] == []  # neither kernels nor torch until the program imports them
    code = """
    import kernels
    from kernels import kernelize, get_kernel  # as Transformers imports them
    import kerneld_client
    from kerneld_client.integrations import kernels as hook
    assert hook.installed()
    assert get_kernel is kerneld_client.get_kernel and kernelize is kerneld_client.kernelize
    names = [n for n in kernels.__all__ if n != "__version__"]
    assert all(getattr(kernels, n) is getattr(kerneld_client, n) for n in names)
    """
    after = probe({"KERNELD_HOOK_KERNELS": "1"}, textwrap.dedent(code))
    assert "KernelsFinder" not in after["finders"]  # done: out of the import path
    assert after["stderr"] == ""


def test_install_before_kernels_is_imported_with_the_hook_on() -> None:
    """install() imports `kernels`, which runs the start-up hook's install() inside it: one
    hook, and uninstall() still gives `kernels` its own functions back."""
    code = """
    import json
    from kerneld_client.integrations import kernels as hook
    assert hook.install() is True
    import kernels
    import kerneld_client
    bound = kernels.get_kernel is kerneld_client.get_kernel
    hook.uninstall()
    print(json.dumps({"bound": bound, "restored": kernels.get_kernel.__module__}))
    """
    out = python(code, {"KERNELD_HOOK_KERNELS": "1"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"bound": True, "restored": "kernels.load"}


def test_the_kernels_command_line_stays_kernels_own(tmp_path: Path) -> None:
    """A program named `kernels` (the console script of the `kernels` CLI) is not hooked."""
    script = tmp_path / "kernels"
    script.write_text("import kernels\nprint(kernels.get_kernel.__module__)\n")
    out = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "KERNELD_HOOK_KERNELS": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "kernels.load"
    assert "Warning" not in out.stderr


@pytest.fixture
def fake_kernels(tmp_path: Path) -> Iterator[Path]:
    """A directory to put first on PYTHONPATH with a `kernels` package of our making."""
    (tmp_path / "kernels").mkdir()
    yield tmp_path


NEWER = '__version__ = "0.20.0"\ndef get_kernel(): pass\n'


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ('__version__ = "0.16.0"\n', "kernels 0.16.0 is not a release the kerneld hook serves"),
        ('__version__ = "1.0.0"\n', "kernels 1.0.0 is not a release the kerneld hook serves"),
        ('__version__ = "0.19.1"\n', "kernels 0.19.1 has no list of public names"),
        (
            NEWER + '__all__ = ["get_kernel", "brand_new"]\n',
            "kernels 0.20.0 has public names kerneld does not serve (brand_new)",
        ),
    ],
)
@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:9/kerneld-hub"])
def test_a_release_it_cannot_serve_gets_one_warning_and_no_hook(
    fake_kernels: Path, source: str, says: str, endpoint: str | None
) -> None:
    """The one warning says why, and what the job gets instead: `kernels`' own code, from
    HF_ENDPOINT (kerneld's Hub endpoint, if that is what it names) or the Hub."""
    (fake_kernels / "kernels" / "__init__.py").write_text(source)
    code = """
    import json, kernels
    from kerneld_client.integrations import kernels as hook
    print(json.dumps({"installed": hook.installed(), "again": hook.install()}))
    """
    env = {"KERNELD_HOOK_KERNELS": "1", "PYTHONPATH": str(fake_kernels)}
    if endpoint is not None:
        env["HF_ENDPOINT"] = endpoint
    out = python(code, env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"installed": False, "again": False}
    assert count_warnings(out.stderr, "KerneldHookWarning") == 1, out.stderr
    assert says in out.stderr
    if endpoint is None:
        assert (
            "kernels' own code downloads from the Hugging Face Hub, without kerneld" in out.stderr
        )
    else:
        assert f"kernels' own code downloads from HF_ENDPOINT={endpoint}" in out.stderr
        assert "kerneld's Hub endpoint" in out.stderr and "without kerneld" not in out.stderr


def test_a_later_release_with_known_names_is_served(fake_kernels: Path) -> None:
    (fake_kernels / "kernels" / "__init__.py").write_text(NEWER + '__all__ = ["get_kernel"]\n')
    code = """
    import json, kernels, kerneld_client
    from kerneld_client.integrations import kernels as hook
    print(json.dumps([hook.installed(), kernels.get_kernel is kerneld_client.get_kernel]))
    """
    out = python(code, {"KERNELD_HOOK_KERNELS": "1", "PYTHONPATH": str(fake_kernels)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True, True]
    assert "Warning" not in out.stderr


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


def _private_modules() -> dict[str, dict[str, int]]:
    """Every loaded `kernels.*` module's namespace, as ids of its values."""
    return {
        name: {k: id(v) for k, v in vars(module).items()}
        for name, module in sorted(sys.modules.items())
        if name.startswith("kernels.") and module is not None
    }


def test_install_and_uninstall_in_process(kernels_mod: Any) -> None:
    import kerneld_client

    names = [n for n in kernels_mod.__all__ if n != "__version__"]
    originals = {n: getattr(kernels_mod, n) for n in names}
    private = _private_modules()
    assert hook.install() is True and hook.installed()
    assert hook.install() is True  # idempotent
    assert all(getattr(kernels_mod, n) is getattr(kerneld_client, n) for n in names)
    assert kernels_mod.__version__ == "0.17.2"  # not bound
    assert _private_modules() == private  # nothing of kernels' own modules touched
    hook.uninstall()
    hook.uninstall()
    assert not hook.installed()
    assert {n: getattr(kernels_mod, n) for n in names} == originals


def test_unrecognised_version_in_process(kernels_mod: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels_mod, "__version__", "1.0.0")
    monkeypatch.setattr(hook, "_refused", False)
    original = kernels_mod.get_kernel
    with pytest.warns(hook.KerneldHookWarning, match=r"kernels 1\.0\.0 is not a release"):
        assert hook.install() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hook.install() is False  # said once is enough
    assert not hook.installed()
    assert kernels_mod.get_kernel is original


@pytest.mark.parametrize(
    ("version", "known"),
    [
        ("0.17.2", True),
        ("0.17.9", True),
        ("0.17.2.dev0", True),
        ("0.18.3", True),
        ("0.19.1", True),
        ("0.27.0", True),
        ("0.17.1", False),
        ("1.0.0", False),
        ("garbage", False),
    ],
)
def test_recognised_versions(version: str, known: bool) -> None:
    assert hook.recognised(version) is known
