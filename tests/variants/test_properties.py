"""Properties over generated names and platforms: the ranking is a total order, independent of the
input order and consistent over subsets; platform facts round-trip through dict and protobuf."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerneld_client.variants import (
    Backend,
    PlatformFacts,
    decide,
)
from kerneld_client.wire import facts_from_proto, facts_to_proto
from tests.variants.support import (
    CPU,
    EVERY_NAME,
    F_CPU,
    F_CU130,
    FACTS,
    B,
    accepted,
    cuda,
)

NAME_LISTS = st.lists(st.sampled_from(EVERY_NAME), max_size=40)


@given(NAME_LISTS, FACTS, st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_ranking_is_a_total_order(names: list[str], f: PlatformFacts, rnd: random.Random) -> None:
    ds = decide(names, f)
    assert len(ds) == len(set(names))
    ranks = [d.rank for d in ds]
    n = sum(d.accepted for d in ds)
    # Accepted first with ranks 0..n-1, then the rejected with -1.
    assert ranks == [*range(n), *([-1] * (len(ds) - n))]
    assert all(d.accepted == (d.reason == "") for d in ds)
    # The order does not depend on the input order ...
    shuffled = list(names)
    rnd.shuffle(shuffled)
    assert decide(shuffled, f) == ds
    # ... and is consistent across subsets: dropping names never swaps two others.
    subset = [x for x in names if rnd.random() < 0.5]
    order = [d.variant for d in ds]
    sub = [d.variant for d in decide(subset, f)]
    assert sub == [x for x in order if x in set(subset)]


@given(FACTS)
@settings(max_examples=300, deadline=None)
def test_facts_dict_and_proto_round_trip(f: PlatformFacts) -> None:
    assert PlatformFacts.from_dict(f.to_dict()) == f
    message = facts_to_proto(f)
    assert message.HasField("cxx11_abi") == (f.cxx11_abi is not None)
    assert facts_from_proto(message) == f
    from kerneld_client.proto import kerneld_pb2

    wire = kerneld_pb2.PlatformFacts.FromString(message.SerializeToString())
    assert facts_from_proto(wire) == f


def test_proto_fields() -> None:
    f = replace(F_CU130, device_capabilities=("9.0",), tvm_ffi_version=(0, 1)).with_backend("cuda")
    m = facts_to_proto(f)
    assert (m.torch_version, m.cxx11_abi, m.cpu, m.os) == ("2.13", True, "x86_64", "linux")
    assert (m.backend.type, m.backend.version, m.backend.explicit) == ("cuda", "13.0", True)
    assert (m.python_version, m.tvm_ffi_version, list(m.device_capabilities)) == (
        "3.11.7",
        "0.1",
        ["9.0"],
    )
    from kerneld_client.wire import decision_from_proto, decision_to_proto

    for d in decide(["torch-cuda", "junk", "torch-cpu"], f):
        wire = decision_to_proto(d, cached=True)
        assert wire.cached and wire.rank == d.rank and wire.reason == d.reason
        assert decision_from_proto(wire) == d


def test_from_dict_rejects_nonsense() -> None:
    good = F_CPU.to_dict()
    cases: list[tuple[dict[str, object], str]] = [
        ({"colour": "red"}, "unknown platform fact keys"),
        ({"cpu": None}, "'cpu'"),
        ({"free_threaded": "false"}, "free_threaded"),
        ({"torch_version": "two"}, "not a version"),
        ({"cxx11_abi": "yes"}, "cxx11_abi"),
        ({"backend": {"type": "quantum"}}, "unknown backend type"),
        ({"backend": {"type": "cuda", "flavour": 1}}, "unknown backend keys"),
        ({"backend": "cu"}, "unknown backend token"),
        ({"backend": 3}, "backend must be"),
        ({"device_capabilities": "9.0"}, "device_capabilities"),
    ]
    for patch, match in cases:
        with pytest.raises(ValueError, match=match):
            PlatformFacts.from_dict({**good, **patch})
    assert PlatformFacts.from_dict({**good, "backend": "cu130"}).backend == cuda(13, 0)
    assert PlatformFacts.from_dict({**good, "backend": "cuda"}).backend == Backend(B.CUDA)
    long_version = PlatformFacts.from_dict({**good, "torch_version": "2.13.0+cu130"})
    assert long_version.torch_version == (2, 13)
    with pytest.raises(ValueError):
        Backend(B.CPU, (1, 0))


def test_empty_wire_facts_mean_noarch_only() -> None:
    from kerneld_client.proto import kerneld_pb2

    f = facts_from_proto(kerneld_pb2.PlatformFacts())
    assert (f.cpu, f.os, f.torch_version, f.backend) == ("", "", None, CPU)
    names = ["torch213-cpu-x86_64-linux", "torch-cpu", "torch-universal", "torch-cuda"]
    assert accepted(names, f) == ["torch-cpu", "torch-universal"]
