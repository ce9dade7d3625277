"""The attributes that mark a layer as kernelizable: the same names `kernels` uses, so a model
marked by either package is kernelized by either (and Transformers' hub layers need no change)."""

from __future__ import annotations

__all__ = ["CONDITION_ATTR", "FUNCS_ATTR", "LAYER_NAME_ATTR"]

#: Class attribute holding the layer name kernel mappings are keyed by.
LAYER_NAME_ATTR = "kernel_layer_name"
#: Class attribute holding the per-instance condition (a staticmethod).
CONDITION_ATTR = "kernel_condition"
#: Instance attribute (in `__dict__`, not a submodule) of `use_kernelized_func`: the instance's
#: own wrappers of the functions it calls, by function name.
FUNCS_ATTR = "_kernel_funcs"
