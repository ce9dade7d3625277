"""Fuzz tests: every parser of untrusted input, bounded for CI (see tests/fuzz/strategies.py)."""
