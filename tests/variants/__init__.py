"""Variant grammar, acceptance and preference, checked against tables and against `kernels`.

The drift tests run the real `kernels` 0.17.2 resolver (its `_resolve_variant_for_system`, which
takes explicit facts) on the same names and facts, so a change on either side shows up here.
"""
