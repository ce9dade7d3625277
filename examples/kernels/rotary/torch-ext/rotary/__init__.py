"""Rotary example kernel: a function kernel, Transformers' `rotary_pos_emb` hub kind.

`apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim=1)` has the signature of Transformers'
`apply_rotary_pos_emb` and returns the rotated `(q, k)`; `apply_rotary(out, x, cos, sin)` is the
op with cos/sin already broadcast to x's shape. `_ops.py` and `_version.py` are written by
examples/kernels/build.py.
"""

from . import layers
from ._impl import apply_rotary, apply_rotary_transformers
from ._ops import add_op_namespace_prefix, ops
from ._version import KERNEL_VERSION, __version__

__all__ = [
    "KERNEL_VERSION",
    "__version__",
    "add_op_namespace_prefix",
    "apply_rotary",
    "apply_rotary_transformers",
    "layers",
    "ops",
]
