"""The warm fast path's checks of the store: who owns the store root, the daemon's advert, the
published index documents and a tree, and who could replace them.

The same rules as `_path_trust`, `locations` and `published_index` (whose docstrings say why
each exists), written for the one case `_warm` serves and without their imports: every function
raises `Miss` where the staged loader would raise, refuse or have to look further (NSS, a
malformed document, anything unexpected), and the staged loader then decides and says why.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from kerneld_client._loads import setting
from kerneld_client.vocabulary import repo_key


class Miss(Exception):
    """Not a warm hit this module serves: the staged loader decides (and says why)."""


_owner_memo: tuple[str, int] | None = None


def _owner_uid() -> int | None:
    """`_config.store_owner_uid()` where /etc/passwd or the variable answers; Miss where NSS
    would have to (the staged loader asks it)."""
    global _owner_memo
    raw = setting("KERNELD_STORE_OWNER").strip()
    if raw.isdigit():
        return int(raw)
    config = sys.modules.get("kerneld_client._config")
    if config is not None:
        return config.store_owner_uid()  # type: ignore[no-any-return]
    if _owner_memo is not None and _owner_memo[0] == raw:
        return _owner_memo[1]
    name = (raw or "kerneld").encode("utf-8", "surrogateescape")
    try:
        data = b"\n" + read_file("/etc/passwd", 4 << 20)
    except OSError:
        raise Miss from None
    start = data.find(b"\n" + name + b":")
    if start < 0:
        raise Miss
    end = data.find(b"\n", start + 1)
    fields = data[start + 1 : end if end >= 0 else None].split(b":")
    if len(fields) > 2 and fields[2].isdigit():
        _owner_memo = (raw, int(fields[2]))
        return _owner_memo[1]
    raise Miss


def _pure(path: str) -> str:
    """`str(Path(path))`, pathlib's normal form (no empty or `.` parts, no trailing slash, a
    leading `//` kept as POSIX allows), without building a Path: three of those cost the first
    warm call more than the rest of its string work. TypeError for what Path refuses."""
    if not isinstance(path, str):
        raise TypeError(f"expected a str, not {type(path).__name__}")
    rest = path.lstrip("/")
    lead = len(path) - len(rest)
    root = "//" if lead == 2 else "/" if lead else ""
    parts = rest.split("/")
    if "" in parts or "." in parts:
        parts = [p for p in parts if p and p != "."]
    return root + "/".join(parts) or "."


def _parent(path: str) -> str:
    """`str(Path(path).parent)` of a `_pure` path whose last part is a name."""
    cut = path.rfind("/")
    if cut < 0:
        return "."
    if cut == 1 and path.startswith("//"):
        return "//"  # `//name`: the root POSIX leaves to the implementation, kept by pathlib
    return path[:cut] or "/"


def read_file(path: str, limit: int) -> bytes:
    """`open(path, "rb").read(limit)` in half the system calls: no buffered reader (its fstat,
    isatty ioctl and lseeks) and no `limit`-sized buffer (4 MiB for /etc/passwd: an mmap)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunk_size, chunks = os.fstat(fd).st_size + 1, []
        while limit > 0 and (chunk := os.read(fd, min(limit, max(chunk_size, 1 << 16)))):
            chunks.append(chunk)
            limit -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid()) or uid == _owner_uid()


def _dirs(path: str, seen: dict[str, os.stat_result]) -> list[os.stat_result] | None:
    """`lstat` of "/" and of every component of `path` (absolute, normal), each directory
    looked at once per check (`seen`: the advert's chain and the store root's share their top);
    None where a component is not a directory, i.e. where `path` is not its own `realpath`."""
    prefixes, end = ["/"], 0
    while path != "/" and end >= 0:
        end = path.find("/", end + 1)
        prefixes.append(path if end < 0 else path[:end])
    chain = []
    for prefix in prefixes:
        st = seen.get(prefix)
        if st is None:
            st = seen[prefix] = os.lstat(prefix)
        if not stat.S_ISDIR(st.st_mode):
            return None
        chain.append(st)
    return chain


def _real_dirs(path: str, seen: dict[str, os.stat_result]) -> tuple[str, list[os.stat_result]]:
    """(`os.path.realpath(path)`, `lstat` of "/" and of each of its components): one top-down
    `lstat` walk proves a normal absolute path of directories to be its own real path, so
    `realpath` (pure Python, a second `lstat` per component) runs only where a link is."""
    if os.path.isabs(path) and os.path.normpath(path) == path and not path.startswith("//"):
        chain = _dirs(path, seen)
        if chain is not None:
            return path, chain
    real = os.path.realpath(path)
    chain = _dirs(real, seen)
    if chain is None:
        raise Miss  # a component of the real path is not a directory
    return real, chain


def _check_ancestors(chain: list[os.stat_result], child_uid: int) -> None:
    """`_path_trust.check_ancestors` over `lstat`s of the directories above a path, "/" first:
    each trusted-owned, and writable by nobody else unless sticky with a trusted-owned entry
    below."""
    mine = (0, os.geteuid())  # `_trusted` without a system call per directory ...
    owner: int | None = -1  # ... and `_owner_uid` asked once, where a uid is neither
    for st in reversed(chain):
        if st.st_uid not in mine:
            owner = _owner_uid() if owner == -1 else owner
            if st.st_uid != owner:
                raise Miss
        if st.st_mode & 0o022:  # writable by others: only sticky, above a trusted entry
            if not st.st_mode & stat.S_ISVTX:
                raise Miss
            if child_uid not in mine:
                owner = _owner_uid() if owner == -1 else owner
                if child_uid != owner:
                    raise Miss
        child_uid = st.st_uid


def _socket() -> str:
    """`locations.default_socket()`."""
    env = setting("KERNELD_SOCKET")
    if env:
        return _pure(env)
    if os.path.exists("/run/kerneld/kerneld.sock"):
        return "/run/kerneld/kerneld.sock"
    runtime = setting("XDG_RUNTIME_DIR")
    if runtime:
        user = Path(runtime, "kerneld", "kerneld.sock")
    else:
        home = setting("HOME")
        if not home:
            raise Miss
        user = Path(setting("XDG_CACHE_HOME") or Path(home, ".cache"), "kerneld/run/kerneld.sock")
    if not user.exists() and os.path.isdir("/run/kerneld"):
        return "/run/kerneld/kerneld.sock"
    return str(user)


def _identity() -> tuple[object, ...]:
    """`locations.store_identity()`: what names the store (Miss: the defaults do)."""
    env = setting("KERNELD_STORE")
    if env:
        return ("KERNELD_STORE", env if os.path.isabs(env) else os.path.join(os.getcwd(), env))
    advert = _socket() + ".json"
    try:
        st = os.lstat(advert)
    except OSError:
        raise Miss from None
    return (advert, st.st_dev, st.st_ino, st.st_ctime_ns)


def _advert_store(seen: dict[str, os.stat_result]) -> tuple[str, tuple[object, ...]]:
    """The store the daemon's advert names, checked as `_path_trust.check_advert` checks it,
    and the advert's identity from the same `fstat`."""
    path = _pure(_socket() + ".json")
    parent, chain = _real_dirs(_parent(path), seen)
    real = os.path.join(parent, path[path.rfind("/") + 1 :])
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise Miss from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _trusted(st.st_uid) or st.st_mode & 0o022:
            raise Miss
        _check_ancestors(chain, st.st_uid)
        data = os.read(fd, (64 << 10) + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8"))
        if len(data) > 64 << 10 or doc["format"] != "kerneld-advert" or doc["version"] != 1:
            raise Miss
        if not all(type(doc[key]) is str for key in ("index_dir", "user_socket", "admin_socket")):
            raise Miss  # what `Path(doc[key])` refuses of a JSON value
        int(doc["pid"])
        str(doc["daemon_version"])
        store = _pure(doc["store_root"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise Miss from None
    return store, (path, st.st_dev, st.st_ino, st.st_ctime_ns)


#: (what named the store, its real path, its owner, (dev, inode, ctime) of the checked root)
_root_memo: tuple[tuple[object, ...], str, int, tuple[int, ...]] | None = None


def store_root() -> tuple[str, int]:
    """(real path, owner uid) of the store, checked as `loading.loaded.store_root()` checks it,
    in full once per process and store."""
    global _root_memo
    memo = _root_memo
    if memo is not None and memo[0] == _identity():
        try:
            st = os.lstat(memo[1])
            if (st.st_dev, st.st_ino, st.st_ctime_ns) == memo[3]:
                return memo[1], memo[2]
        except OSError:
            pass
    seen: dict[str, os.stat_result] = {}  # this check's lstats: each directory looked at once
    if setting("KERNELD_STORE"):
        named, path = _identity(), _pure(setting("KERNELD_STORE"))
    else:
        path, named = _advert_store(seen)
    try:
        real, chain = _real_dirs(path, seen)
    except OSError:
        raise Miss from None
    if real == "/":
        raise Miss
    st = chain.pop()
    if not _trusted(st.st_uid) or st.st_mode & 0o022:
        raise Miss
    _check_ancestors(chain, st.st_uid)
    _root_memo = (named, real, st.st_uid, (st.st_dev, st.st_ino, st.st_ctime_ns))
    return real, st.st_uid


def _read_trusted(path: str, owner: int) -> Any:
    """A published index file parsed (`published_index._read_trusted`'s checks); Miss when
    absent, not the store owner's, writable by others or not JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        raise Miss from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
            raise Miss
        if st.st_size > 16 << 20:
            raise Miss
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        raise Miss from None


def index_doc(root: str, owner: int, repo: str) -> dict[str, Any]:
    """The repo's published document, read and checked."""
    org, _, name = repo.partition("/")
    return _checked_doc(_read_trusted(f"{root}/index/v1/{org}/{name}.json", owner), repo)


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _checked_doc(doc: Any, repo: str) -> dict[str, Any]:
    """The per-repo document if `published_index.parse_repo_doc` accepts all of it and it
    describes `repo`; Miss otherwise (a malformed document is a question for the daemon)."""
    if not isinstance(doc, dict) or doc.get("format") != "kerneld-client-index":
        raise Miss
    if doc.get("version") != 1 or doc.get("repo") != repo:
        raise Miss
    int(doc.get("generation") or 0)
    for ref, v in (doc.get("refs") or {}).items():
        if not isinstance(ref, str) or not isinstance(v["commit"], str):
            raise Miss
        float(v.get("fetched_at") or 0.0)
    for entry in (doc.get("commits") or {}).values():
        upstream, picks = entry.get("upstream_variants"), entry.get("picks") or {}
        if upstream is not None and not _strs(upstream):
            raise Miss
        if not isinstance(picks, dict) or not all(
            isinstance(p, str) or p is None for p in picks.values()
        ):
            raise Miss
        for raw in (entry.get("variants") or {}).values():
            prov = raw.get("provenance")
            if not _strs(raw.get("archs") or []) or not _strs(
                [raw.get("tree"), raw.get("digest"), raw.get("lock")]
            ):
                raise Miss
            if prov is not None and not (
                isinstance(prov, dict)
                and all(isinstance(prov.get(k, ""), str) for k in ("status", "signer", "issuer"))
            ):
                raise Miss
    for d in doc.get("denies") or []:
        if not isinstance(d["revision"], str):
            raise Miss
    versions = doc.get("versions")
    if versions is not None and not (
        isinstance(versions, list) and all(type(v) is int and v >= 0 for v in versions)
    ):
        raise Miss
    return doc


def publisher_trusted(root: str, owner: int, repo: str, trust_remote_code: bool) -> None:
    """The daemon's `[trust]` verdict as published (`published_index.Publishers.trusts`);
    Miss unless it is a plain yes (no file: a store never served by a checking daemon)."""
    try:
        doc = _read_trusted(root + "/index/v1/publishers.json", owner)
    except Miss:
        if os.path.lexists(root + "/index/v1/publishers.json"):
            raise
        return
    if doc.get("format") != "kerneld-publishers" or doc.get("version") != 1:
        raise Miss
    policy, allow = doc["policy"], doc.get("allow") or []
    orgs = {**(doc.get("orgs") or {}), **(doc.get("repos") or {})}
    trusted_orgs = {repo_key(o) for o, v in orgs.items() if v.get("trusted") is True}
    if not isinstance(policy, str) or not _strs(allow):
        raise Miss
    if policy == "any" or (trust_remote_code and doc.get("honor_trust_remote_code") is True):
        return
    names = (repo_key(repo.split("/", 1)[0]), repo_key(repo))
    if policy == "hub" and any(n in trusted_orgs for n in names):
        return
    key = repo_key(repo)
    for pattern in map(repo_key, allow):
        if "?" in pattern or "[" in pattern:
            raise Miss  # fnmatch's patterns: the staged loader's
        first, *rest = pattern.split("*")
        if not rest:
            if key == pattern:
                return
            continue
        last, pos = rest.pop(), len(first)
        end = len(key) - len(last)
        if end < pos or not (key.startswith(first) and key.endswith(last)):
            continue
        for part in rest:
            found = key.find(part, pos, end)
            if found < 0:
                break
            pos = found + len(part)
        else:
            return
    raise Miss


def check_tree(root: str, real: str, owner: int) -> None:
    """`_path_trust.check_real_tree`: every directory from the root down and every entry of the
    tree owned by the store owner and writable by nobody else; symlinks only inside it."""
    current = root
    for part in real[len(root) + 1 :].split("/"):
        current = current + "/" + part
        st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
            raise Miss
    stack = [real]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != owner or st.st_mode & 0o022:
                    raise Miss
                if stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(entry.path)
                    if target != real and not target.startswith(real + "/"):
                        raise Miss
                elif stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif not stat.S_ISREG(st.st_mode):
                    raise Miss


def clean(rel: Any) -> bool:
    """A relative path of plain names (no `.`, `..`, empty part): real below a real root."""
    return isinstance(rel, str) and all(p not in ("", ".", "..") for p in rel.split("/"))
