"""Additive (Bahdanau) attention, the alternative that §3.2.1 compares dot-product attention to.

    score(q, k) = vᵀ tanh(W_q q + W_k k)
    Attention(Q, K, V) = softmax(score(Q, K)) V

§3.2.1: "additive attention computes the compatibility function using a feed-forward network
with a single hidden layer. While the two are similar in theoretical complexity, dot-product
attention is much faster and more space-efficient in practice." The space difference is visible
below: the hidden layer is evaluated for every (query, key) pair, a (…, T, S, A) tensor, where
dot-product attention only ever holds the (…, T, S) scores.

Masks follow :mod:`aiayn.attention.masks`: boolean, True = may attend, broadcastable to the
scores' shape (B, H, T, S); blocked scores get :func:`~aiayn.attention.masks.mask_fill_value`
of their dtype, and a query row whose keys are all blocked returns zeros (weights and output),
as :func:`~aiayn.attention.scaled_dot_product_attention` does.

Shape legend:
    B  batch size          H  heads (any leading dimensions work; B, H is the usual layout)
    T  query length        S  key/value length
    d_q  query size        d_k  key size         d_v  value size
    A  hidden size of the scoring network (``hidden_size``)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.attention.masks import mask_fill_value

__all__ = ["AdditiveAttention"]


class AdditiveAttention(nn.Module):
    """Additive attention (Bahdanau et al., 2015), as contrasted with eq. (1) in §3.2.1.

    The call mirrors :func:`~aiayn.attention.scaled_dot_product_attention`: it takes already
    projected queries, keys and values and returns ``(output, weights)``.

    Args:
        query_size: d_q, the size of each query vector.
        key_size: d_k, the size of each key vector (defaults to ``query_size``).
        hidden_size: A, the width of the scoring network's hidden layer (defaults to
            ``query_size``).
    """

    def __init__(
        self, query_size: int, key_size: int | None = None, hidden_size: int | None = None
    ):
        super().__init__()
        key_size = query_size if key_size is None else key_size
        hidden_size = query_size if hidden_size is None else hidden_size
        self.query_size = query_size
        self.key_size = key_size
        self.hidden_size = hidden_size
        self.w_query = nn.Linear(query_size, hidden_size, bias=False)  # W_q: (A, d_q)
        self.w_key = nn.Linear(key_size, hidden_size, bias=True)  # W_k: (A, d_k), bias (A,)
        self.v = nn.Linear(hidden_size, 1, bias=False)  # vᵀ: (1, A)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform W_q, W_k and v; zero bias."""
        for layer in (self.w_query, self.w_key, self.v):
            nn.init.xavier_uniform_(layer.weight)
        assert self.w_key.bias is not None
        nn.init.zeros_(self.w_key.bias)

    def scores(self, query: Tensor, key: Tensor) -> Tensor:
        """vᵀ tanh(W_q q + W_k k) for every (query, key) pair.

        Args:
            query: (B, H, T, d_q).
            key: (B, H, S, d_k).

        Returns:
            (B, H, T, S) unnormalised scores.
        """
        q = self.w_query(query)  # (B, H, T, d_q) @ (d_q, A) -> (B, H, T, A)
        k = self.w_key(key)  # (B, H, S, d_k) @ (d_k, A) -> (B, H, S, A)
        hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (B, H, T, 1, A) + (B, H, 1, S, A)
        return self.v(hidden).squeeze(-1)  # (B, H, T, S, A) @ (A, 1) -> (B, H, T, S)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(vᵀ tanh(W_q Q + W_k K)) V.

        Args:
            query: (B, H, T, d_q).
            key: (B, H, S, d_k).
            value: (B, H, S, d_v).
            mask: boolean, broadcastable to (B, H, T, S); True = may attend. None = everywhere.
            need_weights: also return the (B, H, T, S) weights.

        Returns:
            ``(output, weights)``: output (B, H, T, d_v); weights (B, H, T, S) or None.
        """
        scores = self.scores(query, key)  # (B, H, T, S)
        row_has_key: Tensor | None = None
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
            row_has_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T|1, 1)
            # A row with no allowed key: allow all for the arithmetic, zero the row afterwards.
            scores = scores.masked_fill(~(mask | ~row_has_key), mask_fill_value(scores.dtype))
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        if row_has_key is not None:
            weights = weights * row_has_key  # (B, H, T, S): zero the fully blocked rows
        output = weights @ value  # (B, H, T, S) @ (B, H, S, d_v) -> (B, H, T, d_v)
        return output, (weights if need_weights else None)
