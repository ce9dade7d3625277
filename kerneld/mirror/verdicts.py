"""The exporting site's verdicts, carried in a bundle's manifests and so covered by their
signatures: does it trust each kernel's publisher (its `[trust]` policy with the Hub's answers,
as published in publishers.json), and what did its provenance check find for each variant.

A manifest may carry::

    "verdicts": {"publisher": {"trusted": true, "by": "hub" | "allow" | "any"},
                 "provenance": {"<variant>": {"status": "verified", "signer": "...",
                                              "issuer": "...", "detail": "..."}}}

An import whose signatures were checked records the "trusted" publisher verdicts of what it
imported (publishers.json `repos`; `kerneld.pipeline.publisher_trust` keeps them), so an
import-only host serves imported kernels without a `[trust] allow` edit. The importing site's
own rules still win: a deny refuses the kernel, `[trust] publishers = "allow-list"` counts only
its allow list, and a verdict counts for its repo only (never a whole organisation). A bundle
without verdicts (an older kerneld's, or `--no-check-sigs`) vouches for nothing: its kernels
need the importing site's `[trust] allow` (or the Hub) as before. Provenance verdicts are
reported by the import; the importing host's own `[provenance]` check still decides what it
serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kerneld.store import VerdictSource
from kerneld_client.published_index import PUBLISHERS_FILE, PUBLISHERS_FORMAT, repo_matches
from kerneld_client.vocabulary import repo_key

PUBLISHER_BY = ("hub", "allow", "any")


def publisher_verdict(doc: Mapping[str, Any] | None, repo: str) -> dict[str, Any]:
    """This site's verdict on `repo`'s publisher, from its published publishers.json."""
    if not doc or doc.get("format") != PUBLISHERS_FORMAT:
        return {"trusted": False, "by": ""}
    policy, allow = doc.get("policy"), doc.get("allow")
    orgs, repos = doc.get("orgs"), imported_repos(doc)
    if policy == "any":
        return {"trusted": True, "by": "any"}
    if isinstance(allow, list) and any(repo_matches(repo, str(p)) for p in allow):
        return {"trusted": True, "by": "allow"}
    org = repo_key(repo.split("/", 1)[0])
    vouched = isinstance(orgs, Mapping) and (orgs.get(org) or {}).get("trusted") is True
    if policy == "hub" and (vouched or repo_key(repo) in repos):
        return {"trusted": True, "by": "hub"}
    return {"trusted": False, "by": ""}


def export_verdicts(source: VerdictSource, repo: str, trees: Mapping[str, str]) -> dict[str, Any]:
    """The verdicts for one exported commit: `trees` is variant -> tree digest."""
    provenance: dict[str, Any] = {}
    for variant, digest in sorted(trees.items()):
        record = source.signatures.record_of(digest)
        if record is not None:
            provenance[variant] = {
                "status": record.status,
                "signer": record.signer,
                "issuer": record.issuer,
                "detail": record.detail,
            }
    return {
        "publisher": publisher_verdict(source.published.read_document(PUBLISHERS_FILE), repo),
        "provenance": provenance,
    }


def trusted_by_exporter(verdicts: Mapping[str, Any] | None) -> str | None:
    """How the exporting site trusted the publisher ("hub", "allow", "any"); None: it did not
    (or the manifest carries no verdict)."""
    if not isinstance(verdicts, Mapping):
        return None
    pub = verdicts.get("publisher")
    if isinstance(pub, Mapping) and pub.get("trusted") is True and pub.get("by") in PUBLISHER_BY:
        return str(pub["by"])
    return None


def imported_repos(doc: Mapping[str, Any] | None) -> dict[str, float]:
    """repo (repo_key form) -> when an import vouched for it, from a publishers.json."""
    out: dict[str, float] = {}
    repos = (doc or {}).get("repos")
    if isinstance(repos, Mapping):
        for repo, raw in repos.items():
            if isinstance(raw, Mapping) and raw.get("trusted") is True:
                at = raw.get("imported_at")
                out[repo_key(str(repo))] = float(at) if isinstance(at, int | float) else 0.0
    return out


def repos_entry(repos: Mapping[str, float]) -> dict[str, Any]:
    """publishers.json's `repos`: the imported verdicts."""
    return {
        r: {"trusted": True, "imported_at": at, "by": "import"} for r, at in sorted(repos.items())
    }
