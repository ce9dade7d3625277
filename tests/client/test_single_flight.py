"""Per-kernel single-flight (issue 21 §1): concurrent loads of one kernel share one load, and a
slow kernel no longer holds up the loads of other kernels in the same process (the loader used
to hold one process-wide lock across a whole daemon fetch)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kerneld_client import get_kernel, loaded_kernels
from kerneld_client.loading import call
from kerneld_client.loading.context import LoadOptions, parse_request
from kerneld_client.single_flight import SingleFlight

WAIT_S = 10


def test_one_call_per_key_while_it_runs() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def slow() -> int:
        runs.append("slow")
        started.set()
        assert release.wait(WAIT_S)
        return 7

    results: list[int] = []
    first = threading.Thread(target=lambda: results.append(flights.do("a", slow)))
    first.start()
    assert started.wait(WAIT_S)
    second = threading.Thread(target=lambda: results.append(flights.do("a", slow)))
    second.start()
    # Another key runs now, while "a" is in flight.
    assert flights.do("b", lambda: 3) == 3
    release.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert results == [7, 7] and runs == ["slow"]
    assert flights.do("a", lambda: 8) == 8  # the flight ended: a new call runs


def test_a_failure_reaches_every_waiter_and_the_next_call_runs_again() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    started, release = threading.Event(), threading.Event()

    def failing() -> int:
        started.set()
        assert release.wait(WAIT_S)
        raise RuntimeError("boom")

    errors: list[str] = []

    def ask() -> None:
        try:
            flights.do("k", failing)
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=ask)]
    threads[0].start()
    assert started.wait(WAIT_S)
    threads.append(threading.Thread(target=ask))
    threads[1].start()
    time.sleep(0.05)
    release.set()
    for t in threads:
        t.join(WAIT_S)
    assert errors == ["boom", "boom"]
    assert flights.do("k", lambda: 1) == 1


def test_reentry_on_the_same_thread_does_not_wait_for_itself() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    assert flights.do("k", lambda: flights.do("k", lambda: 5) + 1) == 6


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_wait_for_the_parents_flight() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        assert release.wait(WAIT_S)
        return 1

    t = threading.Thread(target=lambda: flights.do("k", slow))
    t.start()
    assert started.wait(WAIT_S)
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here to finish "k"
        os._exit(0 if flights.do("k", lambda: 2) == 2 else 1)
    _, status = os.waitpid(pid, 0)
    release.set()
    t.join(WAIT_S)
    assert os.waitstatus_to_exitcode(status) == 0


def _local_kernel(folder: Path, kid: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(f"KID = {kid!r}\n")
    (folder / "metadata.json").write_text(
        json.dumps({"id": kid, "name": kid, "version": 1, "backend": {"type": "cpu"}})
    )
    return folder


def test_a_slow_kernel_does_not_block_another_kernels_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread's load of org/slow stops before its import; another thread loads org/fast
    meanwhile, and a third asking for org/slow gets the first thread's module, loaded once."""
    slow = _local_kernel(tmp_path / "slow", "_sf_slow_kernel")
    fast = _local_kernel(tmp_path / "fast", "_sf_fast_kernel")
    monkeypatch.setenv("LOCAL_KERNELS", f"org/slow={slow}:org/fast={fast}")
    call._memo.clear()
    in_import, release = threading.Event(), threading.Event()

    def hold_up(folder: Path, variant: str) -> None:
        in_import.set()
        assert release.wait(WAIT_S)

    modules: dict[str, Any] = {}

    def load_slow(name: str, options: LoadOptions) -> None:
        modules[name] = call.run(
            parse_request("org/slow", 1, None),
            backend=None,
            options=options,
            fallback=None,
            policy="error",
            hub_allowed=False,
        )

    first = threading.Thread(target=load_slow, args=("first", LoadOptions(before_import=hold_up)))
    first.start()
    try:
        assert in_import.wait(WAIT_S)
        waiter = threading.Thread(target=load_slow, args=("second", LoadOptions()))
        waiter.start()
        done = threading.Event()

        def load_fast() -> None:
            modules["fast"] = get_kernel("org/fast", version=1)
            done.set()

        other = threading.Thread(target=load_fast)
        other.start()
        assert done.wait(WAIT_S), "org/fast waited for org/slow's load"
        assert "second" not in modules  # still waiting for the first flight of org/slow
    finally:
        release.set()
        first.join(WAIT_S)
    waiter.join(WAIT_S)
    other.join(WAIT_S)
    assert modules["first"] is modules["second"]
    assert modules["fast"].KID == "_sf_fast_kernel"
    assert [k.repo_id for k in loaded_kernels()].count("org/slow") == 1


def test_local_kernels_is_read_on_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in `kernels`, a call after LOCAL_KERNELS changed loads what it names now, and one
    naming a folder that does not exist fails with kernels' words, whatever an earlier call with
    the same request loaded (kernels 0.17.2's test_local_overrides)."""
    one = _local_kernel(tmp_path / "one", "_sf_local_one")
    two = _local_kernel(tmp_path / "two", "_sf_local_two")
    call._memo.clear()

    def load() -> Any:
        return call.run(
            parse_request("org/local", None, "main"),
            backend=None,
            options=LoadOptions(),
            fallback=None,
            policy="error",
            hub_allowed=False,
        )

    monkeypatch.setenv("LOCAL_KERNELS", f"org/local={one}")
    assert load().KID == "_sf_local_one"
    assert load().KID == "_sf_local_one"  # the memo answers a repeated call
    monkeypatch.setenv("LOCAL_KERNELS", f"org/other=/non/existing:org/local={two}")
    assert load().KID == "_sf_local_two"
    monkeypatch.setenv("LOCAL_KERNELS", "org/local=/non/existing")
    with pytest.raises(FileNotFoundError, match="Cannot find a build variant for this system in"):
        load()
