"""When the kernels hook attaches to Diffusers' attention_dispatch, and what it changes there:
whichever of `kernels` and attention_dispatch is imported first, the publisher question is
answered without a request and DIFFUSERS_TRUST_REMOTE_KERNELS is off (one warning if it was on);
uninstall() gives both back; a Diffusers without the check, or the hook off, is left alone.

attention_dispatch here is a stand-in with the two names Diffusers 0.42.1 binds at import (its
real behaviour through the hook: test_diffusers.py, in Diffusers' own venv)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.support import count_warnings
from tests.integrations.test_hook_install import python

DISPATCH_0421 = """
import os
from huggingface_hub import get_organization_overview
DIFFUSERS_TRUST_REMOTE_KERNELS = os.getenv("DIFFUSERS_TRUST_REMOTE_KERNELS", "false").upper() in {
    "1", "ON", "YES", "TRUE"}
"""
#: Nowhere to connect: a request the hook should have answered fails loudly.
NO_HUB = "http://127.0.0.1:9"

PROBE = """
import json, huggingface_hub
from kerneld_client.integrations import diffusers as attach, kernels as hook
from diffusers.models import attention_dispatch as ad
overview = ad.get_organization_overview("SageAttention")
state = {"attached": attach.attached(), "trusted": overview.trustedKernelPublisher,
         "verdict": getattr(overview, "kerneldVerdict", None),
         "env": ad.DIFFUSERS_TRUST_REMOTE_KERNELS}
hook.uninstall()
state["restored"] = [ad.get_organization_overview is huggingface_hub.get_organization_overview,
                     ad.DIFFUSERS_TRUST_REMOTE_KERNELS]
print(json.dumps(state))
"""


@pytest.fixture
def fake_diffusers(tmp_path: Path) -> Path:
    models = tmp_path / "diffusers" / "models"
    models.mkdir(parents=True)
    (tmp_path / "diffusers" / "__init__.py").write_text("")
    (models / "__init__.py").write_text("")
    (models / "attention_dispatch.py").write_text(DISPATCH_0421)
    return tmp_path


def _run(root: Path, first: str, **env: str) -> tuple[dict[str, Any], str]:
    settings = {"KERNELD_HOOK_KERNELS": "1", "PYTHONPATH": str(root), "HF_ENDPOINT": NO_HUB}
    out = python(first + "\n" + PROBE, {**settings, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1]), out.stderr


@pytest.mark.parametrize(
    "first",
    [
        "import kernels\nimport diffusers.models.attention_dispatch",
        "import diffusers.models.attention_dispatch\nimport kernels",
    ],
    ids=["kernels-first", "diffusers-first"],
)
def test_the_publisher_question_is_kerneld_s_whichever_comes_first(
    fake_diffusers: Path, first: str
) -> None:
    state, stderr = _run(fake_diffusers, first)
    assert state["attached"] and state["trusted"] is True and "[trust]" in state["verdict"]
    assert state["env"] is False and state["restored"] == [True, False]
    assert "Warning" not in stderr, stderr


def test_diffusers_trust_env_is_kept_from_kerneld_with_one_warning(fake_diffusers: Path) -> None:
    first = "import kernels\nimport diffusers.models.attention_dispatch"
    state, stderr = _run(fake_diffusers, first, DIFFUSERS_TRUST_REMOTE_KERNELS="true")
    assert state["env"] is False and state["restored"] == [True, True]
    assert count_warnings(stderr, "KerneldHookWarning") == 1, stderr
    assert "the site's [trust] policy decides" in stderr


def test_a_diffusers_without_the_check_is_left_alone(fake_diffusers: Path) -> None:
    dispatch = fake_diffusers / "diffusers" / "models" / "attention_dispatch.py"
    dispatch.write_text("OTHER = 1\n")
    code = """
    import json, kernels
    import diffusers.models.attention_dispatch as ad
    from kerneld_client.integrations import diffusers as attach, kernels as hook
    names = sorted(n for n in vars(ad) if not n.startswith("__"))
    print(json.dumps([hook.installed(), attach.attached(), names]))
    """
    out = python(code, {"KERNELD_HOOK_KERNELS": "1", "PYTHONPATH": str(fake_diffusers)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True, False, ["OTHER"]]


def test_the_hook_off_changes_nothing(fake_diffusers: Path) -> None:
    code = """
    import json, huggingface_hub, kernels
    import diffusers.models.attention_dispatch as ad
    print(json.dumps([ad.get_organization_overview is huggingface_hub.get_organization_overview,
                      ad.DIFFUSERS_TRUST_REMOTE_KERNELS]))
    """
    env = {"PYTHONPATH": str(fake_diffusers), "DIFFUSERS_TRUST_REMOTE_KERNELS": "1"}
    out = python(code, env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True, True]
