"""Token embeddings (§3.4) and positional encodings (§3.5).

Shape legend:
    B  batch size     T  sequence length     D  d_model     V  vocabulary size
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    """Learned embedding whose output is multiplied by √d_model (§3.4).

    Initialised N(0, d_model^-0.5) so that the scaled embedding has unit-variance components, the
    same scale as the positional encoding it is added to. The padding row is zero.
    The weight (V, D) can be shared with another embedding and with the output projection.
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int | None = None):
        super().__init__()
        self.d_model = d_model
        self.scale = math.sqrt(d_model)
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))  # (V, D)
        self.pad_id = pad_id
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
        if pad_id is not None:
            with torch.no_grad():
                self.weight[pad_id].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, D) embeddings × √d_model."""
        return nn.functional.embedding(tokens, self.weight) * self.scale


def sinusoidal_encoding(length: int, d_model: int, *, offset: int = 0) -> Tensor:
    """The table of §3.5 for positions ``offset .. offset + length - 1``.

        PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    Returns:
        (length, d_model) float32 tensor.
    """
    position = torch.arange(offset, offset + length, dtype=torch.float64)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (⌈D/2⌉,)
    angle = position / (10000.0 ** (two_i / d_model))  # (T, ⌈D/2⌉)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoids of §3.5; positions past ``max_len`` are computed on demand."""

    table: Tensor

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_encoding(max_len, d_model), persistent=False)

    def encoding(self, length: int, offset: int = 0) -> Tensor:
        """(length, D) encodings of positions ``offset ..``."""
        if offset + length <= self.table.size(0):
            return self.table[offset : offset + length]
        return sinusoidal_encoding(length, self.d_model, offset=offset).to(self.table.device)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """(B, T, D) -> (B, T, D) with PE of positions ``offset .. offset + T - 1`` added."""
        return x + self.encoding(x.size(1), offset).to(x.dtype)  # (B, T, D) + (T, D)


class LearnedPositionalEmbedding(nn.Module):
    """Learned positional embeddings (Table 3, row E): one vector per position < ``max_len``."""

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))  # (max_len, D)
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """(B, T, D) -> (B, T, D) with learned embeddings of positions ``offset ..`` added."""
        end = offset + x.size(1)
        if end > self.max_len:
            raise ValueError(
                f"sequence reaches position {end - 1}, but learned positions stop at "
                f"max_len - 1 = {self.max_len - 1}; raise max_len in the config"
            )
        return x + self.weight[offset:end]  # (B, T, D) + (T, D)


class NoPositionalEncoding(nn.Module):
    """Identity: no position information (the encoder is then permutation-equivariant)."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Returns x unchanged."""
        return x
