"""The one warning category of the integrations: a job can filter or escalate it
(`-W error::kerneld_client.integrations.kernels.KerneldHookWarning`) whichever hook raised it.
Its own module so that the `kernels` hook and the Diffusers one share it without importing each
other."""

from __future__ import annotations


class KerneldHookWarning(RuntimeWarning):
    """The hook was not installed, or a setting it cannot honour was ignored; the warning says
    what the job gets instead."""
