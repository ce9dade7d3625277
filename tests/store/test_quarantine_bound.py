"""The quarantine is bounded (`[store] quarantine_max`): adding an entry that puts it over the
bound drops the oldest entries first (one log line each, saying what and why), never the entry
being added; entries whose variants are served again go before anything else is lost."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from kerneld.config import ConfigError, default_config, dump_config, load_config
from kerneld.store import Store, TreeFile
from kerneld.store.verify import DEFAULT_QUARANTINE_MAX_BYTES

KIB = 1024


def _publish(store: Store, i: int, size: int) -> str:
    """A tree of `size` payload bytes (distinct content per i); its hex digest."""
    files = {
        "__init__.py": f"N = {i}\n".encode(),
        "metadata.json": b'{"id": "_q%d"}' % i,
        "payload.bin": bytes([i % 251]) * size,
    }
    tree = []
    for rel, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        store.blobs.ingest(data, size=len(data), sha256=sha)
        tree.append(TreeFile(rel, sha, len(data)))
    info = store.trees.publish_tree(f"q/k{i}", f"{i:040x}", "torch-universal", tree)
    return info.digest.removeprefix("sha256:")


def _take_out(store: Store, hexd: str) -> list[str]:
    """Invalidate one tree (as the scrub does for damage); the names of its new entries."""
    _invalidated, _dead, kept = store.repair.invalidate(trees=[hexd])
    return [q.name for q in kept]


def test_adding_over_the_bound_drops_the_oldest_never_the_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Store.open(tmp_path / "store", min_age_s=0) as store:
        assert store.quarantine.max_bytes == DEFAULT_QUARANTINE_MAX_BYTES == 1 << 30
        assert default_config(system=True).quarantine_max_bytes == DEFAULT_QUARANTINE_MAX_BYTES
        digests = [_publish(store, i, 40 * KIB) for i in range(4)]
        store.quarantine.max_bytes = 100 * KIB  # two 40 KiB trees fit, three do not
        first = _take_out(store, digests[0])
        second = _take_out(store, digests[1])
        assert len(first) == len(second) == 1
        entries, held = store.quarantine.usage()
        assert entries == 2 and 80 * KIB < held <= 100 * KIB, (entries, held)

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kerneld.store"):
            third = _take_out(store, digests[2])
        names = [q.name for q in store.quarantine.entries()]
        assert first[0] not in names, "the oldest entry must go first"
        assert second[0] in names and third[0] in names
        dropped = [r.getMessage() for r in caplog.records if "quarantine: dropped" in r.message]
        assert len(dropped) == 1, dropped
        assert first[0] in dropped[0] and f"tree sha256:{digests[0]}" in dropped[0]
        assert "quarantine_max = 102400 bytes" in dropped[0] and third[0] in dropped[0]
        assert "the oldest entries go first" in dropped[0]
        assert store.quarantine.usage()[1] <= 100 * KIB

        # An entry larger than the bound on its own: everything older goes, it stays.
        store.quarantine.max_bytes = 10 * KIB
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kerneld.store"):
            fourth = _take_out(store, digests[3])
        assert [q.name for q in store.quarantine.entries()] == fourth
        assert any("alone is larger; it is kept" in r.message for r in caplog.records)


def test_entries_served_again_go_before_older_ones(tmp_path: Path) -> None:
    """A replaced entry (its variant published again) holds nothing that could be lost."""
    with Store.open(tmp_path / "store", min_age_s=0) as store:
        digests = [_publish(store, i, 40 * KIB) for i in range(3)]
        store.quarantine.max_bytes = 100 * KIB
        oldest = _take_out(store, digests[0])
        replaced = _take_out(store, digests[1])
        _publish(store, 1, 40 * KIB)  # variant q/k1 is served again (same tree)
        newest = _take_out(store, digests[2])
        names = [q.name for q in store.quarantine.entries()]
        assert replaced[0] not in names and oldest[0] in names and newest[0] in names


def test_no_bound_and_sizes_are_recorded(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store", min_age_s=0) as store:
        digests = [_publish(store, i, 40 * KIB) for i in range(3)]
        store.quarantine.max_bytes = 0  # 0: no bound
        for hexd in digests:
            _take_out(store, hexd)
        entries = store.quarantine.entries()
        assert len(entries) == 3
        for q in entries:
            doc = json.loads((q.path / "entry.json").read_text())
            assert doc["bytes"] == q.size_bytes and 40 * KIB < q.size_bytes < 41 * KIB
            assert q.reason == "" and q.by == "scrub" and q.quarantined_at > 0
        # annotate: what a confirmed report adds (forensics), read back by listings
        q = store.quarantine.annotate(entries[0].name, {"by": "report", "reported_by": "x"})
        assert q.by == "report" and q.size_bytes == entries[0].size_bytes


def test_quarantine_max_parses_and_fails_with_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text("")
    assert load_config(path, env={}).quarantine_max_bytes == 1 << 30
    path.write_text('[store]\nquarantine_max = "10MiB"\n')
    cfg = load_config(path, env={})
    assert cfg.quarantine_max_bytes == 10 << 20
    again = tmp_path / "again.toml"
    again.write_text(dump_config(cfg))
    assert load_config(again, env={}).quarantine_max_bytes == 10 << 20
    path.write_text("[store]\nquarantine_max = 0\n")
    assert load_config(path, env={}).quarantine_max_bytes == 0
    path.write_text('[store]\nquarantine_max = "lots"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.key == "store.quarantine_max" and str(path) in str(info.value)
