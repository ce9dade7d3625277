"""`Metadata`: a build variant's `metadata.json` as `kernels` exposes it (`kernels.Metadata`).

`kernels` parses the file in Rust; this reads the same keys with the standard library, for code
that calls `Metadata.read_from_file(...)` or reads `LoadedKernel.metadata` attributes. It is
also the parsed JSON object itself (a `dict`), which is how kerneld_client's own code and
callers that predate this class read `LoadedKernel.metadata`. Values are plain Python ones (a
dict for `backend`, `digest` and `provenance`, a string for `build_layout` and
`kernels_minver`) where `kernels` has small Rust types; the key names and their meaning are
`kernels`'. Errors are ValueErrors, as in `kernels`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["KernelName", "Metadata"]


class KernelName(str):
    """A kernel's `name` from metadata.json: the string, plus `kernels`' `python_name` (the
    name as a Python identifier, `-` read as `_`), as on `kernels`' own name type."""

    __slots__ = ()

    @property
    def python_name(self) -> str:
        return self.replace("-", "_")


class Metadata(dict[str, Any]):
    """Parsed `metadata.json` of a kernel build variant: its keys, and `kernels`' attributes."""

    __slots__ = ()

    @staticmethod
    def of(doc: Mapping[str, Any] | Any) -> Metadata:
        """`doc` as a Metadata (itself if it is one); ValueError if it is not a JSON object."""
        if isinstance(doc, Metadata):
            return doc
        if not isinstance(doc, Mapping):
            raise ValueError(f"metadata must be a JSON object, got {type(doc).__name__}")
        return Metadata(doc)

    @staticmethod
    def read_from_file(metadata_path: os.PathLike[str] | str) -> Metadata:
        """Parse `metadata.json` at `metadata_path`; ValueError on any I/O or parse error."""
        try:
            with open(metadata_path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read {os.fspath(metadata_path)}: {exc}") from exc
        return Metadata.from_bytes(data)

    @staticmethod
    def from_bytes(bytes: bytes) -> Metadata:
        """Parse `metadata.json` from JSON bytes; ValueError on any parse error."""
        try:
            doc = json.loads(bytes)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"metadata.json is not JSON: {exc}") from exc
        return Metadata.of(doc)

    def _get(self, key: str) -> Any:
        return self.get(key)

    @property
    def id(self) -> str:
        return str(self.get("id") or "")

    @property
    def name(self) -> KernelName:
        return KernelName(self.get("name") or "")

    @property
    def version(self) -> int | None:
        value = self._get("version")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def build_layout(self) -> str:
        """`files` (the default, for metadata written before the key existed) or `zip`."""
        value = self._get("build-layout")
        return value if isinstance(value, str) else "files"

    @property
    def kernels_minver(self) -> str | None:
        value = self._get("kernels-minver")
        return value if isinstance(value, str) else None

    @property
    def license(self) -> str | None:
        value = self._get("license")
        return value if isinstance(value, str) else None

    @property
    def upstream(self) -> str | None:
        value = self._get("upstream")
        return value if isinstance(value, str) else None

    @property
    def source(self) -> str | None:
        value = self._get("source")
        return value if isinstance(value, str) else None

    @property
    def python_depends(self) -> list[str]:
        value = self._get("python-depends")
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    @property
    def kernel_depends(self) -> list[Any]:
        """The `kernel-depends` entries (kerneld's reader; ValueError when malformed)."""
        from kerneld_client.metadata import kernel_depends

        return list(kernel_depends(self))

    @property
    def backend(self) -> dict[str, Any]:
        value = self._get("backend")
        return dict(value) if isinstance(value, Mapping) else {}

    @property
    def digest(self) -> dict[str, Any] | None:
        value = self._get("digest")
        return dict(value) if isinstance(value, Mapping) else None

    @property
    def provenance(self) -> dict[str, Any] | None:
        value = self._get("provenance")
        return dict(value) if isinstance(value, Mapping) else None

    def __repr__(self) -> str:
        return f"Metadata(id={self.id!r}, name={self.name!r}, version={self.version!r})"
