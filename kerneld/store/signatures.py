"""The store's side of provenance (``[provenance]``; kerneld/pipeline/provenance.py checks sigstore
bundles): the check a daemon installs, asked once per new tree at publish; the record kept with
the tree; and, while signatures are required, the refusal of any tree that is not verified.

The store stays free of any signing scheme: a check gets a variant's files by path.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .errors import ProvenanceError
from .manifest import METADATA_FILE, ManifestEntry
from .paths import tree_hex
from .published_index_writer import PublishedIndexWriter
from .state import StoreState
from .types import ProvenanceCheck, ProvenanceRecord

#: Why a tree without a provenance record is refused while signatures are required.
UNCHECKED = ("unchecked", "its signature was never checked")


class Signatures:
    """Runs the installed check on trees and keeps its records (the ``provenance`` table)."""

    def __init__(
        self,
        state: StoreState,
        writer: PublishedIndexWriter,
        resolve: Callable[[str, str], str | None],
    ) -> None:
        self._state = state
        self._writer = writer
        self._resolve = resolve

    @property
    def check(self) -> ProvenanceCheck | None:
        """Who signed a variant, checked once per new tree at publish (``[provenance]``; the
        daemon installs kerneld.pipeline.provenance.SigstoreCheck). None: no check, nothing
        recorded. Setting it republishes nothing (`install` does)."""
        return self._state.check

    @check.setter
    def check(self, check: ProvenanceCheck | None) -> None:
        self._state.check = check

    def install(self, check: ProvenanceCheck | None) -> None:
        """Install the ingest check and republish the published index, which leaves out
        unverified trees while signatures are required."""
        state = self._state
        with state.lock:
            before = state.require_signed
            state.check = check
            if state.require_signed != before and not state.read_only:
                self._writer.publish(state.index.repos(), skip_unchanged=True)

    def record_of(self, digest: str) -> ProvenanceRecord | None:
        """The ingest check's record for a tree (``sha256:<hex>`` or hex); None: not checked."""
        return self._state.index.get_provenance(tree_hex(digest))

    def check_new(
        self,
        hexd: str,
        by_path: dict[str, ManifestEntry],
        checked: bool,
        ctx: dict[str, str | None],
    ) -> ProvenanceRecord | None:
        """Who signed this tree: the record a live tree already has, or the installed check's
        answer for a new one (ProvenanceError when the site requires signed kernels)."""
        state, index = self._state, self._state.index
        check = state.check
        if check is None:
            return None
        tree = index.get_tree(hexd)
        record = index.get_provenance(hexd) if tree and tree.state == "live" else None
        if record is None:

            def read(path: str) -> bytes | None:
                entry = by_path.get(path)
                return None if entry is None else state.layout.blob_path(entry.sha256).read_bytes()

            record = check.check(read, digest_checked=checked, **ctx)
        if check.required and not record.verified:
            raise ProvenanceError(record.status, record.detail, **ctx)
        return record

    def check_unrecorded(self, repo: str, revision: str, variant: str) -> None:
        """While signatures are required: check a live tree that has no record yet (it entered
        the store while no check was installed, or under an older kerneld), once, from its
        published files. Runs before `lookup` takes the store lock, since the first check
        imports sigstore and may refresh its trust root over the network."""
        state, index = self._state, self._state.index
        check = state.check
        commit = self._resolve(repo, revision)
        row = None if commit is None else index.get_variant(repo, commit, variant)
        tree = None if row is None else index.get_tree(row.tree)
        if check is None or state.read_only or tree is None or tree.state != "live":
            return
        if index.get_provenance(tree.digest) is not None:
            return
        folder = state.layout.tree_path(tree.digest)

        def read(path: str) -> bytes | None:
            file = folder / path
            return file.read_bytes() if file.is_file() else None

        # Its metadata digest, if it has one, was checked against the files when it was published.
        try:
            meta = json.loads(read(METADATA_FILE) or b"{}")
        except ValueError:
            meta = {}
        checked = isinstance(meta, dict) and meta.get("digest") is not None
        ctx = {"repo_id": repo, "commit": commit, "variant": variant}
        record = check.check(read, digest_checked=checked, **ctx)
        with index.tx() as conn:
            index.put_provenance(conn, tree.digest, record)
        self._writer.publish([repo])

    def refuse_unverified(self, hexd: str, **ctx: str | None) -> None:
        """Raise ProvenanceError unless the tree's record says "verified" (caller holds the
        lock and requires signatures)."""
        record = self._state.index.get_provenance(hexd)
        if record is None or not record.verified:
            status, detail = (record.status, record.detail) if record else UNCHECKED
            raise ProvenanceError(status, detail, **ctx)
