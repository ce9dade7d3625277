"""Read access to the git repositories the test Hub serves: refs, commits, trees with their
LFS pointers parsed, objects, through one long-lived `git cat-file --batch` per repository.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

HEX40 = re.compile(r"[0-9a-f]{40}")
LFS_POINTER = re.compile(
    rb"version https://git-lfs\.github\.com/spec/v1\noid sha256:([0-9a-f]{64})\nsize ([0-9]+)\n"
)
LFS_POINTER_MAX = 1024  # the git-lfs spec caps pointer files at 1024 bytes


def hub_date(epoch: int) -> str:
    """The Hub's date format, exactly: `2026-01-01T00:00:00.000Z`."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclass(frozen=True)
class Entry:
    """One path of a commit's tree, with what the Hub reports about it."""

    path: str
    type: Literal["file", "directory"]
    oid: str  # git blob or tree id (sha1)
    size: int  # real size (LFS: the object's size)
    lfs_oid: str | None = None  # sha256 for LFS files
    pointer_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == "directory":
            return {"type": "directory", "oid": self.oid, "size": 0, "path": self.path}
        out: dict[str, Any] = {
            "type": "file",
            "oid": self.oid,
            "size": self.size,
            "path": self.path,
        }
        if self.lfs_oid is not None:
            out["lfs"] = {"oid": self.lfs_oid, "size": self.size, "pointerSize": self.pointer_size}
        return out


_GIT_ENV = {
    **{k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_INDEX_FILE")},
    "LC_ALL": "C",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


def _git(git_dir: Path, *args: str) -> bytes:
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", "--git-dir", str(git_dir), *args],
        capture_output=True,
        check=False,
        env=_GIT_ENV,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout


class GitBackend:
    """Read access to one repository: refs (fresh on every call), and per-commit data (cached,
    commits being immutable) through one long-lived `git cat-file --batch` process."""

    def __init__(self, git_dir: Path) -> None:
        self.git_dir = git_dir
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._trees: dict[str, dict[str, Entry]] = {}
        self._dates: dict[str, int] = {}

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                with contextlib.suppress(OSError):
                    assert self._proc.stdin is not None
                    self._proc.stdin.close()
                self._proc.kill()
                self._proc.wait()
                self._proc = None

    # -- objects

    def _batch(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [
                    "git",
                    "-c",
                    "safe.directory=*",
                    "--git-dir",
                    str(self.git_dir),
                    "cat-file",
                    "--batch",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=_GIT_ENV,
            )
        return self._proc

    def read_object(self, name: str) -> tuple[str, bytes] | None:
        """(type, content) of object `name` (a full hex id), or None if missing. A miss is asked
        again of a fresh process, in case the repo was replaced under the running one."""
        with self._lock:
            for attempt in range(2):
                proc = self._batch()
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(name.encode() + b"\n")
                proc.stdin.flush()
                header = proc.stdout.readline().split()
                if len(header) == 3:
                    data = proc.stdout.read(int(header[2]))
                    proc.stdout.read(1)
                    return header[1].decode(), data
                if attempt == 0:
                    proc.kill()
                    proc.wait()
            return None

    # -- refs

    def refs(self) -> dict[str, str]:
        """refname -> commit id, for branches, tags (peeled), converts and PRs."""
        out = _git(
            self.git_dir,
            "for-each-ref",
            "--format=%(refname)%00%(objectname)%00%(objecttype)%00%(*objectname)%00%(*objecttype)",
            "refs/heads",
            "refs/tags",
            "refs/convert",
            "refs/pr",
        )
        refs: dict[str, str] = {}
        for line in out.decode().splitlines():
            name, oid, otype, peeled, ptype = line.split("\0")
            if peeled:
                oid, otype = peeled, ptype
            if otype == "commit":
                refs[name] = oid
        return refs

    def default_ref(self) -> str:
        head = (self.git_dir / "HEAD").read_text().strip()
        return head[len("ref: ") :] if head.startswith("ref: ") else head

    def resolve(self, rev: str) -> str | None:
        """Commit id for a branch, tag, full ref name or 40-hex commit id; None if unknown."""
        if HEX40.fullmatch(rev):
            obj = self.read_object(rev)
            return rev if obj is not None and obj[0] == "commit" else None
        refs = self.refs()
        candidates = [rev] if rev.startswith("refs/") else [f"refs/heads/{rev}", f"refs/tags/{rev}"]
        for cand in candidates:
            if cand in refs:
                return refs[cand]
        return None

    def commit_epoch(self, commit: str) -> int:
        if commit not in self._dates:
            obj = self.read_object(commit)
            assert obj is not None
            for line in obj[1].split(b"\n"):
                if line.startswith(b"committer "):
                    self._dates[commit] = int(line.rsplit(b" ", 2)[1])
                    break
                if not line:
                    break
        return self._dates.get(commit, 0)

    def tree(self, commit: str) -> dict[str, Entry]:
        """Every path of `commit` (directories included) in git's order, LFS pointers parsed."""
        cached = self._trees.get(commit)
        if cached is not None:
            return cached
        out = _git(self.git_dir, "ls-tree", "-r", "-t", "-l", "-z", commit)
        entries: dict[str, Entry] = {}
        for rec in out.split(b"\0"):
            if not rec:
                continue
            meta, _, raw_path = rec.partition(b"\t")
            _mode, otype, oid, size = meta.decode().split()
            path = raw_path.decode()
            if otype == "tree":
                entries[path] = Entry(path=path, type="directory", oid=oid, size=0)
            elif otype == "blob":
                entries[path] = self._blob_entry(path, oid, int(size))
        self._trees[commit] = entries
        return entries

    def _blob_entry(self, path: str, oid: str, size: int) -> Entry:
        if size <= LFS_POINTER_MAX:
            obj = self.read_object(oid)
            m = LFS_POINTER.fullmatch(obj[1]) if obj is not None else None
            if m is not None:
                return Entry(
                    path=path,
                    type="file",
                    oid=oid,
                    size=int(m.group(2)),
                    lfs_oid=m.group(1).decode(),
                    pointer_size=size,
                )
        return Entry(path=path, type="file", oid=oid, size=size)

    def lfs_object_path(self, oid: str) -> Path:
        return self.git_dir / "lfs" / "objects" / oid[:2] / oid[2:4] / oid

    def last_commit(self, commit: str, path: str) -> dict[str, str]:
        out = _git(self.git_dir, "log", "-1", "--format=%H%x00%ct%x00%s", commit, "--", path)
        sha, ts, title = out.decode().strip().split("\0", 2)
        return {"id": sha, "title": title, "date": hub_date(int(ts))}


def find_git_dir(repo_dir: Path) -> Path | None:
    """The git directory of a non-bare (`repo/.git`) or bare (`repo/` itself) repository."""
    if (repo_dir / ".git").is_dir():
        return repo_dir / ".git"
    if (repo_dir / "HEAD").is_file() and (repo_dir / "objects").is_dir():
        return repo_dir
    return None
