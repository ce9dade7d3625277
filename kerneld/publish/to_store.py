"""Publish straight into a store whose daemon is stopped, as a mirror import would.

Every file goes through the store's verified ingest (re-hashed) and each variant through
`publish_tree` (which re-checks metadata.json); refs move as `plan_ref` allows.
"""

from __future__ import annotations

from collections.abc import Sequence

from kerneld.publish import PublishError, immutable
from kerneld.publish.build import LocalVariant
from kerneld.publish.refs import Ancestry, plan_ref
from kerneld.publish.report import PublishReport
from kerneld.store import PublishTarget, StoreError, TreeFile


def publish_to_store(
    store: PublishTarget,
    variants: Sequence[LocalVariant],
    *,
    repo_id: str,
    commit: str,
    refs: Sequence[str] = (),
    ancestry: Ancestry | None = None,
    force_refs: bool = False,
) -> PublishReport:
    """Ingest and publish the checked `variants` of `repo_id@commit` into `store` (opened
    read-write: its daemon is stopped), then point `refs` at it (forward only unless
    `force_refs`). The store verifies every byte again on ingest and re-checks metadata.json."""
    report = PublishReport(repo_id, commit, str(store.root), "store", list(variants), [])
    where = f"the store {store.root}"
    try:
        store.names.check_denied(repo_id, commit, commit)
    except StoreError as exc:
        raise PublishError(str(exc), hint=f"`kerneldctl allow {repo_id}` lifts a deny") from None
    for v in variants:
        tree = store.catalog.published_tree(repo_id, commit, v.name)
        if tree is not None:
            if f"sha256:{tree.digest}" != v.tree_digest:
                raise immutable(repo_id, commit, v.name, where)
            report.unchanged.append(v.name)
    for ref in refs:
        current = store.names.get_ref(repo_id, ref)
        report.refs.append(
            plan_ref(ref, current.commit if current else None, commit, ancestry, force=force_refs)
        )
    ctx = {"repo_id": repo_id, "commit": commit}
    seen: set[str] = set()
    try:
        with store.holds.hold() as hold:
            for v in variants:
                for f in v.files:
                    if f.sha256 in seen:
                        continue
                    seen.add(f.sha256)
                    if store.blobs.has_blob(f.sha256):
                        report.blobs_present += 1
                        continue
                    store.blobs.ingest_file(
                        f.source, sha256=f.sha256, size=f.size, variant=v.name, **ctx
                    )
                    report.blobs_written += 1
                    report.bytes_written += f.size
                hold.add(repo_id, commit, v.name)
                published = store.trees.publish_tree(
                    repo_id,
                    commit,
                    v.name,
                    [
                        TreeFile(
                            path=f.path,
                            sha256=f.sha256,
                            size=f.size,
                            mode=0o100755 if f.executable else 0o100644,
                            upstream_id=f.sha256,
                        )
                        for f in v.files
                    ],
                )
                if published.digest != v.tree_digest:  # pragma: no cover - one definition
                    raise PublishError(
                        f"{v.name}: the store made {published.digest}, not the tree checked"
                    )
            for move in report.refs:
                if move.action != "unchanged":
                    store.names.set_ref(repo_id, move.ref, commit)
    except StoreError as exc:
        raise PublishError(f"publishing into {where} failed: {exc}") from None
    except OSError as exc:
        raise PublishError(
            f"publishing into {where} failed: {exc.strerror or exc}",
            hint="a build file changed or vanished while it was published: publish again",
        ) from None
    return report
