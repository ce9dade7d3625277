"""The daemon's services: the work behind the front ends, each on a small host protocol.

`serving` (Resolve, ListVariants and leases with the daemon's policy), `gate` (the daemon's
`AcquireGate` and its fetch gate, with `bounds` and the `fetch_history`), `leases` (written
behind in batches), and the background threads (`background`): the scheduled prefetch
(`prefetch_timer`), the ref re-check (`refresh`) and the scrub (`scrubber`). Each takes what it
uses of the daemon as a `typing.Protocol` of its own, never `Core`; a service imports plumbing,
never a front end or the wiring (`tests/test_structure.py`).
"""
