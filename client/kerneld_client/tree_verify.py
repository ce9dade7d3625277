"""`KERNELD_VERIFY=1`: prove a store tree is still what the daemon published, before importing it.

The daemon names every tree by the sha256 of its canonical manifest::

    kerneld-tree-v1\\n
    <mode, 4 octal digits> <size> <sha256 hex> <relative path>\\n     (one line per file)

sorted by the UTF-8 bytes of the path (``kerneld.store.manifest`` builds it with the helpers
below: one definition for both sides). The digest is self-certifying: rebuilding the manifest
from the files on disk must give the digest the index (or the daemon's answer) names, whoever
wrote that answer, so a flipped bit, a truncated file, a changed mode, or a file added or removed
is caught without trusting anything but the digest. The files' hashes are also compared with
``metadata.json``'s ``digest`` (the kernel builder's own claim, checked by the daemon at ingest)
when there is one, which names the damaged file. Trees of the `hub` fallback's cache have no
tree digest; for them the metadata digest is the check.

Every byte is read once (about 1 GB/s on one core: under a millisecond for a typical kernel);
files are opened without following symlinks. Standard library only; imported only when the knob
is set.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
import time
from pathlib import Path

from kerneld_client.errors import CorruptTree

__all__ = ["MANIFEST_HEADER", "TreeCheck", "manifest_line", "verify_tree"]

MANIFEST_HEADER = b"kerneld-tree-v1\n"
METADATA_FILE = "metadata.json"
_NOT_DIGESTED = (METADATA_FILE, "metadata.json.sigstore")
_DIGEST_SIZES = {"sha256": 32, "sha512": 64}
CHUNK = 1 << 20


def manifest_line(mode: int, size: int, sha256_hex: str, path: str) -> bytes:
    """One line of a canonical tree manifest."""
    return f"{mode:04o} {size} {sha256_hex} {path}\n".encode()


class TreeCheck:
    """What a verification read (for logs and measurements)."""

    __slots__ = ("bytes", "files", "metadata_checked", "seconds", "tree_checked")

    def __init__(
        self, files: int, nbytes: int, seconds: float, tree_checked: bool, metadata_checked: bool
    ) -> None:
        self.files = files
        self.bytes = nbytes
        self.seconds = seconds
        self.tree_checked = tree_checked
        self.metadata_checked = metadata_checked


class _Hashed:
    __slots__ = ("extra", "mode", "sha256", "size")

    def __init__(self, mode: int, size: int, sha256: str, extra: bytes | None) -> None:
        self.mode = mode
        self.size = size
        self.sha256 = sha256
        self.extra = extra


def _files(folder: str, *, skip_bytecode: bool = False) -> list[tuple[str, str]]:
    """(relative path, full path) of every non-directory entry below `folder`; with
    `skip_bytecode`, none below a `__pycache__` directory."""
    out: list[tuple[str, str]] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(folder, rel_dir) if rel_dir else folder) as entries:
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if not (skip_bytecode and entry.name == "__pycache__"):
                        stack.append(rel)
                else:
                    out.append((rel, entry.path))
    return out


def _hash(
    path: str, extra: str | None, *, follow_links: bool = False
) -> tuple[_Hashed, bytes | None]:
    """Hash one regular file (through a symlink only with `follow_links`); the bytes too if it
    is small JSON."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        h = hashlib.sha256()
        h2 = hashlib.new(extra) if extra else None
        size = 0
        keep: list[bytes] | None = [] if path.endswith(METADATA_FILE) else None
        while chunk := os.read(fd, CHUNK):
            h.update(chunk)
            if h2 is not None:
                h2.update(chunk)
            if keep is not None:
                keep.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    hashed = _Hashed(
        stat.S_IMODE(st.st_mode), size, h.hexdigest(), h2.digest() if h2 is not None else None
    )
    return hashed, b"".join(keep) if keep is not None else None


def metadata_digest(raw: bytes | None) -> tuple[str, dict[str, object]] | None:
    """(algorithm, files) of metadata.json's digest, None when it declares none."""
    if raw is None:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # the tree digest decides (a garbled metadata.json changes it)
    digest = doc.get("digest") if isinstance(doc, dict) else None
    if not isinstance(digest, dict):
        return None
    algorithm, files = digest.get("algorithm"), digest.get("files")
    if algorithm not in _DIGEST_SIZES or not isinstance(files, dict):
        return None
    return str(algorithm), files


def _metadata_mismatches(
    algorithm: str, listed: dict[str, object], hashed: dict[str, _Hashed]
) -> list[str]:
    covered = {p for p in hashed if p not in _NOT_DIGESTED}
    bad = sorted(p for p in set(listed) ^ covered)
    for rel in sorted(covered & set(listed)):
        value = listed[rel]
        try:
            want = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
        except (binascii.Error, ValueError):
            want = b""
        have = (
            bytes.fromhex(hashed[rel].sha256) if algorithm == "sha256" else hashed[rel].extra or b""
        )
        if len(want) != _DIGEST_SIZES[algorithm] or have != want:
            bad.append(rel)
    return bad


def verify_tree(
    folder: Path,
    digest: str | None,
    *,
    repo_id: str = "",
    revision: str = "",
    variant: str = "",
    skip_bytecode: bool = False,
    follow_links: bool = False,
) -> TreeCheck:
    """Re-hash `folder`; CorruptTree unless it matches `digest` (``sha256:<hex>``, the store's
    tree digest; None for a folder that has none) and metadata.json's digest, if any.

    `skip_bytecode` leaves `__pycache__` directories out: for a folder none of whose code will
    run, where the question is whether its sources are a build's (a standard import, such as
    the `kernels` package's, writes bytecode next to a Hub cache snapshot's sources).
    `follow_links` hashes what a file link points at: a Hugging Face cache snapshot's files are
    links into its blobs (a store tree never has links, and is checked without following)."""
    started = time.perf_counter()
    ctx = {"repo_id": repo_id, "revision": revision, "variant": variant}
    hint = (
        "the host's kernel store is damaged or was tampered with; an administrator should run "
        "`kerneldctl verify --repair` (the daemon's scrub also repairs it)"
    )

    def corrupt(detail: str) -> CorruptTree:
        return CorruptTree(f"{folder} failed verification: {detail}", hint=hint, **ctx)

    want_hex = digest.removeprefix("sha256:") if digest is not None else None
    if want_hex is not None and folder.name != want_hex:
        raise corrupt(f"the folder is not the tree {digest} names")
    root = str(folder)
    try:
        files = _files(root, skip_bytecode=skip_bytecode)
        meta_path = os.path.join(root, METADATA_FILE)
        meta_raw: bytes | None = None
        if any(full == meta_path for _rel, full in files):
            _meta_hashed, meta_raw = _hash(meta_path, None, follow_links=follow_links)
        claim = metadata_digest(meta_raw)
        extra = claim[0] if claim is not None and claim[0] != "sha256" else None
        hashed = {rel: _hash(full, extra, follow_links=follow_links)[0] for rel, full in files}
    except OSError as exc:
        raise corrupt(f"cannot read it: {exc}") from exc
    nbytes = sum(h.size for h in hashed.values())
    if claim is not None:
        bad = _metadata_mismatches(claim[0], claim[1], hashed)
        if bad:
            raise corrupt(f"{', '.join(bad)} do(es) not match metadata.json's digest")
    if want_hex is not None:
        ordered = sorted(hashed.items(), key=lambda item: item[0].encode("utf-8"))
        manifest = MANIFEST_HEADER + b"".join(
            manifest_line(h.mode, h.size, h.sha256, rel) for rel, h in ordered
        )
        got = hashlib.sha256(manifest).hexdigest()
        if got != want_hex:
            raise corrupt(
                f"its files hash to tree sha256:{got}, not {digest} (a file's content, size or "
                "mode changed, or a file was added or removed)"
            )
    return TreeCheck(
        len(hashed),
        nbytes,
        time.perf_counter() - started,
        tree_checked=want_hex is not None,
        metadata_checked=claim is not None,
    )
