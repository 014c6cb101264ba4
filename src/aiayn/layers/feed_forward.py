"""Position-wise feed-forward network, eq. (2) of §3.3: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2.

Shape legend:  B batch   T length   D d_model   F d_ff
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """Two linear maps with an activation between, applied to every position alike (§3.3).

    Args:
        d_model: D.
        d_ff: F, the inner size (2048 in the base model).
        activation: "relu" (eq. 2) or "gelu" (BERT/GPT).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff)  # W_1, b_1
        self.linear2 = nn.Linear(d_ff, d_model)  # W_2, b_2
        self.activation = ACTIVATIONS[activation]
        for layer in (self.linear1, self.linear2):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, F) -> (B, T, D)."""
        return self.linear2(self.activation(self.linear1(x)))
