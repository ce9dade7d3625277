"""Every exception class kerneld defines, found by walking them, and an instance of each as the
code raises it: for the tests that pin each class's status and check each has a kind."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

import kerneld
from kerneld.errors import ErrorKind
from kerneld_client.variants import PlatformFacts, decide

CPU = PlatformFacts(cpu="x86_64", os="linux", torch_version=(2, 13), cxx11_abi=True)


def kerneld_error_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in kerneld's modules (all imported), by name: no two share
    one, so a class that moves to another module keeps its pin."""
    for info in pkgutil.walk_packages(kerneld.__path__, "kerneld."):
        importlib.import_module(info.name)
    seen: set[type[BaseException]] = set()
    todo: list[type[BaseException]] = [BaseException]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    ours = [c for c in seen if c.__module__.startswith("kerneld.")]
    found = {c.__qualname__: c for c in ours}
    assert len(found) == len(ours), "two kerneld error classes share a name"
    return found


def _no_variant(cls: type[BaseException]) -> BaseException:
    return cls(decide(["torch-cuda"], CPU), repo_id="o/n", revision="c" * 40)


def _version_missing(cls: type[BaseException]) -> BaseException:
    from kerneld.upstream.errors import RevisionNotFound

    return cls(RevisionNotFound("no v9", repo_id="o/n", revision="v9"), {1, 2})


#: Classes whose constructor is not `(message, **context)`.
_MAKE: dict[str, Callable[[type[BaseException]], BaseException]] = {
    "ConfigError": lambda c: c("f.toml", "log.level", "bad"),
    "NoVariantFits": _no_variant,
    "_VersionMissing": _version_missing,
    "HeadError": lambda c: c(400, "Bad Request", "a NUL byte in the request head"),
    "HubError": lambda c: c(ErrorKind.NOT_FOUND, "Not Found"),
    "UntrustedPublisher": lambda c: c("untrusted", repo_id="o/n", hint="allow it"),
    "BlobMissingError": lambda c: c(["ab" * 32], repo_id="o/n"),
    "DeniedError": lambda c: c("bad build", repo_id="o/n", commit="c" * 40),
    "DigestMismatchError": lambda c: c("sha256", "a", "b", repo_id="o/n"),
    "InvalidPathError": lambda c: c("../x", "dot-dot", repo_id="o/n"),
    "MetadataDigestError": lambda c: c(missing=["a.so"], repo_id="o/n"),
    "ProvenanceError": lambda c: c("unsigned", "no bundle", repo_id="o/n", variant="torch-cpu"),
    "ResourceExhaustedError": lambda c: c(10, 1, "size cap", repo_id="o/n"),
    "SizeMismatchError": lambda c: c(10, 11, repo_id="o/n"),
    "StoreLockedError": lambda c: c("/var/lib/kerneld", 42),
}


def sample(cls: type[BaseException]) -> BaseException:
    """An instance of `cls` as the code raises it."""
    make = _MAKE.get(cls.__qualname__)
    if make is not None:
        return make(cls)
    if issubclass(cls, _families()):
        return cls("why", repo_id="o/n")  # type: ignore[call-arg]
    return cls("why")


def _families() -> tuple[type[BaseException], ...]:
    """The bases whose constructors take a `repo_id` context field."""
    from kerneld.pipeline.request import ResolveError
    from kerneld.store.errors import StoreError
    from kerneld.upstream.errors import UpstreamError

    return (ResolveError, StoreError, UpstreamError)
