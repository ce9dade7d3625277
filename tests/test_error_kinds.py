"""Each kerneld error carries one kind, and the kind alone decides its statuses (issue 54).

Every exception class kerneld defines (found by walking them all) declares a kind or inherits
its base's; none inherits two that disagree; and none contradicts its base's kind unless listed
here with why (a base of kind INTERNAL is a family its members refine; a builtin ValueError
reads as INVALID). Every kind has one row in `statuses.STATUSES`, and every class's gRPC and
HTTP statuses are its kind's row: no class-by-class status anywhere.
"""

from __future__ import annotations

import typing

import pytest

from kerneld.errors import ErrorKind, WireCode, kind_of, wire_code_of
from kerneld.server.fronts.hubapi.server import _hub_error
from kerneld.server.statuses import STATUSES, classify
from kerneld.store.errors import StoreError
from kerneld.upstream.errors import UpstreamError
from kerneld_client.proto import kerneld_pb2 as pb
from tests.support.errors import kerneld_error_classes, sample

#: Classes whose kind differs from their base's (other than INTERNAL): the kind, and why.
OVERRIDES = {
    "RepoNotFound": (
        ErrorKind.NOT_FOUND,
        "the upstream answered: no such repository is an answer, not an outage",
    ),
    "RevisionNotFound": (ErrorKind.NOT_FOUND, "the upstream answered: no such revision"),
    "EntryNotFound": (ErrorKind.NOT_FOUND, "the upstream answered: no such file or variant"),
}
#: Classes whose kind is given where each is raised, not by the class.
KIND_PER_RAISE = {
    "HubError": "an answer of the Hub endpoint: each raise names its kind (404, 400, 405, ...)",
}


def declared(cls: type) -> ErrorKind | None:
    """The kind `cls` or its nearest ancestor declares; a builtin ValueError reads as INVALID."""
    for klass in cls.__mro__:
        kind = vars(klass).get("kind")
        if isinstance(kind, ErrorKind):
            return kind
    return ErrorKind.INVALID if issubclass(cls, ValueError) else None


def problems(classes: dict[str, type[BaseException]]) -> list[str]:
    """What breaks the rules: no kind, two disagreeing kinds inherited, an unlisted override."""
    found = []
    for name, cls in sorted(classes.items()):
        if name in KIND_PER_RAISE:
            continue
        kind = declared(cls)
        if kind is None:
            found.append(f"{name}: declares no kind")
            continue
        inherited = {k for b in cls.__bases__ if (k := declared(b)) is not None}
        if "kind" not in vars(cls) and len(inherited) > 1:
            found.append(f"{name}: inherits {sorted(k.name for k in inherited)}; declare one")
            continue
        contradicted = inherited - {kind, ErrorKind.INTERNAL}
        if contradicted and OVERRIDES.get(name, (None,))[0] is not kind:
            found.append(f"{name}: {kind.name} contradicts its base's {contradicted.pop().name}")
    return found


def test_every_error_class_has_exactly_one_kind() -> None:
    classes = kerneld_error_classes()
    assert problems(classes) == []
    for name in KIND_PER_RAISE:
        assert isinstance(vars(sample(classes[name])).get("kind"), ErrorKind), name


def test_every_override_is_one_and_is_still_there() -> None:
    classes = kerneld_error_classes()
    for name in OVERRIDES:
        cls = classes[name]
        bases = {declared(b) for b in cls.__bases__}
        assert declared(cls) not in bases, f"{name} no longer overrides: drop it from OVERRIDES"


def test_the_checks_catch_what_they_are_for() -> None:
    class Unkinded(Exception):
        pass

    class Contradicts(UpstreamError):
        kind = ErrorKind.DENIED

    class Refines(StoreError):  # a family of kind INTERNAL: refining it is the point
        kind = ErrorKind.NOT_FOUND

    class Both(Refines, ValueError):  # NOT_FOUND and INVALID, and says neither
        pass

    got = problems({c.__name__: c for c in (Unkinded, Contradicts, Refines, Both)})
    assert got == [
        "Both: inherits ['INVALID', 'NOT_FOUND']; declare one",
        "Contradicts: DENIED contradicts its base's UNAVAILABLE",
        "Unkinded: declares no kind",
    ]


def test_every_kind_has_one_status_row() -> None:
    assert set(STATUSES) == set(ErrorKind)
    codes = set(pb.ErrorCode.keys())
    assert set(typing.get_args(WireCode)) <= codes
    assert {row.code for row in STATUSES.values()} <= set(typing.get_args(WireCode))


@pytest.mark.parametrize("name", sorted(kerneld_error_classes()))
def test_the_kind_alone_decides_the_statuses(name: str) -> None:
    exc = sample(kerneld_error_classes()[name])
    kind = kind_of(exc)
    assert kind is declared(type(exc)) or name in KIND_PER_RAISE
    row = STATUSES[kind]
    failure = classify(exc)
    assert (failure.kind, failure.status, failure.http) == (kind, row.grpc, row.http)
    assert _hub_error(exc, ["api", "kernels", "o", "n"]).status == row.http
    code = wire_code_of(exc)
    assert code is None or code in typing.get_args(WireCode)
    assert pb.ErrorCode.Name(failure.detail.code) == (code or row.code)
