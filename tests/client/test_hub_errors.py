"""A repository or revision that does not exist, raised as `kernels` raises it while the hook
serves `kernels` (kerneld_client/_hub_errors.py): huggingface_hub's RepositoryNotFoundError /
RevisionNotFoundError, and still kerneld's type; kerneld's own API keeps kerneld's types only.
The route itself (LayerRepository with a revision the repo lacks, kernelize, through the hook
and a real daemon) is `kernels`' own test_local_overrides_layer in tests/conformance."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from kerneld_client import _config
from kerneld_client._hub_errors import as_kernels_raises
from kerneld_client.errors import KernelNotFound, RevisionNotFound, VersionNotFound
from kerneld_client.layers._causes import is_configuration_error


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


def test_kerneld_own_api_keeps_its_types() -> None:
    assert not _config.hooked()
    error = RevisionNotFound("no such branch", repo_id="org/k", revision="mian")
    assert as_kernels_raises(error) is error
    assert not isinstance(error, HfHubHTTPError)


def test_the_combined_type_is_made_once(hooked: None) -> None:
    one = as_kernels_raises(RevisionNotFound("a", repo_id="org/k", revision="x"))
    two = as_kernels_raises(RevisionNotFound("b", repo_id="org/k", revision="y"))
    assert type(one) is type(two)
