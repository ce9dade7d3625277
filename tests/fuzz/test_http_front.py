"""The HTTP front of the Hub endpoint (issue 42): request lines, headers, ranges and paths,
valid and hostile, through a real listener (`tests/fuzz/http_front.py` has the invariants)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kerneld.server.fronts.hubapi.server import parse_range
from tests.fuzz.http_front import FILE_SIZE, FrontHarness
from tests.fuzz.strategies import fuzz_settings, raw_mutations

METHODS = [b"GET", b"HEAD", b"POST", b"PUT", b"get", b"", b"G\x00T", b"GET" * 50]
SEGMENTS = [
    b"api",
    b"kernels",
    b"organizations",
    b"overview",
    b"org",
    b"name",
    b"resolve",
    b"revision",
    b"tree",
    b"refs",
    b"paths-info",
    b"main",
    b"build",
    b"..",
    b".",
    b"",
    b"%2e%2e",
    b"%2F",
    b"%00",
    b"%",
    b"%zz",
    b"\xff",
    b"a" * 300,
    b"x?y=1&recursive=true",
    b"#frag",
]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 extra", b"HTTP/x", b"", b"http/1.1"]
RANGES = [
    b"bytes=0-9",
    b"bytes=-5",
    b"bytes=10-",
    b"bytes=999-",
    b"bytes=1000-",
    b"bytes=5-1",
    b"bytes=0-0,5-9",
    b"bytes=-0",
    b"bytes=--1",
    b"items=0-1",
    b"bytes=99999999999999999999-",
    b"bytes= 1 - 2",
    b"bytes=\xff",
]
HEADER_NAMES = [b"Host", b"Range", b"Content-Length", b"Connection", b"X-A", b"", b"Bad Name"]
NASTY = [b"\r", b"\n", b"\0", b"\t", b" ", b"\r\n ", b"\x7f", b"\xff"]


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    path = b"/" + b"/".join(draw(st.lists(st.sampled_from(SEGMENTS), max_size=8)))
    line = b" ".join([draw(st.sampled_from(METHODS)), path, draw(st.sampled_from(VERSIONS))])
    headers = []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(HEADER_NAMES))
        if name == b"Range":
            value = draw(st.sampled_from(RANGES))
        elif name == b"Content-Length":
            value = draw(st.sampled_from([b"0", b"5", b"-1", b"99999999999", b"x"]))
        else:
            value = draw(st.binary(max_size=40)) + draw(st.sampled_from([b"", *NASTY]))
        headers.append(name + b": " + value)
    if draw(st.booleans()):
        headers.append(b"X-Long: " + b"a" * draw(st.sampled_from([100, 8000, 9000])))
    data = line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"
    if draw(st.integers(0, 3)) == 0:
        data = draw(raw_mutations(data))
    return data


@pytest.fixture(scope="module")
def harness() -> Iterator[FrontHarness]:
    h = FrontHarness()
    yield h
    h.close()


@fuzz_settings(150, deadline_s=10)
@given(data=requests())
@example(data=b"GET / HTTP/1.1\r\nX: " + b"\r" * 65000 + b"\r\n\r\n")
@example(data=b"GET /kernels/o/n/resolve/main/build/x HTTP/1.1\r\nRange: bytes=-0\r\n\r\n")
@example(data=b"GET /api/kernels/%ff/n HTTP/1.1\r\n\r\n")
@example(data=b"GET /api/kernels/o/n/refs HTTP/1.0\r\nContent-Length: 5\r\n\r\n")  # body never sent
def test_every_request_gets_one_answer_and_the_front_keeps_serving(
    harness: FrontHarness, data: bytes
) -> None:
    harness.check(data)


@fuzz_settings(300)
@example(header=b"bytes=-5", size=0)  # was (0, 0): a 206 of "bytes 0--1/0"
@given(header=st.one_of(st.sampled_from(RANGES), st.binary(max_size=30)), size=st.integers(0, 5))
def test_ranges_stay_in_the_file(header: bytes, size: int) -> None:
    got = parse_range(header.decode("latin-1"), size * 200)
    assert got is None or got == "all" or 0 <= got[0] < got[1] <= size * 200
    assert FILE_SIZE == 1000
