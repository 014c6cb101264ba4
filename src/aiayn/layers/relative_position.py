"""T5's relative position bias: a learned scalar per head and per *bucket* of the distance from a
query to a key, added to the attention scores (Raffel et al. 2020, "Exploring the Limits of
Transfer Learning with a Unified Text-to-Text Transformer", §2.1 "Model"; Shaw et al. 2018 for
relative positions in attention).

T5 has no positional encoding at all: this bias is its only source of order. It is computed
once per stack and shared by every layer's self-attention (Hugging Face's ``modeling_t5.py``
stores it in the first layer and passes it down); cross-attention has none.

Buckets of the relative position r = key position − query position, with n buckets and a
maximum distance m:

- bidirectional (the encoder): half of the buckets for r > 0, half for r ≤ 0, by |r|;
  causal (the decoder): only r ≤ 0 counts, by −r (keys after the query are masked anyway);
- within a half of n' buckets, distances 0 .. n'/2 − 1 get a bucket each; larger distances share
  logarithmically wider buckets up to m, and every distance ≥ m the last one:
  ``n'/2 + ⌊log(d / (n'/2)) / log(m / (n'/2)) · (n' − n'/2)⌋``, capped at n' − 1.

Shape legend:  H heads   T queries (new positions)   S keys   L positions before the queries
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_position_bucket(
    relative_position: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """The bucket of each relative position (key − query), an integer tensor of the same shape
    with values in [0, num_buckets): see the module docstring for the rule.

    >>> relative_position_bucket(torch.tensor([-3, -1, 0, 1, 3]), bidirectional=True,
    ...                          num_buckets=8, max_distance=16).tolist()
    [2, 1, 0, 5, 6]
    """
    n = num_buckets
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        n //= 2
        buckets = buckets + (relative_position > 0).long() * n  # keys after the query
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # keys after the query: distance 0
    exact = n // 2
    # the float arithmetic of Mesh TensorFlow / Hugging Face, so that boundaries agree
    log_ratio = torch.log(distance.float() / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (n - exact)).long()).clamp(max=n - 1)
    return buckets + torch.where(distance < exact, distance, large)


class RelativePositionBias(nn.Module):
    """The additive attention bias of a stack: one learned value per head and bucket.

    Args:
        num_heads: H.
        bidirectional: True for an encoder, False for a (causal) decoder.
        num_buckets: ``relative_attention_num_buckets`` (32 in T5).
        max_distance: ``relative_attention_max_distance`` (128 in T5).
    """

    def __init__(
        self, num_heads: int, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
    ):
        super().__init__()
        exact = num_buckets // (4 if bidirectional else 2)  # distances with a bucket each
        if exact < 1 or max_distance <= exact:
            raise ValueError(
                f"need num_buckets >= {4 if bidirectional else 2} and max_distance > "
                f"{max(exact, 1)} (the exactly bucketed distances), got num_buckets="
                f"{num_buckets}, max_distance={max_distance}"
            )
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.embedding = nn.Embedding(num_buckets, num_heads)  # (buckets, H)

    def buckets(self, relative_position: Tensor) -> Tensor:
        """Bucket ids of relative positions (key − query), any shape."""
        return relative_position_bucket(
            relative_position,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def forward(self, query_len: int, key_len: int, offset: int = 0) -> Tensor:
        """The bias of queries at positions ``offset .. offset + T − 1`` over keys ``0 .. S − 1``:
        (1, H, T, S), for every row of a batch alike."""
        device = self.embedding.weight.device
        queries = torch.arange(offset, offset + query_len, device=device)  # (T,)
        keys = torch.arange(key_len, device=device)  # (S,)
        values = self.embedding(self.buckets(keys[None, :] - queries[:, None]))  # (T, S, H)
        return values.permute(2, 0, 1)[None]  # (T, S, H) -> (1, H, T, S)

    def causal_table(self, length: int) -> Tensor:
        """Decoder bias for every query position < ``length`` at once, laid out so that the
        bias of the query at position p over keys 0 .. p is the contiguous slice
        ``table[:, length - 1 - p :]``: (H, length), column j holding relative position
        j − (length − 1)."""
        device = self.embedding.weight.device
        relative = torch.arange(-(length - 1), 1, device=device)  # (length,) = −(length−1) .. 0
        return self.embedding(self.buckets(relative)).t()  # (length, H) -> (H, length)
