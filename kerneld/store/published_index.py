"""The published index: small JSON files that map a request to a tree path.

Clients (training processes, any user) read these files on their warm path, without SQLite or
gRPC. The daemon rewrites a file atomically (write a temporary file, fsync, rename, fsync the
directory) whenever anything in it changes, so a reader sees either the old or the new document,
never a torn one. Files are mode 0644, directories 0755. Layout::

    <root>/index/v1/<org>/<name>.json     one per repo
    <root>/index/v1/denies.json           every deny of the store (for tools and overviews)

Per-repo document, format version 1 (all paths are relative to the store root)::

    {
      "format": "kerneld-client-index", "version": 1,
      "repo": "org/name",
      "generation": 42,                 # store-wide counter, grows with every write
      "written_at": 1767225600.0,       # unix time
      "refs": {"v1": {"commit": "<40 hex>", "fetched_at": 1767225600.0}, ...},
      "versions": [1, 2, 10],           # optional: every vN branch the upstream listed when a
                                        # version was last resolved (kernels' "version N is
                                        # available" notice); absent: never listed
      "commits": {
        "<40 hex>": {
          "upstream_variants": ["torch-cpu", ...] | null,   # every variant the upstream has,
                                                            # when known (null: unknown)
          "picks": {"torch2.13-cxx11-cpu-x86_64-linux": "torch-cpu" | null, ...},
                                    # optional: per fingerprint of a platform clients showed,
                                    # the variant it loads (null: none fits; see picks.py)
          "variants": {
            "torch-cpu": {
              "tree": "v1/trees/<64 hex>",       # the variant folder, read-only
              "digest": "sha256:<64 hex>",       # tree digest (canonical manifest hash)
              "lock": "locks/<64 hex>.lock",     # hold an OFD read lock while using the tree
              "metadata_id": "..." | null,       # metadata.json "id": the module name
              "backend": "cpu" | null,
              "archs": ["8.0", "9.0a", ...],
              "provenance": {                    # optional: the sigstore check at ingest
                "status": "verified" | "unsigned" | "invalid" | "unchecked",
                "signer": "...", "issuer": "..."  # set when verified
              }
            }
          }
        }
      },
      "denies": [{"revision": "*" | "<commit>" | "<ref>", "reason": "...", "created_at": 0.0}]
    }

    denies.json: {"format": "kerneld-denies", "version": 1, "generation": N, "written_at": T,
                  "denies": [{"repo": "org/name", "revision": "*", "reason": "...",
                              "created_at": 0.0}]}

    A repo's document carries the denies of every spelling of its id (the Hub resolves ids
    case-insensitively), and denies.json is matched the same way.

How a client uses it (see :func:`lookup` below, the reference implementation):

1. Read ``<org>/<name>.json``; a missing file or an unknown ``version`` is a miss (ask the daemon).
2. ``version=N`` means ref ``vN``; a ref is looked up in ``refs``; a 40-hex revision is a commit.
3. If a deny has ``revision`` ``"*"``, the requested revision or the resolved commit (or, for
   a commit prefix an older kerneld stored, abbreviates it): refuse (``deny_covers``).
4. Take ``picks[<this process's fingerprint>]``, else rank the variants yourself: the best of
   ``upstream_variants`` when known, else of ``variants``. If that variant is not in
   ``variants`` (not fetched yet), it is a miss.
5. Open ``lock`` read-only, take the OFD read lock (``F_OFD_SETLK``, ``F_RDLCK``; not ``flock``,
   whose exclusive lock any user who can read the file could hold), check the lock path still
   names the same inode (GC unlinks a lock file while it holds the OFD write lock), check the
   tree exists, then import from ``tree``. Keep the lock for the life of the process.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneld.errors import ErrorKind
from kerneld_client.published_index import DENIES_FORMAT, FORMAT, VERSION, parse_repo_doc

from .index import Index
from .layout import DIR_MODE_PUBLIC, FILE_MODE_PUBLIC, Layout, fsync_dir
from .picks import Picker

# The format's constants and its parser live in the client (one definition for both sides).
__all__ = [
    "DENIES_FORMAT",
    "FORMAT",
    "VERSION",
    "Denied",
    "IndexHit",
    "atomic_write_json",
    "build_denies_doc",
    "build_repo_doc",
    "clean_temporaries",
    "lookup",
    "remove",
]


def build_repo_doc(
    index: Index,
    layout: Layout,
    repo: str,
    generation: int,
    *,
    require_signed: bool = False,
    picker: Picker | None = None,
) -> dict[str, Any]:
    """`repo`'s document; with `require_signed` (``[provenance] policy = "require"``) a variant
    whose tree is not recorded as verified is left out, so a job asks the daemon, which says
    why it refuses. `picker` adds each commit's picks for the platforms clients showed."""
    commits: dict[str, dict[str, Any]] = {}
    upstream = index.all_upstream_variants(repo)
    for v in index.live_variants_of(repo):
        if require_signed and not (v.provenance and v.provenance.verified):
            continue
        entry = commits.setdefault(
            v.commit, {"upstream_variants": upstream.get(v.commit), "variants": {}}
        )
        variant: dict[str, Any] = {
            "tree": layout.tree_relpath(v.tree),
            "digest": f"sha256:{v.tree}",
            "lock": layout.lock_relpath(v.tree),
            "metadata_id": v.metadata_id,
            "backend": v.backend,
            "archs": v.archs,
        }
        if v.provenance is not None:
            variant["provenance"] = {
                "status": v.provenance.status,
                "signer": v.provenance.signer,
                "issuer": v.provenance.issuer,
            }
        entry["variants"][v.variant] = variant
    if picker is not None and picker.platforms:
        for entry in commits.values():
            upstream = entry["upstream_variants"]
            entry["picks"] = picker.picks(entry["variants"] if upstream is None else upstream)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "repo": repo,
        "generation": generation,
        "written_at": time.time(),
        "refs": {
            r.ref: {"commit": r.commit, "fetched_at": r.fetched_at} for r in index.refs_of(repo)
        },
        "commits": commits,
        "denies": [
            {k: v for k, v in row.items() if k != "repo"} for row in _deny_rows(index, repo)
        ],
    }
    versions = index.upstream_versions(repo)
    if versions is not None:
        doc["versions"] = versions
    return doc


def build_denies_doc(index: Index, generation: int) -> dict[str, Any]:
    return {
        "format": DENIES_FORMAT,
        "version": VERSION,
        "generation": generation,
        "written_at": time.time(),
        "denies": _deny_rows(index, None),
    }


def _deny_rows(index: Index, repo: str | None) -> list[dict[str, Any]]:
    """The deny rows of `repo` (any spelling; None: every repo) as readers match them."""
    return [
        {"repo": d.repo, "revision": d.revision, "reason": d.reason, "created_at": d.created_at}
        for d in index.denies(repo)
    ]


def atomic_write_json(path: Path, doc: dict[str, Any]) -> None:
    """Replace ``path`` with ``doc`` atomically; the result is world-readable."""
    path.parent.mkdir(mode=DIR_MODE_PUBLIC, parents=True, exist_ok=True)
    os.chmod(path.parent, DIR_MODE_PUBLIC)
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE_PUBLIC)
    try:
        os.fchmod(fd, FILE_MODE_PUBLIC)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def unchanged(path: Path, doc: dict[str, Any]) -> bool:
    """True if ``path`` already says what ``doc`` says (ignoring when and in which generation
    it was written) and is a public file of ours: a restart then has nothing to rewrite.

    ``doc`` is compared as built, so it must hold JSON's own types (lists, not tuples): a
    tuple compares unequal and only costs a rewrite. (A JSON round trip of every document
    made it safe against that, for a quarter of a 100,000-tree store's open.)"""
    volatile = ("generation", "written_at")
    try:
        st = os.lstat(path)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or stat.S_IMODE(st.st_mode) != FILE_MODE_PUBLIC
        ):
            return False
        existing = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    if not isinstance(existing, dict):
        return False
    return {k: v for k, v in existing.items() if k not in volatile} == {
        k: v for k, v in doc.items() if k not in volatile
    }


def remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


def clean_temporaries(layout: Layout) -> None:
    """Remove temporary files left by a crash in the middle of :func:`atomic_write_json`."""
    base = layout.published_index
    if not base.is_dir():
        return
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            if name.startswith(".") and name.endswith(".tmp"):
                Path(dirpath, name).unlink(missing_ok=True)


# --- reading (the client side; kept here as the executable specification) ---


@dataclass(frozen=True)
class IndexHit:
    repo: str
    commit: str
    variant: str
    tree: Path
    lock: Path
    digest: str
    metadata_id: str | None


class Denied(Exception):
    """The published index says this repo/revision is denied."""

    kind = ErrorKind.DENIED


def lookup(root: Path, repo: str, revision: str, variant: str) -> IndexHit | None:
    """Map (repo, revision, variant) to a tree via the published index; None is a miss.

    ``revision`` is a ref (``v1``, ``main``) or a 40-hex commit. Raises :class:`Denied`.
    The parsing is the client's own (``kerneld_client.published_index``): one format.
    """
    org, _, name = repo.partition("/")
    try:
        with open(root / "index" / "v1" / org / f"{name}.json", "rb") as f:
            doc = parse_repo_doc(f.read())
    except (OSError, ValueError):
        return None
    if doc is None:
        return None
    commit = doc.commit_for(revision)
    reason = doc.deny_reason(revision, commit)
    if reason is not None:
        raise Denied(reason)
    if commit is None or commit not in doc.commits:
        return None
    entry = doc.commits[commit].variants.get(variant)
    if entry is None:
        return None
    return IndexHit(
        repo=repo,
        commit=commit,
        variant=variant,
        tree=root / entry.tree,
        lock=root / entry.lock,
        digest=entry.digest,
        metadata_id=entry.metadata_id,
    )
