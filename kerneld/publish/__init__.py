"""Publish a kernel author's local build so kerneld serves it: `kerneldctl publish`.

The input is what the kernel builder leaves on disk: `build/<variant>/...`, each variant folder
holding the Python package, the compiled `.so` and a `metadata.json` whose `digest` lists every
other file's hash. Nothing upstream has checked such a build, so it is checked here the way the
store checks a variant it fetched (`kerneld.store.paths` for names and file types,
`kerneld.store.manifest` for `metadata.json` and its digest), all of it before anything is written.
Bytecode (`__pycache__`, `.pyc`) is left out, as every upstream leaves it out.

It is then written either

- into a mirror directory (or `.tar`) in the layout of `kerneld.mirror.documents`, merged with what
  is there exactly as `kerneldctl mirror export` merges (blobs first, then the manifest, then the
  refs; signed with the same keys), so a daemon's `mirror-dir` upstream serves it and
  `kerneldctl mirror import` takes it; or
- straight into a store (its daemon stopped), through the store's verified ingest and
  `publish_tree`, as a mirror import would.

Two rules keep daemons that already cached something correct. A commit's files never change in
kerneld (a daemon keeps the trees of a commit it fetched), so a variant already published under
the same commit with other files is refused. A ref only moves to a commit that descends from the
one it points at (git ancestry in the author's checkout), unless forced, so publishing an older
build never rolls `v1` back by accident.

The package follows those steps: `build` checks the build on disk, `checkout` reads the commit
(and refuses a dirty checkout), `refs` decides where refs may move, and `to_mirror` /
`to_store` write; `report` says what was done.
"""

from __future__ import annotations


class PublishError(ValueError):
    """The build cannot be published as asked; nothing was written. `hint` says what to do."""

    def __init__(self, message: str, *, hint: str = "", usage: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.usage = usage
        """A mistake in the arguments rather than in the build (kerneldctl's exit code 2)."""


def immutable(repo_id: str, commit: str, variant: str, where: str) -> PublishError:
    """The first rule's refusal: `variant` of `commit` is already at `where` with other files."""
    return PublishError(
        f"{repo_id}@{commit} [{variant}] is already in {where} with other files; a commit's "
        "files never change in kerneld (daemons keep the ones they fetched)",
        hint="commit the change and publish the new commit",
    )
