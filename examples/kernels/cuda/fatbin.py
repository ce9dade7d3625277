"""Which GPU architectures a shared library carries: read its ELF `.nv_fatbin` section.

cuobjdump has no wheel on the package index, so the arch check reads the fat binary itself: an
ELF section of fat binaries, each a header (magic 0xBA55ED50) followed by entries whose headers
name their kind (1 PTX, 2 cubin) and SM version. Enough to check a build against its metadata.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_CUBIN = 2


class FatbinError(ValueError):
    """The file is not an ELF64 library, or its fat binary is malformed."""


@dataclass(frozen=True)
class FatbinArchs:
    cubins: frozenset[int]  # SM versions with machine code, e.g. {80, 90}
    ptx: frozenset[int]  # SM versions of the embedded PTX (JIT-compiled on newer GPUs)


def _section(data: bytes, name: str) -> bytes | None:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FatbinError("not a little-endian ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        base = shoff + i * shentsize
        name_off = struct.unpack_from("<I", data, base)[0]
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_off, offset, size

    _, strtab_off, _ = header(shstrndx)
    for i in range(shnum):
        name_off, offset, size = header(i)
        end = data.index(b"\0", strtab_off + name_off)
        if data[strtab_off + name_off : end].decode() == name:
            return data[offset : offset + size]
    return None


def read_archs(library: Path) -> FatbinArchs:
    """The SM versions of the cubins and PTX in `library` (empty sets: no device code)."""
    section = _section(library.read_bytes(), ".nv_fatbin")
    cubins: set[int] = set()
    ptx: set[int] = set()
    pos = 0
    while section is not None and pos + 16 <= len(section):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", section, pos)
        if magic != FATBIN_MAGIC:
            if not any(section[pos:]):  # alignment padding after the last fat binary
                break
            raise FatbinError(f"bad fat binary magic {magic:#x} at offset {pos}")
        entry = pos + header_size
        end = entry + fat_size
        while entry < end:
            kind, _ver, entry_header, padded_size = struct.unpack_from("<HHII", section, entry)
            sm = struct.unpack_from("<I", section, entry + 28)[0]
            if kind == KIND_PTX:
                ptx.add(sm)
            elif kind == KIND_CUBIN:
                cubins.add(sm)
            else:
                raise FatbinError(f"unknown fat binary entry kind {kind} at offset {entry}")
            entry += entry_header + padded_size
        pos = end
    return FatbinArchs(frozenset(cubins), frozenset(ptx))


def archs_as_metadata(archs: FatbinArchs) -> list[str]:
    """The metadata spelling (`backend.archs`): `8.0` for a cubin, `8.0+PTX` where the PTX of
    that arch is embedded too (newer GPUs JIT-compile it)."""
    return [
        f"{sm // 10}.{sm % 10}" + ("+PTX" if sm in archs.ptx else "")
        for sm in sorted(archs.cubins | archs.ptx)
    ]
