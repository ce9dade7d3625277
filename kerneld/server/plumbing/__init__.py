"""The daemon's plumbing: what every other layer of `kerneld.server` stands on.

Sockets bound safely and passed by systemd (`sockets`, `activation`), who a caller is
(`identity`: peer credentials and tokens; `peers`: a TCP peer's uid and its right to the user
socket), the store's mode following the user socket (`access`), whether another user could take
a TCP port (`exposure`), sd_notify (`notify`), the sandbox's writable paths (`sandbox`), the log
format (`logs`) and the metrics registry (`metrics`). It imports nothing of the services, the
front ends or the wiring (`tests/test_structure.py`).
"""
