"""A repository or revision that does not exist, raised as `kernels` raises it wherever
huggingface_hub is installed (kerneld_client/_hub_errors.py, issue 53): huggingface_hub's
RepositoryNotFoundError / RevisionNotFoundError, and still kerneld's type (a FileNotFoundError),
on kerneld's own API as through the hook; without huggingface_hub, kerneld's types only. The
hooked route (LayerRepository with a revision the repo lacks, kernelize, through a real daemon)
is also `kernels`' own test_local_overrides_layer in tests/conformance."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from kerneld_client import _config
from kerneld_client._hub_errors import as_kernels_raises
from kerneld_client.errors import KernelNotFound, RevisionNotFound, VersionNotFound
from kerneld_client.layers._causes import is_configuration_error
from tests.client.support import ACTIVATION, ORG, client_env, run_client
from tests.support.daemon import DaemonProcess
from tests.support.hubserver import HubServer


@pytest.fixture
def hooked() -> Iterator[None]:
    _config.set_hooked({"versions": "kernels._versions", "kernelize": "kernels.layer.kernelize"})
    try:
        yield
    finally:
        _config.set_hooked(None)


def test_a_missing_revision_is_the_hubs_error_when_serving_kernels(hooked: None) -> None:
    raised = as_kernels_raises(RevisionNotFound("no such branch", repo_id="org/k", revision="mian"))
    assert isinstance(raised, RevisionNotFoundError) and isinstance(raised, HfHubHTTPError)
    assert isinstance(raised, RevisionNotFound) and isinstance(raised, FileNotFoundError)
    assert type(raised).__name__ == "RevisionNotFound"
    assert str(raised) == "org/k@mian: no such branch"
    assert (raised.repo_id, raised.revision, raised.response) == ("org/k", "mian", None)
    # kernelize still reads it as a mapping that can never be right, and raises it.
    assert is_configuration_error(raised)
    with pytest.raises(RevisionNotFoundError, match="mian"):
        raise raised


def test_a_missing_repo_is_the_hubs_error_when_serving_kernels(hooked: None) -> None:
    raised = as_kernels_raises(KernelNotFound("no such kernel repository", repo_id="org/none"))
    assert isinstance(raised, RepositoryNotFoundError) and isinstance(raised, KernelNotFound)
    assert not isinstance(raised, RevisionNotFoundError)
    assert str(raised) == "org/none: no such kernel repository"


def test_a_missing_version_stays_a_value_error(hooked: None) -> None:
    """`kernels` raises a ValueError ("Version 9 not found") for a version, not a Hub error."""
    error = VersionNotFound("Version 9 not found, available versions: 1, 2", repo_id="org/k")
    raised = as_kernels_raises(error)
    assert raised is error and not isinstance(raised, HfHubHTTPError)


def test_kerneld_own_api_raises_the_hubs_types_too() -> None:
    assert not _config.hooked()
    raised = as_kernels_raises(RevisionNotFound("no such branch", repo_id="org/k", revision="x"))
    assert isinstance(raised, RevisionNotFoundError) and isinstance(raised, RevisionNotFound)
    missing = as_kernels_raises(KernelNotFound("no such kernel repository", repo_id="org/none"))
    assert isinstance(missing, RepositoryNotFoundError) and isinstance(missing, FileNotFoundError)
    # Already both: returned as is.
    assert as_kernels_raises(missing) is missing


def test_other_not_found_errors_are_not_called_a_missing_repo() -> None:
    """A denied or platform-less kernel is no missing repository: kerneld's type only."""
    from kerneld_client.errors import KernelDenied, NoCompatibleVariant

    for error in (KernelDenied("denied", repo_id="org/k"), NoCompatibleVariant("none")):
        assert as_kernels_raises(error) is error


def test_the_combined_type_is_made_once(hooked: None) -> None:
    one = as_kernels_raises(RevisionNotFound("a", repo_id="org/k", revision="x"))
    two = as_kernels_raises(RevisionNotFound("b", repo_id="org/k", revision="y"))
    assert type(one) is type(two)


def test_without_huggingface_hub_kerneld_types_only(tmp_path: Path) -> None:
    """A process where huggingface_hub cannot be imported keeps kerneld's types (and the error
    path does not fail for want of it)."""
    script = (
        "import sys; sys.modules['huggingface_hub'] = None\n"
        "from kerneld_client._hub_errors import as_kernels_raises\n"
        "from kerneld_client.errors import KernelNotFound\n"
        "e = KernelNotFound('gone', repo_id='org/none')\n"
        "assert as_kernels_raises(e) is e\n"
        "print('{}')\n"
    )
    run_client(script, client_env(None, tmp_path))


def test_a_missing_kernel_from_get_kernel_is_caught_both_ways(
    make_daemon: Callable[..., DaemonProcess], example_server: HubServer, tmp_path: Path
) -> None:
    """The Done-when of issue 53, through kerneld's own API and a real daemon over the Hub test
    server: `except FileNotFoundError` and `except huggingface_hub.errors.RepositoryNotFoundError`
    both catch a missing repo from `kerneld_client.get_kernel`; a misspelt revision is also
    `RevisionNotFoundError`; a load that succeeds imports no huggingface_hub."""
    example_server.reset()
    daemon = make_daemon(hub_endpoint=example_server.url)
    env = client_env(None, tmp_path, KERNELD_SOCKET=str(daemon.user_socket))
    out = run_client(
        f"""
import json, sys
import kerneld_client
res = {{}}
kerneld_client.get_kernel("{ACTIVATION}", version=1, policy="error")
res["hub_imported_on_success"] = "huggingface_hub" in sys.modules
try:
    kerneld_client.get_kernel("{ORG}/absent", version=1, policy="error")
except FileNotFoundError as exc:
    res["fnf"] = [type(exc).__name__, str(exc)]
import huggingface_hub.errors
try:
    kerneld_client.get_kernel("{ORG}/absent", version=1, policy="error")
except huggingface_hub.errors.RepositoryNotFoundError as exc:
    res["hub"] = [type(exc).__name__, isinstance(exc, kerneld_client.KernelNotFound)]
try:
    kerneld_client.get_kernel("{ACTIVATION}", revision="mian", policy="error")
except huggingface_hub.errors.RevisionNotFoundError as exc:
    res["rev"] = [type(exc).__name__, isinstance(exc, FileNotFoundError)]
print(json.dumps(res))
""",
        env,
    )
    assert out["hub_imported_on_success"] is False
    assert out["fnf"][0] == "KernelNotFound" and f"{ORG}/absent" in out["fnf"][1], out
    assert out["hub"] == ["KernelNotFound", True]
    assert out["rev"] == ["RevisionNotFound", True]


def test_a_combined_error_pickles(hooked: None) -> None:
    """An error raised in a worker process (multiprocessing, a DataLoader) reaches its parent."""
    import pickle

    raised = as_kernels_raises(RevisionNotFound("no such branch", repo_id="org/k", revision="x"))
    back = pickle.loads(pickle.dumps(raised))
    assert type(back) is type(raised) and isinstance(back, RevisionNotFoundError)
    assert (str(back), back.repo_id, back.revision) == (str(raised), "org/k", "x")
