"""kill -9 at any instant of ingest, publish or GC leaves a store that opens, verifies clean and
keeps working.

Two kinds of runs, in forked children (fast: no interpreter start-up):
- at every named step boundary (``kerneld.store.faults``) the child SIGKILLs itself;
- at random instants, the parent SIGKILLs a child running a mixed workload.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from kerneld.store import ResourceExhaustedError, Store, TreeFile, faults
from kerneld.store.blobs import Expected

from .conftest import REPO, metadata_for, sha256

POINTS = [
    "blob.synced",
    "blob.pending",
    "blob.renamed",
    "blob.live",
    "tree.file",
    "tree.staged",
    "tree.pending",
    "tree.renamed",
    "tree.live",
    "index.published",
    "gc.marked",
    "gc.tree_moved",
    "gc.blob_unlinked",
]
RANDOM_RUNS = 50
OPTIONS = {"min_age_s": 0, "orphan_grace_s": 0}
CAP = 200_000


def _variant(rnd: random.Random, shared: bytes) -> dict[str, bytes]:
    files = {
        "__init__.py": b"from ._ops import ops\n",
        "shared.so": shared,  # most revisions share this file
        "_ops.py": f"ops = {rnd.random()!r}\n".encode(),
    }
    if rnd.random() < 0.5:
        files["layers/extra.py"] = os.urandom(rnd.randint(0, 40_000))
    files["metadata.json"] = metadata_for(files)
    return files


def _workload(store: Store, rnd: random.Random) -> None:
    shared = random.Random(7).randbytes(60_000)
    n = 0
    while True:
        n += 1
        try:
            _one_round(store, rnd, shared, n)
        except ResourceExhaustedError:
            store.gc.collect()  # legitimate under the small cap: collect and go on


def _one_round(store: Store, rnd: random.Random, shared: bytes, n: int) -> None:
    commit = f"{rnd.getrandbits(160):040x}"
    files = _variant(rnd, shared)
    tf = []
    for path, data in files.items():
        exp = Expected(len(data), sha256=sha256(data))
        if not store.blobs.has_blob(exp.sha256 or ""):
            with store.blobs.open_writer(exp) as w:
                w.write(data[w.offset :])
                w.commit()
        tf.append(TreeFile(path, sha256(data), len(data), upstream_id=sha256(data)))
    store.trees.publish_tree(REPO, commit, rnd.choice(["torch-cpu", "torch-cuda"]), tf)
    store.names.set_ref(REPO, "main", commit)
    if n % 3 == 0:
        store.gc.collect()
    if n % 5 == 0:
        data = os.urandom(50_000)
        w = store.blobs.open_writer(Expected(len(data), sha256=sha256(data)))
        w.write(data[:20_000])
        w.close()  # a resumable partial download left behind


def _child(root, seed: int, point: str | None, nth: int, ready_fd: int) -> None:
    try:
        rnd = random.Random(seed)
        if point is not None:
            count = 0

            def hook(name: str) -> None:
                nonlocal count
                if name == point:
                    count += 1
                    if count >= nth:
                        os.kill(os.getpid(), signal.SIGKILL)

            faults.set_hook(hook)
        # orphan_grace_s protects blobs ingested for a publish that has not happened yet
        store = Store.open(root, cap_bytes=CAP, min_age_s=0, orphan_grace_s=0.5)
        os.write(ready_fd, b"r")
        _workload(store, rnd)
    except BaseException:
        import traceback

        (root.parent / "child-error.txt").write_text(traceback.format_exc())
    finally:
        os._exit(3)


def _run(root, seed: int, *, point: str | None = None, nth: int = 1, delay: float = 0.0) -> int:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(root, seed, point, nth, w)
    os.close(w)
    try:
        ready = os.read(r, 1) == b"r"  # b"" if a fault point killed it during open's recovery
        assert ready or point is not None, "child failed to open the store"
        if point is None:
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(r)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"child ended with status {status} instead of being killed: "
        + _read(root.parent / "child-error.txt")
    )
    return status


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _check(root, rnd: random.Random) -> None:
    with Store.open(root, **OPTIONS) as store:
        report = store.repair.verify()
        assert report.clean, report.problems
        assert list(store.layout.staging.iterdir()) == []
        assert list(store.layout.trash.iterdir()) == []
        head = store.names.get_ref(REPO, "main")
        if head is not None:
            # every published variant of the recorded head is usable
            for v in store.catalog.variants(REPO, head.commit):
                hit = store.catalog.lookup(REPO, "main", v)
                assert hit is not None and hit.path.is_dir()
        # still ingests and publishes
        files = _variant(rnd, b"after-crash")
        tf = []
        for path, data in files.items():
            info = store.blobs.ingest(data, size=len(data), sha256=sha256(data))
            tf.append(TreeFile(path, info.sha256, len(data)))
        commit = f"{rnd.getrandbits(160):040x}"
        store.trees.publish_tree(REPO, commit, "torch-cpu", tf)
        assert store.catalog.lookup(REPO, commit, "torch-cpu") is not None
        assert store.repair.verify().clean


@pytest.fixture
def crash_root(tmp_path):
    """On tmpfs when there is one: kill -9 keeps the page cache, so fsync only costs time here."""
    import shutil
    import tempfile

    base = tmp_path
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        base = Path(tempfile.mkdtemp(prefix="kerneld-crash-", dir="/dev/shm"))
    root = base / "store"
    Store.open(root).close()
    yield root
    if base != tmp_path:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("point", POINTS)
def test_kill_at_every_step(crash_root, point):
    rnd = random.Random(point)
    for nth in (1, 2):
        _run(crash_root, seed=rnd.randrange(1 << 30), point=point, nth=nth)
        _check(crash_root, rnd)


@pytest.mark.slow
def test_kill_at_random_instants(crash_root):
    rnd = random.Random(20260101)
    for _ in range(RANDOM_RUNS):
        _run(crash_root, seed=rnd.randrange(1 << 30), delay=rnd.uniform(0.0, 0.15))
        _check(crash_root, rnd)
