"""Typed errors of the client library.

Each error subclasses the builtin exception that callers of the `kernels` package already catch
(`FileNotFoundError` for "this kernel cannot be had", `ImportError` for "it was had but would not
load"), so code written against `kernels` keeps working, while callers who want detail get the repo,
revision and variant involved.
"""

from __future__ import annotations

from collections.abc import Sequence


class VariantReason:
    """Why one build variant was or was not usable on this platform.

    A plain immutable value class rather than a frozen dataclass: this module is imported by
    every process that loads a kernel, and defining a dataclass costs about a millisecond.
    """

    __slots__ = ("accepted", "reason", "variant")

    variant: str
    accepted: bool
    reason: str

    def __init__(self, variant: str, accepted: bool, reason: str = "") -> None:
        object.__setattr__(self, "variant", variant)
        object.__setattr__(self, "accepted", accepted)
        object.__setattr__(self, "reason", reason)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"VariantReason is immutable (cannot set {name!r})")

    def _key(self) -> tuple[str, bool, str]:
        return (self.variant, self.accepted, self.reason)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VariantReason) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"VariantReason(variant={self.variant!r}, accepted={self.accepted!r}, "
            f"reason={self.reason!r})"
        )


#: What to do about a permission error on the host's socket or store (both are gated by it).
GROUP_HINT = (
    "loading kernels needs membership in the kerneld-users group (`id -nG` shows yours; an "
    "admin runs `usermod -aG kerneld-users USER`, then log in again)"
)


def group_hint(gid: int | None = None) -> str:
    """GROUP_HINT; in a Kubernetes pod (where usermod cannot help) how the pod spec adds the
    socket's or store's group (`gid`, when known); in another container, `--group-add` too."""
    from kerneld_client import _config

    where = _config.in_container()
    number = str(gid) if gid is not None else "GID"
    if where == "kubernetes":
        return (
            f"loading kernels needs membership in the kerneld socket's group (gid {number}; "
            "kerneld-users on a host install), which this pod lacks: add it to the pod's "
            f"`securityContext.supplementalGroups: [{number}]` (deploy/kubernetes/job-pod.yaml)"
        )
    if where == "container":
        return f"{GROUP_HINT[:-1]}; in a container: run it with `--group-add {number}`)"
    return GROUP_HINT


class KernelError(Exception):
    """Base of every kerneld_client error; carries the kernel it is about."""

    def __init__(
        self,
        message: str,
        *,
        repo_id: str = "",
        revision: str = "",
        variant: str = "",
        hint: str = "",
    ) -> None:
        self.message = message
        self.repo_id = repo_id
        self.revision = revision
        self.variant = variant
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = "@".join(p for p in (self.repo_id, self.revision) if p)
        if self.variant:
            where = f"{where} [{self.variant}]" if where else self.variant
        text = f"{where}: {self.message}" if where else self.message
        return f"{text} ({self.hint})" if self.hint else text


class KernelNotFound(KernelError, FileNotFoundError):
    """The repository, revision or file does not exist (or is not in an offline store)."""


class RevisionNotFound(KernelNotFound):
    """The repository has no such branch, tag or commit: a misspelt revision. Like a version
    the repo does not have, a mapping naming it can never be right, so `kernelize` raises it
    instead of keeping the PyTorch forward (`kernels` raises the Hub's error for both)."""


class VersionNotFound(RevisionNotFound, ValueError):
    """The repo has no branch `vN` for the version asked for ("Version N not found, available
    versions: ..."). A mapping or call naming it can never be right, so this is also the
    `ValueError` `kernels` raises, and `kernelize` raises it instead of falling back."""


class NoCompatibleVariant(KernelError, FileNotFoundError):
    """The kernel exists but none of its build variants fits this platform."""

    def __init__(
        self,
        message: str,
        *,
        reasons: Sequence[VariantReason] = (),
        repo_id: str = "",
        revision: str = "",
        hint: str = "",
    ) -> None:
        self.reasons = tuple(reasons)
        detail = "; ".join(f"{r.variant}: {r.reason or 'accepted'}" for r in self.reasons)
        super().__init__(
            f"{message} [{detail}]" if detail else message,
            repo_id=repo_id,
            revision=revision,
            hint=hint,
        )


class KernelDenied(KernelError, FileNotFoundError):
    """An administrator disabled this kernel (or revision) on this host."""


class UntrustedPublisher(KernelDenied, ValueError):
    """The kernel's publisher is not trusted on this host (`[trust]` in kerneld.toml: the Hub's
    trusted kernel publishers and an allow-list), and the caller did not pass
    `trust_remote_code`; `kernels` refuses such a kernel the same way, with a `ValueError`
    ("not from a trusted publisher"), which this also is."""


class KernelUnavailable(KernelError, FileNotFoundError):
    """The kernel exists (or may) but cannot be had now: every upstream down, a download failed
    verification, the store is full, or the daemon failed internally."""


class DaemonUnavailable(KernelError, ConnectionError):
    """The kerneld daemon could not be reached, or did not answer in time."""


class KernelLoadError(KernelError, ImportError):
    """The kernel's files were found but could not be imported safely."""


class UntrustedPath(KernelLoadError):
    """A kernel path failed the trust checks (outside the store, writable, foreign owner, link)."""


class CorruptTree(KernelLoadError):
    """Under `KERNELD_VERIFY=1`: the kernel's files on disk no longer match the digests the
    store published (a disk fault, or tampering by whoever can write the store). Nothing of it
    was imported."""


class DependencyMissing(KernelLoadError, ValueError):
    """The build declares a Python dependency (`python-depends`) this interpreter does not
    have: refused before any of its code runs, with the ValueError `kernels` raises for it."""
