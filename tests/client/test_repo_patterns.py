"""`repo_matches`: the `[trust] allow` / `[fetch] allow` pattern match of the client's warm path
and of the daemon, which must say exactly what `fnmatch.fnmatchcase` says of the repo id and the
pattern in lower case (the Hub resolves repo ids case-insensitively)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from hypothesis import example, given
from hypothesis import strategies as st

from kerneld_client.published_index import repo_matches
from tests.fuzz.strategies import fuzz_settings

_TEXT = st.text(alphabet="ab-/*", max_size=12)


@fuzz_settings(2000)
@given(repo=st.text(alphabet="ab-/", max_size=12), pattern=_TEXT)
@example(repo="kerneld-examples/activation", pattern="kerneld-*/*")
@example(repo="ab", pattern="a*b*b")  # a middle part may not reach into the suffix
@example(repo="aba", pattern="*a*a")
@example(repo="a", pattern="a*a")
@example(repo="ab/ab", pattern="*b/a*")
def test_star_patterns_match_as_fnmatch_does(repo: str, pattern: str) -> None:
    assert repo_matches(repo, pattern) == fnmatchcase(repo, pattern)


def test_other_wildcards_are_fnmatchs_own() -> None:
    assert repo_matches("org/x1", "org/x?")
    assert repo_matches("org/b", "org/[ab]")
    assert not repo_matches("org/c", "org/[ab]")


def test_case_does_not_matter_as_on_the_hub() -> None:
    """`GoodCorp/X` is the Hub's `goodcorp/x`: an allow list names it in any case."""
    assert repo_matches("GoodCorp/X", "goodcorp/*")
    assert repo_matches("goodcorp/x", "GoodCorp/X")
    assert repo_matches("Org/X1", "org/x?") and repo_matches("ORG/B", "org/[ab]")
    assert not repo_matches("GoodCorp/X", "badcorp/*")
