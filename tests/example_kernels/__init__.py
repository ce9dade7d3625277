"""The example kernels: ops against PyTorch, Hub layout and metadata, caching, git repos.

These kernels are the test material for the rest of kerneld, so these tests check that they are
what the other tests assume: loadable by `kernels`, distinct per build, v1 != v2, digests right.
"""
