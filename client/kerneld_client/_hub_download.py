"""The `hub` fallback: download a kernel in-process, verified, when kerneld cannot provide it.

Used only under `KERNELD_FALLBACK=hub` and only when `huggingface_hub` is installed (it is
imported here, lazily). It does what the daemon does, for one process: resolve the revision,
list the variants, pick the best for this process, download the variant's files into a per-user
cache, hash every byte against the tree listing (LFS sha256, or the git blob sha1 of plain
files) and against `metadata.json`'s digest, and only then move the folder into place. A folder
in the cache was verified before it got its name, so a later process reuses it without hashing
again, and a 40-hex revision needs no network at all.

Publisher trust follows `kernels`: without `trust_remote_code`, the organisation must be a
trusted kernel publisher on the Hub.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneld_client.errors import (
    KernelDenied,
    KernelError,
    KernelLoadError,
    KernelNotFound,
    KernelUnavailable,
    NoCompatibleVariant,
    RevisionNotFound,
    UntrustedPublisher,
    VariantReason,
    VersionNotFound,
)
from kerneld_client.variants import PlatformFacts, decide
from kerneld_client.vocabulary import is_commit

__all__ = ["HubTree", "available", "fetch"]

REPO_TYPE = "kernel"
CHUNK = 1 << 20
_VARIANTS_FILE = "variants.json"
_NOT_HASHED = {"metadata.json", "metadata.json.sigstore"}
#: For the author of a kernel whose files changed after the build hashed them.
_REHASH = " (changed after the build? re-run its hash step, which rewrites metadata.json)"


@dataclass(frozen=True)
class HubTree:
    """A verified variant folder in the per-user cache."""

    repo_id: str
    commit: str
    variant: str
    path: Path
    cache_root: Path


@dataclass(frozen=True)
class _RemoteFile:
    path: str  # relative to the variant folder
    size: int
    sha256: str | None  # LFS files
    git_sha1: str | None  # plain git files


def available() -> bool:
    """Whether huggingface_hub is installed (the fallback is skipped otherwise)."""
    try:
        return importlib.util.find_spec("huggingface_hub") is not None
    except (ImportError, ValueError):
        return False


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    return "__pycache__" in parts or rel.endswith((".pyc", ".pyo"))


def _translate(exc: Exception, repo_id: str, revision: str) -> KernelError:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from kerneld_client._hub_errors import as_kernels_raises

    ctx = {"repo_id": repo_id, "revision": revision}
    if isinstance(exc, RevisionNotFoundError):
        return as_kernels_raises(
            RevisionNotFound("no such branch, tag or commit on the Hub", **ctx)
        )
    if isinstance(exc, RepositoryNotFoundError):
        return as_kernels_raises(KernelNotFound("no such kernel repository on the Hub", **ctx))
    if isinstance(exc, EntryNotFoundError):
        return KernelNotFound(f"missing on the Hub: {exc}", **ctx)
    return KernelUnavailable(f"the Hub could not be used: {exc!r}", **ctx)


def _check_publisher(api: Any, repo_id: str, trust_remote_code: bool | list[str]) -> None:
    if trust_remote_code is True:
        return
    if isinstance(trust_remote_code, list) and repo_id in trust_remote_code:
        return
    org = repo_id.split("/", 1)[0]
    try:
        info = api.get_organization_overview(org)
    except Exception as exc:
        raise KernelDenied(
            f"could not verify that {org} is a trusted kernel publisher: {exc!r}",
            repo_id=repo_id,
            hint="pass trust_remote_code=True or list the repo in trust_remote_code",
        ) from exc
    if not getattr(info, "trustedKernelPublisher", False):
        raise UntrustedPublisher(
            f"not from a trusted publisher: {org} is not a trusted kernel publisher",
            repo_id=repo_id,
            hint="pass trust_remote_code=True or list the repo in trust_remote_code",
        )


def _commit(api: Any, repo_id: str, version: int | None, revision: str | None) -> str:
    if version is not None:
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
        for branch in refs.branches:
            if branch.name == f"v{version}":
                return str(branch.target_commit)
        found = sorted(
            int(b.name[1:]) for b in refs.branches if b.name[:1] == "v" and b.name[1:].isdigit()
        )
        raise VersionNotFound(
            f"Version {version} not found, available versions: "
            f"{', '.join(map(str, found)) or 'none'}",
            repo_id=repo_id,
            revision=f"v{version}",
        )
    rev = revision or "main"
    if is_commit(rev):
        return rev
    sha = getattr(api.repo_info(repo_id, revision=rev, repo_type=REPO_TYPE), "sha", None)
    if not isinstance(sha, str) or not is_commit(sha):
        raise KernelUnavailable(f"the Hub named no commit for {rev}", repo_id=repo_id)
    return sha


def _listing(api: Any, repo_id: str, commit: str) -> dict[str, list[_RemoteFile]]:
    """Every variant of a commit with its files (paths relative to the variant folder)."""
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    variants: dict[str, list[_RemoteFile]] = {}
    entries = api.list_repo_tree(
        repo_id, "build", revision=commit, repo_type=REPO_TYPE, recursive=True
    )
    for entry in entries:
        parts = entry.path.split("/")
        if len(parts) < 2 or parts[0] != "build":
            continue
        if isinstance(entry, RepoFolder):
            if len(parts) == 2:
                variants.setdefault(parts[1], [])
            continue
        if not isinstance(entry, RepoFile) or len(parts) < 3:
            continue
        rel = "/".join(parts[2:])
        if _skipped(rel):
            continue
        if entry.lfs is not None:
            f = _RemoteFile(rel, int(entry.lfs.size), str(entry.lfs.sha256), None)
        else:
            f = _RemoteFile(rel, int(entry.size), None, str(entry.blob_id))
        variants.setdefault(parts[1], []).append(f)
    return variants


def _safe_rel(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _download(
    api: Any, repo_id: str, commit: str, variant: str, f: _RemoteFile, dest: Path
) -> None:
    """Stream one file to `dest`, hashing it; KernelUnavailable when it does not match."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(
        repo_id,
        f"build/{variant}/{f.path}",
        repo_type=REPO_TYPE,
        revision=commit,
        endpoint=api.endpoint,
    )
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\x00" % f.size, usedforsecurity=False)
    size = 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (
        get_session().stream(
            "GET", url, headers=build_hf_headers(token=api.token), follow_redirects=True
        ) as response,
        open(dest, "xb") as out,
    ):
        if response.status_code >= 400:
            response.read()
            hf_raise_for_status(response)
        for chunk in response.iter_bytes(CHUNK):
            size += len(chunk)
            if size > f.size:
                break
            sha256.update(chunk)
            sha1.update(chunk)
            out.write(chunk)
    ctx = {"repo_id": repo_id, "revision": commit, "variant": variant}
    if size != f.size:
        raise KernelUnavailable(f"{f.path}: got {size} bytes, the Hub listed {f.size}", **ctx)
    if f.sha256 is not None and sha256.hexdigest() != f.sha256:
        raise KernelUnavailable(f"{f.path}: sha256 does not match the Hub's LFS id", **ctx)
    if f.git_sha1 is not None and sha1.hexdigest() != f.git_sha1:
        raise KernelUnavailable(f"{f.path}: content does not match the Hub's git blob id", **ctx)


def _check_metadata_digest(folder: Path, files: list[_RemoteFile], ctx: dict[str, str]) -> None:
    """`metadata.json`'s digest, when present, must describe exactly the other files."""
    try:
        meta = json.loads((folder / "metadata.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KernelLoadError("the variant has no metadata.json", **ctx) from None
    except (OSError, ValueError) as exc:
        raise KernelLoadError(f"unreadable metadata.json: {exc}", **ctx) from exc
    digest = meta.get("digest") if isinstance(meta, dict) else None
    if digest is None:
        return
    algorithm = digest.get("algorithm") if isinstance(digest, dict) else None
    listed = digest.get("files") if isinstance(digest, dict) else None
    if algorithm not in ("sha256", "sha512") or not isinstance(listed, dict):
        raise KernelUnavailable(f"metadata.json has an unusable digest: {digest!r}", **ctx)
    present = {f.path for f in files} - _NOT_HASHED
    if set(listed) != present:
        diff = sorted(set(listed) ^ present)
        raise KernelUnavailable(f"metadata.json digest and files differ: {diff}{_REHASH}", **ctx)
    for rel, expected in listed.items():
        h = hashlib.new(algorithm)
        with open(folder / rel, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        try:
            want = base64.b64decode(str(expected), validate=True)
        except (binascii.Error, ValueError):
            raise KernelUnavailable(f"metadata.json digest of {rel} is not base64", **ctx) from None
        if h.digest() != want:
            raise KernelUnavailable(f"{rel} does not match metadata.json's digest{_REHASH}", **ctx)


def _seal(folder: Path) -> None:
    """Make the verified folder's contents read-only, and private to its user.

    The top stays writable by its owner until it has been renamed into place (then
    `_seal_top`): renaming a directory rewrites its ``..`` entry, which needs write permission
    on it, and a process that is not root has no way around that.
    """
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames:
            p = os.path.join(dirpath, name)
            os.chmod(p, 0o500 if os.stat(p).st_mode & 0o100 else 0o400)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o500)
    os.chmod(folder, 0o700)


def _seal_top(folder: Path) -> None:
    os.chmod(folder, 0o500)


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def fetch(
    repo_id: str,
    *,
    version: int | None,
    revision: str | None,
    facts: PlatformFacts,
    cache_root: Path,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict[str, str] | None = None,
) -> HubTree:
    """Resolve, download and verify the best variant for `facts`; reuse a verified copy."""
    from huggingface_hub import HfApi

    ref = f"v{version}" if version is not None else (revision or "main")
    api = HfApi(library_name="kerneld_client", user_agent=user_agent)
    org, _, name = repo_id.partition("/")
    try:
        commit = _commit(api, repo_id, version, revision)  # no request for a commit
        base = cache_root / f"{org}--{name}" / commit
        known = _cached_variants(base)
        if known is not None:
            best = _best(known, facts, repo_id, commit)
            if (base / best / "metadata.json").is_file():
                # Verified (and its publisher trusted) when it was downloaded.
                return HubTree(repo_id, commit, best, base / best, cache_root)
        _check_publisher(api, repo_id, trust_remote_code)
        listing = _listing(api, repo_id, commit)
        best = _best(sorted(listing), facts, repo_id, commit)
        final = base / best
        if (final / "metadata.json").is_file():
            return HubTree(repo_id, commit, best, final, cache_root)
        files = listing[best]
        bad = [f.path for f in files if not _safe_rel(f.path)]
        if bad:
            raise KernelUnavailable(f"unsafe paths in the Hub listing: {bad}", repo_id=repo_id)
        _private_dir(base)
        tmp = Path(tempfile.mkdtemp(prefix=f".{best}.", dir=base))
        try:
            for f in files:
                _download(api, repo_id, commit, best, f, tmp / f.path)
            ctx = {"repo_id": repo_id, "revision": commit, "variant": best}
            _check_metadata_digest(tmp, files, ctx)
            _seal(tmp)
            try:
                os.rename(tmp, final)
                _seal_top(final)
            except OSError:
                if not (final / "metadata.json").is_file():
                    raise
        finally:
            if tmp.exists():
                _remove(tmp)
        _write_variants(base, sorted(listing))
        return HubTree(repo_id, commit, best, final, cache_root)
    except KernelError:
        raise
    except Exception as exc:
        raise _translate(exc, repo_id, ref) from exc


def _best(names: list[str], facts: PlatformFacts, repo_id: str, commit: str) -> str:
    decisions = decide(names, facts)
    if not decisions or not decisions[0].accepted:
        raise NoCompatibleVariant(
            f"no build variant on the Hub fits this platform ({facts.describe()})",
            reasons=[VariantReason(d.variant, d.accepted, d.reason) for d in decisions],
            repo_id=repo_id,
            revision=commit,
        )
    return decisions[0].variant


def _cached_variants(base: Path) -> list[str] | None:
    try:
        doc = json.loads((base / _VARIANTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(doc, list) and all(isinstance(v, str) for v in doc):
        return doc
    return None


def _write_variants(base: Path, names: list[str]) -> None:
    """Remember a commit's variant names (immutable) so a cached commit needs no listing."""
    tmp = base / f".{_VARIANTS_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(names), encoding="utf-8")
        os.chmod(tmp, 0o644)
        os.replace(tmp, base / _VARIANTS_FILE)
    except OSError:
        tmp.unlink(missing_ok=True)


def _remove(path: Path) -> None:
    """Remove a (possibly sealed) temporary folder."""
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
    shutil.rmtree(path, ignore_errors=True)
