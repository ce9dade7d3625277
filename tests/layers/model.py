"""A small transformer-style model whose RMSNorm and SiLU-and-mul layers are marked for kernels.

The PyTorch forwards compute exactly what the example `activation` kernel computes, so a
kernelized model must match this one within float tolerance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kerneld_client.layers import use_kernel_forward_from_hub


@use_kernel_forward_from_hub("RMSNorm")
class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        xf = hidden_states.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        return (normed * self.weight.float()).to(hidden_states.dtype)


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * inner, bias=False)
        self.act = SiluAndMul()
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate_up(x)))


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = MLP(hidden, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyTransformer(nn.Module):
    def __init__(
        self,
        *,
        vocab: int = 97,
        hidden: int = 64,
        inner: int = 128,
        heads: int = 4,
        blocks: int = 3,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, inner, heads) for _ in range(blocks))
        self.norm = RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model(seed: int = 0, **kwargs: int) -> TinyTransformer:
    """A model with non-trivial norm weights (ones would hide a kernel ignoring `weight`)."""
    torch.manual_seed(seed)
    model = TinyTransformer(**kwargs)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return model


def tokens(batch: int = 2, seq: int = 16, vocab: int = 97, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def marked_names(model: nn.Module) -> list[str]:
    """Names of the RMSNorm and SiluAndMul instances, in model order."""
    return [n for n, m in model.named_modules() if isinstance(m, RMSNorm | SiluAndMul)]
