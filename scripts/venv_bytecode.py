"""Compile a venv's site-packages, reusing the bytecode an earlier bootstrap compiled from the
same files (scripts/bootstrap).

Every fresh clone's bootstrap installs the same ~120 distributions and then compiled ~12,500
files again: 18-26 s of a 2-core machine, a third of the bootstrap (bench/SUITE.md). The files
are the same bytes each time; only their paths and modification times differ. So the compiled
files are kept in a per-user cache under a key of every installed distribution's RECORD (name,
version, and the sha256 of each file) and the interpreter's bytecode magic. On a hit, each kept
file whose source still has the sha256 its RECORD names is written back with the header
`compileall` would write today: the source's size and modification time (a timestamp pyc holds
nothing else of its source; the import system fixes `co_filename` to the file's path when it
loads it). `compileall` then runs as before and compiles whatever was not restored.

Editable installs (this checkout's kerneld and kerneld-client) are left out: their files hold
the checkout's path.

    python scripts/venv_bytecode.py SITE_PACKAGES CACHE_DIR
"""

from __future__ import annotations

import base64
import compileall
import hashlib
import importlib.util
import io
import json
import os
import sys
import tarfile
from pathlib import Path

#: Kept entries per cache folder (one per set of installed versions), newest first.
KEEP = 2


def distributions(site: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """(dist-info folder, [(path, "sha256=...")]) of every non-editable distribution, its files
    in site-packages only: its scripts in the venv's bin/ hold the venv's path."""
    found = []
    for info in sorted(site.glob("*.dist-info")):
        try:
            direct = json.loads((info / "direct_url.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            direct = {}
        if isinstance(direct, dict) and (direct.get("dir_info") or {}).get("editable"):
            continue
        try:
            lines = (info / "RECORD").read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        rows = [line.rsplit(",", 2) for line in lines]
        inside = [(r[0], r[1]) for r in rows if len(r) == 3 and r[1] and _inside(r[0])]
        found.append((info.name, inside))
    return found


def _inside(path: str) -> bool:
    return not path.startswith("/") and ".." not in Path(path).parts


def cache_key(dists: list[tuple[str, list[tuple[str, str]]]]) -> str:
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER + sys.version.encode())
    digest.update(json.dumps(dists, sort_keys=True).encode())
    return digest.hexdigest()[:24]


def _sources(site: Path, dists: list[tuple[str, list[tuple[str, str]]]]) -> dict[str, str]:
    """Relative path of every `.py` file of the distributions inside site -> its RECORD hash."""
    return {path: hashed for _, rows in dists for path, hashed in rows if path.endswith(".py")}


def _unchanged(source: Path, hashed: str) -> bool:
    algorithm, _, expected = hashed.partition("=")
    if algorithm != "sha256":
        return False
    try:
        actual = hashlib.sha256(source.read_bytes()).digest()
    except OSError:
        return False
    return base64.urlsafe_b64encode(actual).rstrip(b"=").decode() == expected


def restore(site: Path, archive: Path, sources: dict[str, str]) -> int:
    """Write back every kept pyc whose source is unchanged, with today's header; how many."""
    restored = 0
    with tarfile.open(archive) as tar:
        for member in tar:
            source = sources.get(member.name)
            if not member.isfile() or source is None:
                continue
            path = site / member.name
            data = tar.extractfile(member)
            if data is None or not _unchanged(path, source):
                continue
            pyc = data.read()
            st = path.stat()
            if pyc[:4] != importlib.util.MAGIC_NUMBER or int.from_bytes(pyc[4:8], "little") != 0:
                continue  # not a timestamp pyc of this interpreter
            if int.from_bytes(pyc[12:16], "little") != st.st_size & 0xFFFFFFFF:
                continue
            header = pyc[:8] + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
            target = Path(importlib.util.cache_from_source(str(path)))
            target.parent.mkdir(exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            tmp.write_bytes(header + pyc[12:])
            os.replace(tmp, target)
            restored += 1
    return restored


def save(site: Path, folder: Path, key: str, sources: dict[str, str]) -> None:
    """Keep the compiled file of every source (as `<source path>` in an uncompressed tar)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    with tarfile.open(tmp, "w") as tar:
        for name in sorted(sources):
            pyc = Path(importlib.util.cache_from_source(str(site / name)))
            try:
                data = pyc.read_bytes()
            except OSError:
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, folder / f"{key}.tar")
    kept = sorted(folder.glob("*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in kept[KEEP:]:
        old.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.rsplit("\n\n", 1)[-1], file=sys.stderr)
        return 2
    site, folder = Path(argv[0]), Path(argv[1])
    dists = distributions(site)
    key = cache_key(dists)
    sources = _sources(site, dists)
    archive = folder / f"{key}.tar"
    restored = 0
    if archive.is_file():
        try:
            restored = restore(site, archive, sources)
        except (OSError, tarfile.TarError) as exc:
            print(f"venv_bytecode: {archive} unreadable ({exc}); compiling", file=sys.stderr)
    print(f"venv_bytecode: {restored} of {len(sources)} files restored from {archive}")
    # As pip's compile step: a file this Python cannot compile (torch ships some for 3.12) is
    # skipped and logged, not an error.
    compileall.compile_dir(str(site), quiet=1, workers=0)
    if restored == 0:
        try:
            save(site, folder, key, sources)
        except OSError as exc:
            print(f"venv_bytecode: not kept in {folder} ({exc})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
