"""The CUDA example kernel's opt-in build (`make cuda-examples`): toolkit wheels, nvcc, arch check.

Kept apart from the CPU build (its own package, so the CPU examples' cache key does not hash it):
the default test path never downloads the CUDA wheels.
"""
