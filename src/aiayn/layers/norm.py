"""Normalisation layers, handed to blocks through a factory.

    LayerNorm(x) = (x − mean(x)) / √(var(x) + ε) · γ + β       (Ba et al. 2016; §3.1)
    RMSNorm(x)   = x / √(mean(x²) + ε) · γ                     (Zhang & Sennrich 2019; T5)

A block receives a :data:`NormFactory` (``d -> module``) and builds each of its norms from it, so
a family picks its norm once, in its builder.

Shape legend:  * any leading dimensions   D the normalised (last) dimension
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

NormFactory = Callable[[int], nn.Module]
"""Builds a norm over the last dimension of size D: ``factory(D) -> module``."""


class RMSNorm(nn.Module):
    """Root-mean-square norm without bias or mean subtraction (T5's "LayerNorm").

    The mean of squares and the division are computed in fp32 whatever the input dtype, and the
    result is cast to the gain's dtype before the gain (as T5 does).
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))  # γ, (D,)

    def forward(self, x: Tensor) -> Tensor:
        """(*, D) -> (*, D)."""
        x = x.float()
        mean_square = x.pow(2).mean(dim=-1, keepdim=True)  # (*, 1)
        return self.weight * (x * torch.rsqrt(mean_square + self.eps)).to(self.weight.dtype)


def layer_norm(eps: float = 1e-5) -> NormFactory:
    """A factory of :class:`torch.nn.LayerNorm` with this ε (1e-5 in PyTorch's default)."""
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return partial(nn.LayerNorm, eps=eps)


def rms_norm(eps: float = 1e-6) -> NormFactory:
    """A factory of :class:`RMSNorm` with this ε (1e-6 in T5)."""
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return partial(RMSNorm, eps=eps)
