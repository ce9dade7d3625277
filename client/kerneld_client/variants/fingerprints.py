"""A platform's fingerprint: every fact variant choice reads, as one short readable string.

The daemon publishes, per commit and per fingerprint of the platforms its clients showed, the
variant `decide()` picks (`picks` in the published index), so a warm load looks its own
fingerprint up instead of ranking the variants itself: it never imports the rules (their enums
and dataclasses were 4 ms of every process's start-up).

Both sides compute the fingerprint from the same form, `PlatformFacts.to_dict()`: the daemon from
the facts a client sent, the client from its detection, which produces that form without
building `PlatformFacts` (`kerneld_client.platform`). What `decide()` does not read is left out
(device capabilities, checked before import; the Python micro version; whether the backend was
asked for explicitly), so platforms that differ only there share their picks. The Python
major.minor is always in it: a new-format name (`cpython-3.12-abi3`) names a minimum Python;
and whether it is free-threaded (`t`): abi3, every legacy arch name, never loads there.
Example::

    torch2.13-cxx11-cuda13.0-x86_64-linux-py3.12   (py3.13t when free-threaded; + -macos26,
                                                    -tvmffi0.1, -mlx when set)
"""

from __future__ import annotations

from kerneld_client.vocabulary import fingerprint

__all__ = ["fingerprint"]

# Defined in `vocabulary` (the names the client and the daemon spell alike): the warm fast path
# computes it on every warm load without importing this package.
