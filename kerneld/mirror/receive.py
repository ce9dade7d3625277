"""Write a mirror export that the daemon streams: the caller's side of `kerneldctl mirror export`.

The daemon runs sandboxed (`ProtectSystem=strict`, a private /tmp) as its own user, so a file
it wrote at a caller-chosen path would land in the wrong place, or nowhere the admin can see,
or somewhere the admin could not have written. Instead the daemon streams the files
(`kerneld.mirror.export.export_stream`) and this module, in the admin's own `kerneldctl`
process, writes them where the admin asked, with the admin's permissions:

- a `.tar` destination is assembled in a staging directory beside it (seeded from the existing
  tar, read through the import checks) and renamed into place only when the stream ended well;
  on any failure the staging directory and the partial tar are removed and an existing tar is
  left as it was;
- a directory destination gets each file atomically (temp + rename), blobs before the manifests
  that name them, as an export from a store does;
- signatures are made here too, with the admin's own keys (`sign_with`): the daemon never reads
  a private key that belongs to a person, and an admin's key directory is not the daemon's to
  read anyway.

Every streamed path is checked against the mirror layout and every blob against its sha256,
so a confused (or hostile) daemon can neither write outside the destination nor corrupt it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO

from kerneld.mirror.destination import ExportError, check_mirror_dir, check_stream_path
from kerneld.mirror.documents import INFO, Manifest, MirrorFormatError, MirrorWriter, refs_path
from kerneld.mirror.keys import SIG_SUFFIX, SigningKey, sig_path
from kerneld.mirror.tarball import is_tar_destination, pack_tar, unpack_existing
from kerneld.mirror.writing import merged_signatures

#: A destination document larger than this is not sent to the daemon (it is not a manifest).
_MAX_EXISTING_DOC = 16 << 20


class _Incoming:
    """The file being received: a temp file beside its final path, hashed as it is written."""

    def __init__(self, root: Path, rel: str, size: int, sha256: str | None) -> None:
        self.rel = rel
        self.size = size
        self.sha256 = sha256
        self.final = root / rel
        self.final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.final.parent, prefix=".tmp-")
        self.tmp = Path(tmp)
        self.fh: IO[bytes] = os.fdopen(fd, "wb")
        self.hash = hashlib.sha256()
        self.received = 0

    def write(self, data: bytes) -> bool:
        """Append; True once the declared size is complete."""
        self.received += len(data)
        if self.received > self.size:
            raise ExportError(
                f"{self.rel}: the daemon sent more than the {self.size} bytes it announced"
            )
        self.fh.write(data)
        self.hash.update(data)
        return self.received == self.size

    def finish(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        if self.sha256 is not None and self.hash.hexdigest() != self.sha256:
            raise ExportError(
                f"{self.rel}: the bytes received do not match their sha256; nothing was "
                "written (run the export again; if it repeats, `kerneldctl verify` the store)"
            )
        os.chmod(self.tmp, 0o644)
        os.replace(self.tmp, self.final)

    def discard(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


class ExportReceiver:
    """Receives a streamed export into `dest` (a directory, or a file ending in `.tar`).

    Use as a context manager: `existing()` before the request, `handle()` per file event,
    `commit()` at the end of a successful stream; leaving the block without `commit()` (an
    error, a cancelled RPC) removes whatever was half-written.
    """

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.tar = is_tar_destination(dest)
        self._current: _Incoming | None = None
        self._staging: Path | None = None
        self._committed = False
        self._keys: list[SigningKey] = []
        self._documents: set[str] = set()  # manifests and refs of this export, to sign
        if self.tar:
            if dest.is_dir():
                raise ExportError(f"{dest} is a directory; a .tar destination must be a file")
            parent = dest.parent
            if not parent.is_dir():
                raise ExportError(f"{parent} does not exist: create the directory first")
            try:
                self._staging = Path(tempfile.mkdtemp(dir=parent, prefix=f".{dest.name}.staging-"))
            except OSError as exc:
                raise ExportError(
                    f"cannot write in {parent}: {exc.strerror or exc} (kerneldctl writes the "
                    "export itself, as you: choose a directory you may write)"
                ) from None
            try:
                if dest.exists():
                    unpack_existing(dest, self._staging)
            except BaseException:
                shutil.rmtree(self._staging, ignore_errors=True)
                raise
            self.root = self._staging
        else:
            check_mirror_dir(dest)
            self.root = dest

    def __enter__(self) -> ExportReceiver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._committed:
            self.abort()

    def sign_with(self, keys: list[SigningKey]) -> None:
        """Sign every manifest and refs file of the exported repos with `keys` at `commit()`."""
        self._keys = list(keys)

    def existing(self, repos: set[str]) -> tuple[dict[str, bytes], list[str]]:
        """The destination's documents about `repos` and the blobs their manifests name that it
        has: what the daemon needs to merge into this mirror and send only what changes."""
        docs: dict[str, bytes] = {}
        present: set[str] = set()
        if not self.root.is_dir():
            return docs, []
        writer = MirrorWriter(self.root)
        wanted = [INFO]
        for repo in sorted(repos):
            wanted.append(refs_path(repo))
            mdir = self.root / "manifests" / repo
            if mdir.is_dir():
                wanted += [f"manifests/{repo}/{p.name}" for p in sorted(mdir.glob("*.json"))]
        for rel in wanted:
            for path in (rel, sig_path(rel)) if rel != INFO else (rel,):
                data = _read_small(self.root / path)
                if data is None:
                    continue
                try:
                    check_stream_path(path)
                except ValueError:
                    continue
                docs[path] = data
            if rel != INFO and rel in docs:
                self._documents.add(rel)
            if rel.startswith("manifests/") and rel in docs:
                repo, commit = rel[len("manifests/") : -len(".json")].rsplit("/", 1)
                try:
                    manifest = Manifest.from_json(docs[rel], repo_id=repo, commit=commit)
                except MirrorFormatError:
                    continue
                for files in manifest.variants.values():
                    for f in files:
                        if f.sha256 and writer.has_blob(f.sha256, f.size):
                            present.add(f.sha256)
        return docs, sorted(present)

    def handle(self, kind: str, rel: str, size: int, data: bytes) -> None:
        """One file event of the stream: `file` (starts `rel`), `data`, `delete`."""
        try:
            sha = check_stream_path(rel)
        except ValueError as exc:
            raise ExportError(f"the daemon sent a file outside the mirror layout: {exc}") from None
        if kind == "delete":
            if self._current is not None:
                raise ExportError(f"the stream deleted {rel} while {self._current.rel} was open")
            (self.root / rel).unlink(missing_ok=True)
            self._documents.discard(rel)
            return
        if kind == "file":
            if self._current is not None:
                raise ExportError(f"the stream started {rel} before {self._current.rel} ended")
            self._current = _Incoming(self.root, rel, size, sha)
        elif self._current is None or self._current.rel != rel:
            raise ExportError(f"the stream sent bytes of {rel}, which was not started")
        if self._current.write(data) or size == 0:
            current, self._current = self._current, None
            try:
                current.finish()
            except BaseException:
                current.discard()
                raise
            if sha is None and rel != INFO and not rel.endswith(SIG_SUFFIX):
                self._documents.add(rel)

    def commit(self) -> None:
        """The stream ended well: a tar is packed and renamed into place."""
        if self._current is not None:
            raise ExportError(
                f"the export stream ended inside {self._current.rel} "
                f"({self._current.received} of {self._current.size} bytes); nothing was kept"
            )
        if self._keys:
            self._sign()
        if self.tar:
            assert self._staging is not None
            pack_tar(self._staging, self.dest)
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        self._committed = True

    def _sign(self) -> None:
        for rel in sorted(self._documents):
            data = (self.root / rel).read_bytes()
            sig_rel = sig_path(rel)
            sig = merged_signatures(rel, data, _read_small(self.root / sig_rel), self._keys)
            if sig is None:
                continue
            incoming = _Incoming(self.root, sig_rel, len(sig), None)
            try:
                incoming.write(sig)
                incoming.finish()
            except BaseException:
                incoming.discard()
                raise

    def abort(self) -> None:
        if self._current is not None:
            self._current.discard()
            self._current = None
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None


def _read_small(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_MAX_EXISTING_DOC + 1)
    return data if len(data) <= _MAX_EXISTING_DOC else None
