"""Pure-PyTorch implementation of the activation kernel, for its noarch variants.

The ops are registered with `torch.library` under the build's namespace, so `ops.*`,
`add_op_namespace_prefix` and the package functions behave as in the compiled variant. The
functions here are differentiable, which the noarch layers use for `has_backward = True`.
"""

import torch
import torch.nn.functional as F


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    return (normed * weight.float()).to(x.dtype)


def _silu_out(out: torch.Tensor, x: torch.Tensor) -> None:
    out.copy_(silu(x))


def _gelu_tanh_out(out: torch.Tensor, x: torch.Tensor) -> None:
    out.copy_(gelu_tanh(x))


def _silu_and_mul_out(out: torch.Tensor, x: torch.Tensor) -> None:
    out.copy_(silu_and_mul(x))


def _gelu_tanh_and_mul_out(out: torch.Tensor, x: torch.Tensor) -> None:
    out.copy_(gelu_tanh_and_mul(x))


def _gelu_and_mul_out(out: torch.Tensor, x: torch.Tensor) -> None:
    out.copy_(gelu_and_mul(x))


def _rms_norm_out(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    out.copy_(rms_norm(x, weight, epsilon))


def register_ops(namespace: str, dispatch_key: str, version: int) -> torch.library.Library:
    """Define this build's ops; the caller keeps the Library alive (dropping it unregisters)."""
    lib = torch.library.Library(namespace, "DEF")
    lib.define("silu_and_mul(Tensor! out, Tensor input) -> ()")
    lib.define("gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()")
    lib.define("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()")
    lib.impl("silu_and_mul", _silu_and_mul_out, dispatch_key)
    lib.impl("gelu_tanh_and_mul", _gelu_tanh_and_mul_out, dispatch_key)
    lib.impl("rms_norm", _rms_norm_out, dispatch_key)
    lib.define("silu(Tensor! out, Tensor input) -> ()")
    lib.define("gelu_tanh(Tensor! out, Tensor input) -> ()")
    lib.impl("silu", _silu_out, dispatch_key)
    lib.impl("gelu_tanh", _gelu_tanh_out, dispatch_key)
    if version >= 2:
        lib.define("gelu_and_mul(Tensor! out, Tensor input) -> ()")
        lib.impl("gelu_and_mul", _gelu_and_mul_out, dispatch_key)
    return lib
