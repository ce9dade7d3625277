"""Which variant each platform clients showed would load: the `picks` of the published index.

A warm load reads its repo's document and looks its own platform fingerprint up in the commit's
`picks` (`kerneld_client.variants.fingerprints`), instead of ranking the variants itself: the
rules stay in the daemon (and in the client's slower paths, which import them when a
fingerprint is not there). The daemon ranks with the very rules the client would use
(`kerneld_client.variants.decide`), so a pick is what the client would have chosen.

Ranked over every variant the upstream has when that list is known (a pick that is not in the
store yet sends the job to the daemon, which fetches it), else over the variants in the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kerneld_client.variants import PlatformFacts, best_variant, fingerprint

#: Distinct variant-name lists remembered per set of platforms (a store's commits share few).
_CACHE_LIMIT = 4096


class Picker:
    """The picks for a fixed set of platforms, one per fingerprint, memoised per name list
    (publishing 100,000 commits ranks each distinct list once, not once per commit)."""

    def __init__(self, platforms: Iterable[PlatformFacts] = ()) -> None:
        self.platforms: Mapping[str, PlatformFacts] = {
            fingerprint(p.to_dict()): p for p in platforms
        }
        self._cache: dict[tuple[str, ...], dict[str, str | None]] = {}

    def picks(self, names: Iterable[str]) -> dict[str, str | None]:
        """fingerprint -> the variant `decide()` prefers among `names` (None: none fits)."""
        key = tuple(sorted(set(names)))
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            found = self._cache[key] = {
                fp: best_variant(key, facts) for fp, facts in self.platforms.items()
            }
        return found
