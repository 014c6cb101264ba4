"""Multi-head attention, §3.2.2, and its three uses of §3.2.3.

    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The h per-head projections W_i^Q ∈ ℝ^{d_model×d_k} are stored side by side as the rows
``i·d_k : (i+1)·d_k`` of one (d_model, d_model) weight (likewise W^K, W^V), and the three are
stacked into one ``in_proj`` of shape (3·d_model, d_model) so self-attention projects Q, K and V
in one matmul (the layout of :class:`torch.nn.MultiheadAttention`).

Shape legend:
    B  batch size      T  query length        S  key/value length
    D  d_model         H  num_heads           d_k = d_v = D / H
    L  cached length (keys/values of earlier decoding steps)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention.masks import Mask
from aiayn.attention.scaled_dot_product import scaled_dot_product_attention


@dataclass(frozen=True)
class KVCache:
    """Projected keys and values of one attention layer, split into heads.

    Self-attention appends one step at a time (:meth:`append`); cross-attention computes the
    source's keys/values once per source and reuses them at every step.

    Attributes:
        key: (B, H, L, d_k).
        value: (B, H, L, d_v).
    """

    key: Tensor
    value: Tensor

    @property
    def length(self) -> int:
        """L, the number of cached positions."""
        return self.key.size(2)

    def append(self, key: Tensor, value: Tensor) -> KVCache:
        """A new cache with (B, H, T, d) keys/values concatenated after the cached ones."""
        return KVCache(
            torch.cat([self.key, key], dim=2),  # (B, H, L + T, d_k)
            torch.cat([self.value, value], dim=2),  # (B, H, L + T, d_v)
        )

    def index_select(self, index: Tensor) -> KVCache:
        """Reorder/select batch rows (e.g. surviving beams): index is (B',) into B."""
        return KVCache(self.key.index_select(0, index), self.value.index_select(0, index))


class AttentionOutput(NamedTuple):
    """What an attention layer returns.

    Attributes:
        output: (B, T, D).
        weights: (B, H, T, S) attention weights if requested, else None.
        cache: the keys/values used (B, H, S, d_k), to feed back at the next decoding step.
    """

    output: Tensor
    weights: Tensor | None
    cache: KVCache


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) of §3.2.2 with learned W^Q, W^K, W^V (per head) and W^O.

    Args:
        d_model: model size D.
        num_heads: h; d_k = d_v = d_model / h.
        dropout: dropout on the attention weights (the paper uses none; default 0).
        bias: whether the projections have biases.
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.dropout = dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections per (D, D) block and zero biases."""
        for block in self.in_proj.weight.data.chunk(3, dim=0):
            nn.init.xavier_uniform_(block)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for layer in (self.in_proj, self.out_proj):
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    # -- projections -------------------------------------------------------------------------
    def _split_heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        x = x.view(b, n, self.num_heads, self.d_k)  # (B, N, D) -> (B, N, H, d_k)
        return x.transpose(1, 2)  # (B, N, H, d_k) -> (B, H, N, d_k)

    def _proj(self, x: Tensor, block: slice) -> Tensor:
        bias = None if self.in_proj.bias is None else self.in_proj.bias[block]
        return F.linear(x, self.in_proj.weight[block], bias)  # (B, N, D) @ (D, k·D) -> (B, N, k·D)

    def project_query(self, x: Tensor) -> Tensor:
        """Q W^Q for all heads: (B, T, D) -> (B, H, T, d_k)."""
        return self._split_heads(self._proj(x, slice(0, self.d_model)))

    def project_key_value(self, x: Tensor) -> KVCache:
        """K W^K and V W^V for all heads in one matmul: (B, S, D) -> 2 × (B, H, S, d_k)."""
        kv = self._proj(x, slice(self.d_model, 3 * self.d_model))  # (B, S, 2D)
        key, value = kv.chunk(2, dim=-1)  # 2 × (B, S, D)
        return KVCache(self._split_heads(key), self._split_heads(value))

    def project_qkv(self, x: Tensor) -> tuple[Tensor, KVCache]:
        """Q, K, V of self-attention in one matmul: (B, T, D) -> (B, H, T, d_k) and the K/V."""
        qkv = self.in_proj(x)  # (B, T, D) @ (D, 3D) -> (B, T, 3D)
        q, k, v = qkv.chunk(3, dim=-1)  # 3 × (B, T, D)
        return self._split_heads(q), KVCache(self._split_heads(k), self._split_heads(v))

    def attend(self, query: Tensor, kv: KVCache, mask: Mask, need_weights: bool) -> AttentionOutput:
        """Attention per head, concatenation and W^O, given projected heads.

        Args:
            query: (B, H, T, d_k) projected queries.
            kv: keys/values (B, H, S, d_k).
            mask: boolean, broadcastable to (B, H, T, S); True = may attend.
        """
        heads, weights = scaled_dot_product_attention(
            query,
            kv.key,
            kv.value,
            mask,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )  # (B, H, T, d_v)
        b, _, t, _ = heads.shape
        concat = heads.transpose(1, 2).reshape(b, t, self.d_model)  # (B, H, T, d_v) -> (B, T, D)
        return AttentionOutput(self.out_proj(concat), weights, kv)  # (B, T, D) @ W^O -> (B, T, D)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """MultiHead(Q, K, V).

        Args:
            query: (B, T, D).
            key: (B, S, D).
            value: (B, S, D).
            mask: boolean, broadcastable to (B, H, T, S); True = may attend.
            need_weights: also return the (B, H, T, S) weights.
        """
        if key is value:
            kv = self.project_key_value(key)
        else:
            k_full = self._split_heads(self._proj(key, slice(self.d_model, 2 * self.d_model)))
            v_full = self._split_heads(self._proj(value, slice(2 * self.d_model, 3 * self.d_model)))
            kv = KVCache(k_full, v_full)
        return self.attend(self.project_query(query), kv, mask, need_weights)


class SelfAttention(MultiHeadAttention):
    """Self-attention (§3.2.3): queries, keys and values all come from the same sequence.

    Used unmasked in the encoder and with a causal mask in the decoder. With ``cache`` (keys and
    values of the L earlier positions) the T new positions attend to all L + T positions, and the
    returned cache holds them all: incremental decoding.
    """

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        mask: Mask = None,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """Args:
        x: (B, T, D).
        mask: broadcastable to (B, H, T, L + T); True = may attend; or CAUSAL.
        cache: keys/values (B, H, L, d_k) of earlier positions, or None.
        """
        query, kv = self.project_qkv(x)  # (B, H, T, d_k), 2 × (B, H, T, d_k)
        if cache is not None:
            kv = cache.append(kv.key, kv.value)  # 2 × (B, H, L + T, d_k)
        return self.attend(query, kv, mask, need_weights)


class CrossAttention(MultiHeadAttention):
    """Encoder–decoder attention (§3.2.3): decoder queries over the encoder output ("memory").

    The memory's keys/values do not change while decoding one source: pass the returned cache
    back at later steps and the memory is not projected again.
    """

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        memory: Tensor | None,
        mask: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """Args:
        x: (B, T, D) decoder states.
        memory: (B, S, D) encoder output; may be None when ``cache`` is given.
        mask: broadcastable to (B, H, T, S), usually the source padding mask.
        cache: keys/values of the memory from an earlier step.
        """
        if cache is None:
            if memory is None:
                raise ValueError("CrossAttention needs `memory` or a `cache` of its keys/values")
            cache = self.project_key_value(memory)  # 2 × (B, H, S, d_k)
        return self.attend(self.project_query(x), cache, mask, need_weights)
