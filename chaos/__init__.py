"""Chaos/soak harness for kerneld (issue 10): `python -m chaos` or `make chaos`.

One real daemon serves many real client processes that load a mix of cached and uncached
kernels while everything around them misbehaves: the Hub-compatible test server injects latency,
5xx, 429, connection resets, truncated and corrupted bodies; an admin thread runs `kerneldctl`
prefetch, GC under a small size cap, pin/unpin and deny/allow; a killer sends the daemon
SIGKILL (sometimes SIGTERM) and the harness restarts it, like systemd's `Restart=always`.

At the end it proves the invariants (see `chaos.checks`): the store verifies clean, no client
imported bytes other than what the publisher published, no tree was deleted or changed while a
client held it, every load got its kernel or fell back within its deadline, denies and pins were
honoured; and it prints the figures (operations, errors by kind, fallbacks, p50/p99 latency,
restarts survived, bytes re-fetched from the Hub).

Modules: `catalog` (kernels and their ground truth), `hub` (the faulty Hub), `client` (the client
processes), `daemon` (supervisor, killer, admin churn), `checks` (invariants and figures),
`harness` (the run and its command line).
"""
