"""The rotary functions, shared by the package's API and its hub layer."""

import torch

from ._ops import ops


def apply_rotary(
    out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    ops.apply_rotary(out, x, cos, sin)
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    cos = cos.to(x.dtype).expand(x.shape).contiguous()
    sin = sin.to(x.dtype).expand(x.shape).contiguous()
    return apply_rotary(out, x, cos, sin)


def apply_rotary_transformers(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
