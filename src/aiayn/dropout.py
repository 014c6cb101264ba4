"""Dropout (§5.4, P_drop) with a faster mask on CPU.

On CPU, :func:`torch.nn.functional.dropout` draws one Bernoulli sample per element, which costs
about as much as a small matmul (docs/performance.md). This module draws 16 random bits per
element instead (four
elements per 64-bit draw of the same generator) and keeps an element when those bits, read as a
signed 16-bit integer, reach a threshold:

    P(drop) = p' = round(p · 2¹⁶) / 2¹⁶   (|p' − p| ≤ 2⁻¹⁷; p = 0.1 → 0.1000061)
    y = x · keep / (1 − p')               (inverted dropout: E[y] = x)

Elsewhere (CUDA) it is :func:`torch.nn.functional.dropout`, whose fused kernel is already fast.
Both use torch's default generator, so ``torch.manual_seed`` and saved RNG states reproduce them.

Shape legend:  N elements of ``x`` (any shape)   W = ⌈N / 4⌉ 64-bit words
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout of ``x`` (any shape) with drop probability ``p`` (see module docstring)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    dropped = round(p * _LEVELS)  # p' · 2¹⁶
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # (W,)
    # (W,) int64 -> (4W,) int16 -> (N,) -> x's shape; uniform on [−2¹⁵, 2¹⁵)
    bits = words.view(torch.int16)[: x.numel()].view(x.shape)
    keep = bits >= dropped - _LEVELS // 2  # P(keep) = 1 − p'
    return (x * keep).mul_(_LEVELS / (_LEVELS - dropped))  # x · keep / (1 − p')


class Dropout(nn.Dropout):
    """:func:`dropout` as a module: active in training mode, the identity in eval mode."""

    def __init__(self, p: float):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        super().__init__(p)

    def forward(self, x: Tensor) -> Tensor:
        """(*) -> (*)."""
        return dropout(x, self.p, self.training)
