"""The one error a configuration raises: every reader, the file loader and the environment
overrides say what is wrong the same way (the file or variable, the key, the reason), so the
daemon can print it and exit 2, and a reload can refuse it and keep the running settings."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration: says where (file and key) and why."""

    def __init__(self, source: str, key: str, reason: str) -> None:
        self.source = source
        self.key = key
        self.reason = reason
        super().__init__(f"{source}: {key}: {reason}")
