"""Position-wise feed-forward networks, eq. (2) of §3.3: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2,
and the gated variant of T5 v1.1 (Shazeer 2020, "GLU Variants Improve Transformer"):

    FFN_gated(x) = (act(x W_0) ⊙ x W_1) W_2

Activations by name: ``relu`` (eq. 2), ``gelu`` (exact erf form, BERT/ViT), ``gelu_tanh`` (the
tanh approximation of GPT-2 and T5 v1.1's "gelu_new"), ``silu`` (x·σ(x), "swish": Marian's
OPUS-MT models).

Both networks may drop out their inner activations (the F-wide hidden layer) in training, as
Hugging Face's T5 (``T5DenseActDense``, ``T5DenseGatedActDense``) does at its ``dropout_rate``:
Raffel et al. (2020) apply dropout "throughout the network". The paper's network (§5.4) drops
out only the sub-layer's output, so the default rate is 0.

Shape legend:  B batch   T length   D d_model   F d_ff
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.dropout import Dropout

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """The activation called ``name``; an unknown name is a ValueError listing the known ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """Two linear maps with an activation between, applied to every position alike (§3.3).

    Args:
        d_model: D.
        d_ff: F, the inner size (2048 in the base model).
        activation: a name of :data:`ACTIVATIONS` ("relu" in eq. 2).
        bias: whether the two maps have biases (T5's have none).
        dropout: dropout on the inner activations in training (T5's; 0 in the paper).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        *,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.activation_name = activation
        self.activation = activation_fn(activation)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)  # W_1, b_1
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)  # W_2, b_2
        self.dropout = Dropout(dropout)  # on the (B, T, F) activations; identity in eval mode
        for layer in (self.linear1, self.linear2):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, F) -> (B, T, D)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class GatedFeedForward(nn.Module):
    """The gated feed-forward network (GLU variant): (act(x W_0) ⊙ x W_1) W_2, no biases by
    default (T5 v1.1 / FLAN-T5 with ``gelu_tanh``: "gated-gelu").

    Args:
        d_model: D.
        d_ff: F.
        activation: a name of :data:`ACTIVATIONS`, applied to the gate x W_0.
        bias: whether the three maps have biases.
        dropout: dropout on the gated (B, T, F) activations in training (T5 v1.1's).
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: str, *, bias: bool = False, dropout: float = 0.0
    ):
        super().__init__()
        self.activation_name = activation
        self.activation = activation_fn(activation)
        self.gate = nn.Linear(d_model, d_ff, bias=bias)  # W_0
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)  # W_1
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)  # W_2
        self.dropout = Dropout(dropout)  # on the (B, T, F) gated activations; eval: identity
        for layer in (self.gate, self.linear1, self.linear2):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> 2 × (B, T, F) -> (B, T, D)."""
        return self.linear2(self.dropout(self.activation(self.gate(x)) * self.linear1(x)))
