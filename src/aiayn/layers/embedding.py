"""Token embeddings (§3.4), positional encodings (§3.5), and the input embedder that joins them.

A positional module adds the encodings of positions ``offset .. offset + T - 1`` to (B, T, D)
inputs, or, given ``positions`` (B, T), of each row's own positions (left-padded prompts of a
decoder-only model start their positions at their first real token).

Shape legend:
    B  batch size     T  sequence length     D  d_model     V  vocabulary size
"""

from __future__ import annotations

import math
import typing
from typing import Literal

import torch
from torch import Tensor, nn

from aiayn.dropout import Dropout


class TokenEmbedding(nn.Module):
    """Learned embedding whose output is multiplied by ``scale``: √d_model in the paper (§3.4),
    1 in GPT-2, BERT and T5.

    Initialised N(0, d_model^-0.5) so that the scaled embedding has unit-variance components, the
    same scale as the positional encoding it is added to. The padding row is zero.
    The weight (V, D) can be shared with another embedding and with the output projection.

    Args:
        scale: the output's multiplier; None = √d_model (the paper).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        pad_id: int | None = None,
        *,
        scale: float | None = None,
    ):
        super().__init__()
        self.d_model = d_model
        self.scale = math.sqrt(d_model) if scale is None else scale
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))  # (V, D)
        self.pad_id = pad_id
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
        if pad_id is not None:
            with torch.no_grad():
                self.weight[pad_id].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, D) embeddings × scale."""
        x = nn.functional.embedding(tokens, self.weight)  # (B, T, D)
        return x if self.scale == 1.0 else x * self.scale


SinusoidLayout = Literal["interleaved", "halves"]
"""How the sines and cosines of :func:`sinusoidal_encoding` are arranged along d_model."""


def sinusoidal_encoding(
    length: int, d_model: int, *, offset: int = 0, layout: SinusoidLayout = "interleaved"
) -> Tensor:
    """The table of §3.5 for positions ``offset .. offset + length - 1``.

    ``layout="interleaved"`` is the paper's: sines at even dimensions, cosines at odd ones,

        PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    ``layout="halves"`` holds the same values, sines first (Marian, the OPUS-MT models, and
    Hugging Face's ``MarianSinusoidalPositionalEmbedding``): with h = ⌈d_model / 2⌉,

        PE(pos, i)     = sin(pos / 10000^(2i / d_model))    for 0 ≤ i < h
        PE(pos, h + i) = cos(pos / 10000^(2i / d_model))    for 0 ≤ i < ⌊d_model / 2⌋

    Returns:
        (length, d_model) float32 tensor.
    """
    if layout not in typing.get_args(SinusoidLayout):
        raise ValueError(f"layout must be one of {typing.get_args(SinusoidLayout)}, got {layout!r}")
    position = torch.arange(offset, offset + length, dtype=torch.float64)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (⌈D/2⌉,)
    angle = position / (10000.0 ** (two_i / d_model))  # (T, ⌈D/2⌉)
    sines, cosines = torch.sin(angle), torch.cos(angle[:, : d_model // 2])  # (T, ⌈D/2⌉), (T, ⌊D/2⌋)
    if layout == "halves":
        return torch.cat([sines, cosines], dim=1).float()  # (T, D)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = sines
    table[:, 1::2] = cosines
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoids of §3.5; positions past ``max_len`` are computed on demand.

    Args:
        d_model: D.
        max_len: positions tabulated up front.
        layout: "interleaved" (the paper) or "halves" (Marian): see :func:`sinusoidal_encoding`.
    """

    table: Tensor

    def __init__(
        self, d_model: int, max_len: int = 1024, *, layout: SinusoidLayout = "interleaved"
    ):
        super().__init__()
        self.d_model = d_model
        self.layout = layout
        table = sinusoidal_encoding(max_len, d_model, layout=layout)
        self.register_buffer("table", table, persistent=False)

    def encoding(self, length: int, offset: int = 0) -> Tensor:
        """(length, D) encodings of positions ``offset ..``."""
        if offset + length <= self.table.size(0):
            return self.table[offset : offset + length]
        table = sinusoidal_encoding(length, self.d_model, offset=offset, layout=self.layout)
        return table.to(self.table.device)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """(B, T, D) -> (B, T, D) with PE of positions ``offset .. offset + T - 1`` added, or of
        ``positions`` (B, T) when given."""
        if positions is None:
            return x + self.encoding(x.size(1), offset).to(x.dtype)  # (B, T, D) + (T, D)
        table = self.encoding(int(positions.max()) + 1)  # (P, D)
        return x + table[positions].to(x.dtype)  # (B, T, D) + (B, T, D)


class LearnedPositionalEmbedding(nn.Module):
    """Learned positional embeddings (Table 3, row E): one vector per position < ``max_len``."""

    def __init__(self, d_model: int, max_len: int = 1024):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))  # (max_len, D)
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """(B, T, D) -> (B, T, D) with learned embeddings of positions ``offset ..`` added, or
        of ``positions`` (B, T) when given."""
        end = offset + x.size(1) if positions is None else int(positions.max()) + 1
        if end > self.max_len:
            raise ValueError(
                f"sequence reaches position {end - 1}, but learned positions stop at "
                f"max_len - 1 = {self.max_len - 1}; raise max_len in the config"
            )
        if positions is not None:
            return x + self.weight[positions]  # (B, T, D) + (B, T, D)
        return x + self.weight[offset:end]  # (B, T, D) + (T, D)


class NoPositionalEncoding(nn.Module):
    """Identity: no position information (the encoder is then permutation-equivariant)."""

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Returns x unchanged."""
        return x


class Embedder(nn.Module):
    """The input embedder of a stack: tokens (+ token types) + positions, then an optional norm
    and dropout (§3.4–3.5, §5.4).

        paper:  Dropout(Embedding(x)·√D + PE)
        GPT-2:  Dropout(Embedding(x) + P)
        BERT:   Dropout(LayerNorm(Embedding(x) + P + TokenType(x)))

    Args:
        embedding: the token embedding (may be shared with another stack and the output layer).
        positional: a positional module (sinusoidal, learned or none).
        dropout: P_drop on the sum.
        token_types: an embedding of segment ids (BERT), or None.
        norm: a norm applied to the sum before dropout (BERT), or None.
    """

    def __init__(
        self,
        embedding: TokenEmbedding,
        positional: nn.Module,
        dropout: float,
        *,
        token_types: nn.Embedding | None = None,
        norm: nn.Module | None = None,
    ):
        super().__init__()
        self.embedding = embedding
        self.positional = positional
        self.token_types = token_types
        self.norm = norm
        self.dropout = Dropout(dropout)

    def forward(
        self,
        tokens: Tensor,
        offset: int = 0,
        *,
        positions: Tensor | None = None,
        token_types: Tensor | None = None,
    ) -> Tensor:
        """(B, T) ids at positions ``offset ..`` (or ``positions`` (B, T)) -> (B, T, D)."""
        x = self.embedding(tokens)  # (B, T, D)
        if self.token_types is not None:
            types = torch.zeros_like(tokens) if token_types is None else token_types
            x = x + self.token_types(types)  # (B, T, D)
        x = self.positional(x, offset, positions)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)
