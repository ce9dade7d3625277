"""flash-attn's `flash_attn_interface` module: the public functions, and the forward/backward
entry points Diffusers' hub backends look up when they load the kernel (for context-parallel
training). The example runs inference only: those entry points exist and refuse clearly."""

from typing import Any

from ._impl import flash_attn_func, flash_attn_varlen_func

__all__ = [
    "_flash_attn_backward",
    "_flash_attn_forward",
    "_flash_attn_varlen_backward",
    "_flash_attn_varlen_forward",
    "flash_attn_func",
    "flash_attn_varlen_func",
]


def _inference_only(name: str) -> Any:
    def entry(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"the attention example runs inference only: {name} (softmax statistics, "
            "gradients) is flash-attn's training entry point"
        )

    entry.__name__ = entry.__qualname__ = name
    return entry


_flash_attn_forward = _inference_only("_flash_attn_forward")
_flash_attn_backward = _inference_only("_flash_attn_backward")
_flash_attn_varlen_forward = _inference_only("_flash_attn_varlen_forward")
_flash_attn_varlen_backward = _inference_only("_flash_attn_varlen_backward")
