"""The invariants every fuzzed parser must keep, written once.

Both the bounded hypothesis tests (`tests/fuzz/test_*.py`) and the long atheris runs (`fuzz/*.py`)
call the `check_*` functions below and the harnesses built on them (`tests/fuzz/harnesses.py`,
which run a real store, daemon servicer or Hub client in a `Sandbox`), so "what counts as a bug"
is defined in one place:

- **typed errors only**: a parser either succeeds or raises one of its documented error classes
  with a non-empty message; anything else (KeyError, TypeError, a bare ValueError,
  RecursionError, OverflowError, ...) is an `InvariantViolation`;
- **sane results**: what a parser accepts is usable downstream (round trips, valid ids, finite
  durations, paths inside the store, ...);
- **no write outside the target**: harnesses that touch the disk run inside a `Sandbox`, whose
  every file outside the target directory (a sentinel directory, the inputs) must be unchanged
  afterwards. Hostile absolute paths point into the sentinel directory (`OUTSIDE` is replaced by
  its real path), so an escape is seen instead of scribbling over the machine;
- **no hang**: enforced by the callers (hypothesis deadlines, pytest-timeout, atheris -timeout).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Hostile absolute paths contain this; harnesses replace it with the sandbox's sentinel dir.
OUTSIDE = "@OUTSIDE@"

REPO = "fuzz-org/fuzz-kernel"
COMMIT = "c0" * 20
HEX40 = re.compile(r"[0-9a-f]{40}")
HEX64 = re.compile(r"[0-9a-f]{64}")


class InvariantViolation(AssertionError):
    """A parser broke one of the invariants above: a bug to fix, not a test problem."""


def expect(condition: object, message: str) -> None:
    """Like `assert`, but kept under `python -O` and raising InvariantViolation."""
    if not condition:
        raise InvariantViolation(message)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What a call under test did: returned `value`, or raised the typed `error`."""

    value: T | None
    error: BaseException | None

    @property
    def ok(self) -> bool:
        return self.error is None


def typed(fn: Callable[[], T], allowed: tuple[type[BaseException], ...], what: str) -> Outcome[T]:
    """Call `fn`; an exception must be one of `allowed` and carry a message."""
    try:
        return Outcome(fn(), None)
    except InvariantViolation:
        raise
    except allowed as exc:
        if not str(exc).strip():
            raise InvariantViolation(f"{what}: {type(exc).__name__} without a message") from exc
        return Outcome(None, exc)
    except Exception as exc:
        detail = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc!r}"
        raise InvariantViolation(f"{what}: untyped error {detail[:1500]}") from exc


# ---- the file system around the target -------------------------------------------------------


class Sandbox:
    """`root/target` may change; everything else under `root` (the `outside` sentinel directory
    with a canary file, and the inputs) must not, whatever the input."""

    def __init__(self, root: Path, target: str = "store") -> None:
        self.root = root
        self.target = root / target
        self.outside = root / "outside"
        self.inputs = root / "inputs"
        for d in (self.outside, self.inputs):
            d.mkdir(parents=True, exist_ok=True)
        canary = self.outside / "canary"
        if not canary.exists():
            canary.write_bytes(b"canary\n")
            canary.chmod(0o644)

    def hostile(self, text: str) -> str:
        """Point the `OUTSIDE` placeholder of a generated path at the sentinel directory."""
        return text.replace(OUTSIDE, str(self.outside))

    def snapshot(self) -> dict[str, tuple[int, int, str]]:
        """(mode, size, content hash or link target) of everything outside the target."""
        out: dict[str, tuple[int, int, str]] = {}
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            base = Path(dirpath)
            if base == self.root:
                dirnames[:] = [d for d in dirnames if base / d != self.target]
            for name in (*dirnames, *filenames):
                path = base / name
                st = path.lstat()
                key = str(path.relative_to(self.root))
                if stat.S_ISLNK(st.st_mode):
                    out[key] = (st.st_mode, 0, os.readlink(path))
                elif stat.S_ISREG(st.st_mode):
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    out[key] = (st.st_mode, st.st_size, digest)
                else:
                    out[key] = (st.st_mode, 0, "")
        return out

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Fail if the body changed anything outside the target (even when it raised)."""
        before = self.snapshot()
        try:
            yield
        finally:
            after = self.snapshot()
            if after != before:
                added = sorted(set(after) - set(before))
                removed = sorted(set(before) - set(after))
                changed = sorted(k for k in set(after) & set(before) if after[k] != before[k])
                raise InvariantViolation(
                    f"wrote outside the target {self.target.name}/: added {added[:5]}, "
                    f"removed {removed[:5]}, changed {changed[:5]}"
                )

    def check_target_contained(self) -> None:
        """No symlink inside the target may lead out of it."""
        root = self.target.resolve()
        if not self.target.exists():
            return
        for dirpath, dirnames, filenames in os.walk(self.target, followlinks=False):
            for name in (*dirnames, *filenames):
                path = Path(dirpath) / name
                if path.is_symlink():
                    real = path.resolve()
                    expect(
                        real == root or root in real.parents,
                        f"symlink {path} in the target points outside it ({real})",
                    )


@contextlib.contextmanager
def default_recursion_limit(headroom: int = 950) -> Iterator[None]:
    """Run the body with `headroom` frames left, as under Python's default limit (1000) in a
    shallow daemon thread: test runners (hypothesis) raise the limit and would hide overflows."""
    depth = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + headroom)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def inside(path: Path, root: Path) -> bool:
    real, base = path.resolve(), root.resolve()
    return real == base or base in real.parents


# ---- lock files (kerneld_client.lockfile) -----------------------------------------------------


def check_lockfile(data: bytes | str) -> None:
    """`parse_lockfile`: a LockFile whose entries are valid and round-trip, or LockfileError."""
    from kerneld_client.lockfile import LockfileError, dumps_locks, parse_lockfile
    from kerneld_client.vocabulary import is_repo_id

    out = typed(lambda: parse_lockfile(data, source="fuzz.lock"), (LockfileError,), "lockfile")
    if out.error is not None:
        expect(str(out.error).startswith("fuzz.lock"), f"error does not name the file: {out.error}")
        return
    lock = out.value
    assert lock is not None
    expect(lock.format in ("0.17", "old"), f"unknown format {lock.format!r}")
    for repo_id, commit, _ref in lock.pinned():
        expect(is_repo_id(repo_id), f"bad repo id {repo_id!r}")
        expect(re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit), f"bad commit {commit!r}")
    for old in lock.old:
        for name, vh in old.variants.items():
            expect(isinstance(name, str) and "/" not in name, f"bad variant name {name!r}")
            expect(re.fullmatch(r"sha256-[0-9a-f]{64}", vh.hash), f"bad variant hash {vh.hash!r}")
    if lock.format == "0.17":
        again = parse_lockfile(dumps_locks(lock.locks))
        expect(
            sorted(again.locks, key=str) == sorted(lock.locks, key=str),
            "0.17 lock file does not round-trip through dumps_locks",
        )


def check_pyproject(data: bytes, workdir: Path) -> None:
    """`read_pyproject_dependencies`: valid dependencies, or LockfileError."""
    from kerneld_client.lockfile import MAX_VERSION, LockfileError, read_pyproject_dependencies
    from kerneld_client.vocabulary import is_repo_id

    path = workdir / "pyproject.toml"
    path.write_bytes(data)
    out = typed(lambda: read_pyproject_dependencies(path), (LockfileError,), "pyproject")
    for dep in out.value or []:
        expect(is_repo_id(dep.repo_id), f"bad repo id {dep.repo_id!r}")
        expect(dep.version is not None and 0 <= dep.version <= MAX_VERSION, f"bad {dep}")


# ---- kerneld.toml + KERNELD_* (kerneld.config) ------------------------------------------------


def check_config(data: bytes, env: Mapping[str, str], workdir: Path) -> None:
    """`load_config`: a Config that is usable and that `dump_config` writes back exactly, or
    ConfigError naming the file or variable."""
    from kerneld.config import Config, ConfigError, dump_config, load_config
    from kerneld.pipeline.resolve import KernelSpec

    path = workdir / "kerneld.toml"
    path.write_bytes(data)
    out = typed(lambda: load_config(path, env=env, system=False), (ConfigError,), "config")
    if out.error is not None:
        assert isinstance(out.error, ConfigError)
        expect(out.error.key and out.error.reason, f"ConfigError without key/reason: {out.error}")
        return
    cfg = out.value
    assert isinstance(cfg, Config)
    for f in fields(Config):
        value = getattr(cfg, f.name)
        if f.name.endswith("_s"):
            expect(
                isinstance(value, float) and math.isfinite(value) and value >= 0,
                f"{f.name} = {value!r}: durations must be finite and >= 0",
            )
        if isinstance(value, Path):
            expect("\0" not in str(value), f"{f.name} = {value!r}: a path with a NUL byte")
    for sock in (cfg.user_socket, cfg.admin_socket):
        expect("\0" not in str(sock.path), f"socket path with a NUL byte: {sock.path!r}")
        expect(0 <= sock.mode <= 0o7777, f"socket mode {sock.mode!r}")
    for up in cfg.upstreams:
        expect(
            up.token_file is None or "\0" not in str(up.token_file), "token_file with a NUL byte"
        )
    expect(cfg.cap_bytes is None or cfg.cap_bytes > 0, f"cap_bytes {cfg.cap_bytes!r}")
    expect(cfg.min_free_bytes >= 0, f"min_free_bytes {cfg.min_free_bytes!r}")
    expect(0 < cfg.lease_ttl_s <= cfg.lease_max_s, "lease_ttl must be in (0, lease_max]")
    expect(1 <= cfg.threads <= 256 and 1 <= cfg.fetch_attempts <= 20, "threads/attempts range")
    names = [u.name for u in cfg.upstreams]
    expect(len(set(names)) == len(names), f"duplicate upstream names {names}")
    for entry in cfg.prefetch:
        typed(
            partial(KernelSpec, entry.repo_id, version=entry.version, revision=entry.revision),
            (),
            f"prefetch entry {entry} accepted by the config but not usable",
        )
    # `kerneld --check-config` promises TOML that load_config reads back to the same values.
    dumped = workdir / "dumped.toml"
    text = typed(lambda: dump_config(cfg), (), "dump_config").value
    assert text is not None
    dumped.write_text(text, encoding="utf-8")
    back = typed(
        lambda: load_config(dumped, env={}, system=cfg.system), (), "reloading dump_config output"
    ).value
    assert back is not None
    expect(
        replace(back, source=cfg.source) == cfg,
        "dump_config output does not load back to the same configuration",
    )


# ---- variant names and platform facts (kerneld_client.variants) -------------------------------

#: A spread of platforms for decide(); fuzzed facts are added to these.
_BASE_FACTS: list[dict[str, Any]] = [
    {"cpu": "x86_64", "os": "linux", "torch_version": "2.13", "cxx11_abi": True},
    {
        "cpu": "x86_64",
        "os": "linux",
        "torch_version": "2.13",
        "backend": {"type": "cuda", "version": "13.0"},
        "device_capabilities": ["9.0"],
    },
    {"cpu": "aarch64", "os": "darwin", "backend": "metal", "macos_version": "26.1"},
    {"cpu": "x86_64", "os": "linux", "free_threaded": True, "python_version": "3.13.1"},
]


def _same_variant(a: Any, b: Any) -> bool:
    keys = ("kind", "backend", "torch_version", "tvm_ffi_version", "abi", "cpu", "os")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def check_variant_names(names: Sequence[str], extra_facts: Sequence[Any] = ()) -> None:
    """`parse_variant` is total and its canonical names parse back; `decide` never raises and
    ranks accepted variants 0..n-1 before every rejected one."""
    from kerneld_client.variants import PlatformFacts, Variant, decide, parse_variant, summarize

    for name in names:
        parsed = typed(partial(parse_variant, name), (), f"parse_variant({name!r})").value
        if isinstance(parsed, Variant):
            canonical = parsed.canonical_name
            again = parse_variant(canonical)
            expect(
                isinstance(again, Variant) and _same_variant(parsed, again),
                f"{name!r}: canonical name {canonical!r} parses differently",
            )
    facts = [PlatformFacts.from_dict(d) for d in _BASE_FACTS] + list(extra_facts)
    for f in facts:
        decisions = typed(partial(decide, names, f), (), "decide").value
        assert decisions is not None
        expect(len(decisions) == len(set(names)), "decide() lost or duplicated a variant")
        accepted = [d for d in decisions if d.accepted]
        expect(
            [d.rank for d in accepted] == list(range(len(accepted))),
            "accepted ranks are not 0..n-1",
        )
        expect(decisions[: len(accepted)] == accepted, "an accepted variant after a rejected one")
        expect(all(d.reason for d in decisions if not d.accepted), "a rejection without reason")
        typed(partial(summarize, decisions, f), (), "summarize")


def check_platform_json(text: str, names: Sequence[str] = ()) -> None:
    """`facts_from_json` (KERNELD_PLATFORM_JSON): facts that round-trip through dict and
    protobuf, or ValueError naming the variable (its documented error)."""
    from kerneld_client.platform import ENV_VAR, facts_from_json

    out = typed(lambda: facts_from_json(text), (ValueError,), "facts_from_json")
    if out.error is not None:
        expect(ENV_VAR in str(out.error), f"error does not name {ENV_VAR}: {out.error}")
    if out.value is not None:
        check_facts_object(out.value, names)


def check_facts_proto(data: bytes, names: Sequence[str] = ()) -> None:
    """The daemon's path: wire bytes -> PlatformFacts (ValueError is INVALID_ARGUMENT)."""
    from google.protobuf.message import DecodeError

    from kerneld_client.proto import kerneld_pb2 as pb
    from kerneld_client.wire import facts_from_proto

    try:
        message = pb.PlatformFacts.FromString(data)
    except DecodeError:
        return
    out = typed(lambda: facts_from_proto(message), (ValueError,), "facts_from_proto")
    if out.value is not None:
        check_facts_object(out.value, names)


def check_facts_object(facts: Any, names: Sequence[str] = ()) -> None:
    from kerneld_client.variants import PlatformFacts, device_compatible
    from kerneld_client.wire import facts_from_proto, facts_to_proto

    what = f"facts {facts!r}"
    d = typed(facts.to_dict, (), what).value
    assert d is not None
    json.dumps(d)
    expect(PlatformFacts.from_dict(d) == facts, f"{what}: to_dict/from_dict do not round-trip")
    expect(
        facts_from_proto(facts_to_proto(facts)) == facts,
        f"{what}: protobuf form does not round-trip",
    )
    typed(facts.describe, (), what)
    for backend in ("cuda", "rocm", "cpu"):
        typed(
            partial(
                device_compatible,
                backend,
                list(names),
                facts.backend.type.value,
                facts.device_capabilities,
            ),
            (),
            what,
        )
    if names:
        check_variant_names(names, [facts])


def check_arch(archs: Sequence[str], capability: str) -> None:
    """`arch_compatible` reads backend.archs from metadata.json: it must never raise."""
    from kerneld_client.variants import arch_compatible

    result = typed(lambda: arch_compatible(archs, capability), (), "arch_compatible").value
    assert result is not None
    ok, why = result
    expect(isinstance(ok, bool) and isinstance(why, str) and why, f"bad verdict {result!r}")


# ---- metadata.json parsing and digest check (kerneld.store.manifest) --------------------------


def metadata_digest(files: Mapping[str, bytes], algorithm: str = "sha256") -> dict[str, str]:
    return {
        p: base64.b64encode(hashlib.new(algorithm, d).digest()).decode()
        for p, d in files.items()
        if p not in ("metadata.json", "metadata.json.sigstore")
    }


def check_metadata(raw: bytes, files: Mapping[str, bytes], *, require: bool = False) -> None:
    """`parse_metadata` + `check_metadata_digest` on their own: MetadataError /
    MetadataDigestError only, and a passed digest check must really match the files."""
    from kerneld.store import MetadataDigestError, MetadataError
    from kerneld.store.manifest import ManifestEntry, check_metadata_digest, parse_metadata

    parsed = typed(lambda: parse_metadata(raw, variant="v"), (MetadataError,), "parse_metadata")
    if parsed.value is None:
        return
    doc, meta = parsed.value
    expect(isinstance(doc, dict), "parse_metadata returned a non-object")
    expect(meta.version is None or type(meta.version) is int, "metadata version not an int")
    expect(all(isinstance(a, str) for a in meta.archs), "non-string archs")
    all_files = {**files, "metadata.json": raw}
    entries = {
        p: ManifestEntry(p, 0o444, len(d), hashlib.sha256(d).hexdigest())
        for p, d in all_files.items()
    }

    def hash_file(algorithm: str, path: str) -> bytes:
        return hashlib.new(algorithm, all_files[path]).digest()

    checked = typed(
        lambda: check_metadata_digest(doc, entries, hash_file, require=require),
        (MetadataDigestError,),
        "check_metadata_digest",
    )
    if checked.value:
        digest = doc["digest"]
        want = metadata_digest(files, digest["algorithm"])
        expect(
            digest["files"] == want,
            "digest check passed but the digest does not describe the files",
        )
    if checked.value is False:
        expect(not require and "digest" not in doc, "digest check skipped a present digest")


# ---- mirror documents (kerneld.mirror.documents) ------------------------------------------------


def check_mirror_documents(data: bytes, repo_id: str = REPO, commit: str = COMMIT) -> None:
    """Manifests, refs and mirror-info: MirrorFormatError only; accepted manifests are safe to
    hand to the store and round-trip."""
    from kerneld.mirror.documents import (
        Manifest,
        MirrorFormatError,
        parse_info,
        parse_refs,
        parse_refs_exported_at,
    )

    allowed = (MirrorFormatError,)
    m = typed(lambda: Manifest.from_json(data, repo_id=repo_id, commit=commit), allowed, "manifest")
    if m.value is not None:
        manifest = m.value
        for name, files in manifest.variants.items():
            expect(
                isinstance(name, str) and "/" not in name and name not in ("", ".", ".."),
                f"variant name {name!r}",
            )
            for f in files:
                expect(isinstance(f.path, str), f"file path {f.path!r}")
                expect(type(f.size) is int and f.size >= 0, f"file size {f.size!r}")
                expect(f.sha256 is not None and HEX64.fullmatch(f.sha256), f"sha256 {f.sha256!r}")
                expect(f.git_sha1 is None or HEX40.fullmatch(f.git_sha1), "git_sha1")
            expect(manifest.executables.get(name, frozenset()) <= {f.path for f in files}, "mode")
        again = Manifest.from_json(manifest.to_json(), repo_id=repo_id, commit=commit)

        def by_path(m: Manifest) -> dict[str, list[Any]]:  # to_json sorts files by path
            return {v: sorted(fs, key=lambda f: f.path) for v, fs in m.variants.items()}

        expect(
            by_path(again) == by_path(manifest) and again.executables == manifest.executables,
            "manifest does not round-trip through to_json",
        )
    typed(lambda: parse_info(data), allowed, "mirror-info")
    refs = typed(lambda: parse_refs(data, repo_id), allowed, "refs").value
    if refs is not None:
        for table in refs:
            for name, target in table.items():
                expect(isinstance(name, str) and HEX40.fullmatch(target), f"ref {name!r}")
        when = typed(lambda: parse_refs_exported_at(data), allowed, "refs exported_at").value
        expect(when is None or (isinstance(when, float) and when >= 0), f"exported_at {when!r}")
