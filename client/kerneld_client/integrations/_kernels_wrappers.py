"""The functions the hook puts in place of kernels' own, one factory per replaced name.

Each replacement keeps the original's signature and calls it (`theirs()`) whenever the hook is
not installed any more, the call is one kerneld leaves to `kernels`, or kerneld's fallback policy
says so; `FACTORIES` maps each replaced attribute name to its factory, and `MARK` tags what they
return so `uninstall()` and a second `install()` recognise a replacement.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneld_client.errors import (
    KernelDenied,
    KernelError,
    NoCompatibleVariant,
    UntrustedPublisher,
    VersionNotFound,
)
from kerneld_client.integrations._kernels_api import installed_state
from kerneld_client.integrations._kernels_routing import (
    FOR_LAYER,
    Plan,
    Refused,
    cannot_be_had,
    fall_back,
    fallback_policy,
    is_local,
    note_newer_version,
    plan_for,
    registered,
    through_kerneld,
    validate_metadata,
)
from kerneld_client.loading.context import parse_request
from kerneld_client.loading.listing import has_variant
from kerneld_client.platform import platform_facts

__all__ = ["FACTORIES", "MARK"]

MARK = "_kerneld_hook"


def _mark(func: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """Tag a replacement (uninstall() and a second install() recognise it) and copy the doc."""
    setattr(func, MARK, True)
    func.__wrapped__ = original  # type: ignore[attr-defined]
    func.__doc__ = original.__doc__
    return func


def _for_layer(original: Callable[..., Any]) -> Callable[..., Any]:
    """`get_kernel` as the layer repositories see it: the same call, marked as a layer load."""

    def get_kernel(*args: Any, **kwargs: Any) -> Any:
        token = FOR_LAYER.set(True)
        try:
            return original(*args, **kwargs)
        finally:
            FOR_LAYER.reset(token)

    return _mark(get_kernel, original)


def _get_kernel_with_resolver(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_kernel_with_resolver(
        *, api: Any, backend: str | None, kernel: Any, resolver: Any, metadata_validator: Any
    ) -> Any:
        def theirs() -> Any:
            return original(
                api=api,
                backend=backend,
                kernel=kernel,
                resolver=resolver,
                metadata_validator=metadata_validator,
            )

        state = installed_state()
        if state is None:
            return theirs()
        try:
            plan = plan_for(state.api, kernel, resolver, metadata_validator)
        except ValueError:  # a repo id or revision kerneld does not take: kernels decides
            plan = None
        if plan is None:
            return theirs()

        validated: dict[Path, Any] = {}  # folder -> its metadata, validated before import

        def before_import(folder: Path, variant: str) -> None:
            # As in kernels: a kernel its validators refuse (python-depends, kernels_minver)
            # never runs any code, here or in its dependencies.
            try:
                validated[folder] = validate_metadata(
                    state.api, metadata_validator, folder, variant
                )
            except Exception as exc:
                raise Refused(exc) from exc

        try:
            loaded = through_kerneld(plan, backend, before_import)
        except VersionNotFound:
            raise  # kernels' own ValueError for it, with the versions the repo has
        except UntrustedPublisher as exc:
            # kernels' own answer to an untrusted publisher: a ValueError, which its fallbacks
            # do not catch (the check must not turn into a silent PyTorch layer).
            raise ValueError(
                f"Kernel repository '{plan.request.repo_id}' is not from a trusted publisher "
                f"on this host ({exc.message}). Set trust_remote_code=True or add the "
                "repository ID to the trust_remote_code allowlist to allow loading kernels "
                "from untrusted sources."
            ) from exc
        except KernelError as exc:
            if isinstance(exc.__cause__, Refused):  # kernels' own verdict, as kernels raises it
                raise exc.__cause__.error from None
            fall_back(exc, plan.request)
            try:
                return theirs()
            except Exception as err:
                raise cannot_be_had(err, exc, plan.request) from err
        except ValueError:  # e.g. a backend kerneld does not know: kernels decides
            return theirs()
        note_newer_version(plan.request)
        return registered(state.api, metadata_validator, loaded, validated.get(loaded.path))

    return _mark(get_kernel_with_resolver, original)


def _select_revision_or_version(original: Callable[..., Any]) -> Callable[..., Any]:
    def select_revision_or_version(
        repo_id: str, *, revision: str | None, version: int | None, local_files_only: bool
    ) -> Any:
        def theirs() -> Any:
            return original(
                repo_id, revision=revision, version=version, local_files_only=local_files_only
            )

        if (
            installed_state() is None
            or revision is not None
            or version is None
            or is_local(repo_id)
        ):
            return theirs()
        try:
            req = parse_request(repo_id, version, None)
        except ValueError:
            return theirs()
        plan = Plan(req, allow_fetch=not local_files_only, check_arch=True)
        try:
            commit = through_kerneld(plan, None).commit
            note_newer_version(req)
            return commit
        except VersionNotFound:
            # The repo has no such version: kernels' own ValueError, which fails the load as
            # it does without the hook (a mapping that can never be right).
            raise
        except KernelError as exc:
            # This runs inside `str(repo)` too, in a log line kernelize formats before its
            # fallback `try`: raising here would fail the model load. Whatever else goes wrong,
            # the branch name is answered, and the load that follows (inside that `try`) asks
            # again and fails where kernelize keeps the PyTorch forward.
            final = isinstance(exc, KernelDenied | NoCompatibleVariant)
            if fallback_policy() != "kernels" or final:
                return req.ref
            fall_back(exc, req)  # the one warning: kernels' own lookup follows
            try:
                return theirs()
            except ValueError:  # kernels' "Version N not found": final, as without the hook
                raise
            except Exception:
                return req.ref

    return _mark(select_revision_or_version, original)


def _has_kernel(original: Callable[..., Any]) -> Callable[..., Any]:
    def has_kernel(
        repo_id: str,
        *,
        revision: str | None = None,
        version: int | None = None,
        backend: str | None = None,
        trust_remote_code: bool | list[str] = False,
        check_arch: bool = True,
    ) -> bool:
        def theirs() -> bool:
            return bool(
                original(
                    repo_id,
                    revision=revision,
                    version=version,
                    backend=backend,
                    trust_remote_code=trust_remote_code,
                    check_arch=check_arch,
                )
            )

        if installed_state() is None or is_local(repo_id):
            return theirs()
        try:
            req = parse_request(repo_id, version, revision)
            facts = platform_facts(backend)
        except ValueError:
            return theirs()
        try:
            return has_variant(req, facts, check_arch=check_arch)
        except (KernelDenied, NoCompatibleVariant):
            return False
        except KernelError as exc:
            try:
                fall_back(exc, req)
            except FileNotFoundError:
                return False
            return theirs()

    return _mark(has_kernel, original)


FACTORIES: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "get_kernel": _for_layer,
    "get_kernel_with_resolver": _get_kernel_with_resolver,
    "select_revision_or_version": _select_revision_or_version,
    "has_kernel": _has_kernel,
}
