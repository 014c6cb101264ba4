"""Multi-head attention, §3.2.2, and its three uses of §3.2.3.

    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

The h per-head projections W_i^Q ∈ ℝ^{d_model×d_k} are stored side by side as the rows
``i·d_k : (i+1)·d_k`` of one (I, d_model) weight, I = h·d_k (likewise W^K, W^V), and the three
are stacked into one ``in_proj`` of shape (3·I, d_model) so self-attention projects Q, K and V
in one matmul (the layout of :class:`torch.nn.MultiheadAttention`).

Shape legend:
    B  batch size      T  query length        S  key/value length
    D  d_model         H  num_heads           d_k = d_v (D / H in the paper)
    I  H·d_k, the heads' total width (= D in the paper)
    L  cached length (keys/values of earlier decoding steps)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention.masks import Causal, Mask
from aiayn.attention.scaled_dot_product import scaled_dot_product_attention
from aiayn.attention.slots import SlotCache, attend_slots


class _Storage:
    """Preallocated key/value buffers (B, H, capacity, d) shared by the successive caches of one
    decoding run; ``filled`` is how many positions some cache has written so far."""

    __slots__ = ("filled", "key", "value")

    def __init__(self, key: Tensor, value: Tensor, filled: int):
        self.key, self.value, self.filled = key, value, filled

    @property
    def capacity(self) -> int:
        return self.key.size(2)

    @staticmethod
    def allocate(like: KVCache, batch: int, capacity: int) -> _Storage:
        """Uninitialised buffers: ``batch`` rows × ``capacity`` positions, shaped like ``like``."""
        _, h, _, d_k = like.key.shape
        return _Storage(
            like.key.new_empty(batch, h, capacity, d_k),  # (B, H, capacity, d_k)
            like.value.new_empty(batch, h, capacity, like.value.size(-1)),  # (B, H, capacity, d_v)
            0,
        )


@dataclass(frozen=True)
class KVCache:
    """Projected keys and values of one attention layer, split into heads.

    Self-attention appends one step at a time (:meth:`append`); cross-attention computes the
    source's keys/values once per source and reuses them at every step.

    Appending writes into preallocated buffers (their capacity doubles when full, as a list's
    does), so a step copies only its new positions, not the whole cache. The buffers are shared
    copy-on-write: appending to a cache that is no longer the newest one of its buffers (two
    continuations of one prefix) copies it first, so no cache ever sees another's writes. While
    autograd records (a cache of tensors that require grad), it concatenates instead: in-place
    writes would change tensors saved for the backward pass.

    Attributes:
        key: (B, H, L, d_k), a view of the valid positions.
        value: (B, H, L, d_v).
    """

    key: Tensor
    value: Tensor
    _storage: _Storage | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        """L, the number of cached positions."""
        return self.key.size(2)

    def append(self, key: Tensor, value: Tensor) -> KVCache:
        """A new cache with (B, H, T, d) keys/values after the cached ones: (B, H, L + T, d)."""
        if _records_grad(self.key, self.value, key, value):
            return KVCache(
                torch.cat([self.key, key], dim=2),  # (B, H, L + T, d_k)
                torch.cat([self.value, value], dim=2),  # (B, H, L + T, d_v)
            )
        old, new = self.length, self.length + key.size(2)
        storage = self._storage
        if storage is None or storage.filled != old or storage.capacity < new:
            storage = _Storage.allocate(self, self.key.size(0), max(2 * new, 16))
            storage.key[:, :, :old] = self.key  # (B, H, L, d_k)
            storage.value[:, :, :old] = self.value
        storage.key[:, :, old:new] = key  # (B, H, T, d_k) into positions L .. L + T - 1
        storage.value[:, :, old:new] = value
        storage.filled = new
        return KVCache(storage.key[:, :, :new], storage.value[:, :, :new], storage)

    def reserve(self, capacity: int) -> KVCache:
        """This cache in buffers of at least ``capacity`` positions, so that appending up to
        them copies only the new positions (e.g. a prompt's keys/values before decoding up to
        a known length). Returns ``self`` when its buffers are already the newest and large
        enough, or while autograd records (appends then concatenate)."""
        storage, n = self._storage, self.length
        if _records_grad(self.key, self.value) or (
            storage is not None and storage.filled == n and storage.capacity >= capacity
        ):
            return self
        storage = _Storage.allocate(self, self.key.size(0), max(capacity, n))
        storage.key[:, :, :n] = self.key  # (B, H, L, d_k)
        storage.value[:, :, :n] = self.value
        storage.filled = n
        return KVCache(storage.key[:, :, :n], storage.value[:, :, :n], storage)

    def index_select(self, index: Tensor) -> KVCache:
        """Reorder/select batch rows (e.g. surviving beams): index is (B',) into B."""
        if self._storage is None or _records_grad(self.key, self.value):
            return KVCache(self.key.index_select(0, index), self.value.index_select(0, index))
        storage = _Storage.allocate(self, index.numel(), self._storage.capacity)
        n = self.length
        torch.index_select(self.key, 0, index, out=storage.key[:, :, :n])  # (B', H, L, d_k)
        torch.index_select(self.value, 0, index, out=storage.value[:, :, :n])
        storage.filled = n
        return KVCache(storage.key[:, :, :n], storage.value[:, :, :n], storage)


def _records_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class AttentionOutput(NamedTuple):
    """What an attention layer returns.

    Attributes:
        output: (B, T, D).
        weights: (B, H, T, S) attention weights if requested, else None.
        cache: the keys/values used (B, H, S, d_k), to feed back at the next decoding step.
    """

    output: Tensor
    weights: Tensor | None
    cache: KVCache | SlotCache


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) of §3.2.2 with learned W^Q, W^K, W^V (per head) and W^O.

    Args:
        d_model: model size D.
        num_heads: h.
        head_dim: d_k = d_v; None = d_model / h (the paper). T5 sets it apart from D, so the
            heads' total width I = h·d_k may differ from D.
        dropout: dropout on the attention weights (the paper uses none; default 0).
        bias: whether the projections have biases (T5's have none).
        scale: on Q Kᵀ; None = 1/√d_k (eq. 1), T5 uses 1.0.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        scale: float | None = None,
    ):
        super().__init__()
        if head_dim is None:
            if d_model % num_heads != 0:
                raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
            head_dim = d_model // num_heads
        if head_dim < 1 or num_heads < 1:
            raise ValueError(f"need num_heads >= 1 and head_dim >= 1, got {num_heads}, {head_dim}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = head_dim
        self.inner_dim = num_heads * head_dim  # I = h·d_k (= D in the paper)
        self.dropout = dropout
        self.scale = scale
        self.in_proj = nn.Linear(d_model, 3 * self.inner_dim, bias=bias)  # rows: [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(self.inner_dim, d_model, bias=bias)  # W^O
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections per (I, D) block and zero biases."""
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
        """(B, N, D) @ W[block]ᵀ -> (B, N, k·I) for a block of the stacked rows [W^Q; W^K; W^V]."""
        if not isinstance(self.in_proj, nn.Linear):  # packed for inference: it slices itself
            return self.in_proj(x, block)  # see aiayn.inference.packed
        bias = None if self.in_proj.bias is None else self.in_proj.bias[block]
        return F.linear(x, self.in_proj.weight[block], bias)

    def project_query(self, x: Tensor) -> Tensor:
        """Q W^Q for all heads: (B, T, D) -> (B, H, T, d_k)."""
        return self._split_heads(self._proj(x, slice(0, self.inner_dim)))  # (B, T, I) -> heads

    def project_key_value(self, x: Tensor) -> KVCache:
        """K W^K and V W^V for all heads in one matmul: (B, S, D) -> 2 × (B, H, S, d_k)."""
        kv = self._proj(x, slice(self.inner_dim, 3 * self.inner_dim))  # (B, S, 2I)
        key, value = kv.chunk(2, dim=-1)  # 2 × (B, S, I)
        return KVCache(self._split_heads(key), self._split_heads(value))

    def project_qkv(self, x: Tensor) -> tuple[Tensor, KVCache]:
        """Q, K, V of self-attention in one matmul: (B, T, D) -> (B, H, T, d_k) and the K/V."""
        qkv = self.in_proj(x)  # (B, T, D) @ (D, 3I) -> (B, T, 3I)
        q, k, v = qkv.chunk(3, dim=-1)  # 3 × (B, T, I)
        return self._split_heads(q), KVCache(self._split_heads(k), self._split_heads(v))

    def attend(
        self,
        query: Tensor,
        kv: KVCache | SlotCache,
        mask: Mask,
        need_weights: bool,
        bias: Tensor | None = None,
    ) -> AttentionOutput:
        """Attention per head, concatenation and W^O, given projected heads.

        Args:
            query: (B·G, H, T, d_k) projected queries: G ≥ 1 consecutive query rows share each
                key/value row (G = K when the K beams of a sentence attend to its one source).
            kv: keys/values (B, H, S, d_k).
            mask: boolean, broadcastable to (B, H, T, S); True = may attend. With G > 1 it must
                not vary along T (a source padding mask), as the G·T queries share it.
            bias: additive float scores broadcastable to (B, H, T, S) (G = 1 only), or None.

        With a :class:`~aiayn.attention.slots.SlotCache` (one new position per row, each over
        its own keys: no mask), no weights are returned.
        """
        b_q, _, t, _ = query.shape
        if isinstance(kv, SlotCache):
            if need_weights:
                raise ValueError("attention over a slot cache returns no weights")
            heads_s = attend_slots(query, kv, bias=bias, scale=self.scale)  # (B, H, 1, d_v)
            concat_s = heads_s.transpose(1, 2).reshape(b_q, t, self.inner_dim)  # -> (B, 1, I)
            return AttentionOutput(self.out_proj(concat_s), None, kv)
        groups = b_q // kv.key.size(0)
        if b_q != kv.key.size(0):
            if bias is not None:
                raise ValueError("an attention bias needs one key/value row per query row")
            query = _fold_groups(query, kv.key.size(0), mask)  # -> (B, H, G·T, d_k)
        heads, weights = scaled_dot_product_attention(
            query,
            kv.key,
            kv.value,
            mask,
            bias=bias,
            scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )  # (B, H, G·T, d_v)
        b, h = heads.shape[:2]
        heads = heads.view(b, h, groups, t, self.d_k)  # (B, H, G·T, d_v) -> (B, H, G, T, d_v)
        concat = heads.permute(0, 2, 3, 1, 4).reshape(b_q, t, self.inner_dim)  # -> (B·G, T, I)
        if weights is not None:
            weights = weights.view(b, h, groups, t, -1).transpose(1, 2)  # (B, G, H, T, S)
            weights = weights.reshape(b_q, h, t, -1)  # (B·G, H, T, S)
        return AttentionOutput(self.out_proj(concat), weights, kv)  # (B·G, T, I) @ W^O

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
            i = self.inner_dim
            k_full = self._split_heads(self._proj(key, slice(i, 2 * i)))  # (B, H, S, d_k)
            v_full = self._split_heads(self._proj(value, slice(2 * i, 3 * i)))
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
        cache: KVCache | SlotCache | None = None,
        need_weights: bool = False,
        bias: Tensor | None = None,
    ) -> AttentionOutput:
        """Args:
        x: (B, T, D).
        mask: broadcastable to (B, H, T, L + T); True = may attend; or CAUSAL.
        cache: keys/values (B, H, L, d_k) of earlier positions, or each row's in a slot pool
            (:class:`~aiayn.attention.slots.SlotCache`: T = 1, the mask unused), or None.
        bias: additive scores broadcastable to (B, H, T, L + T) (a position bias), or None.
        """
        query, new = self.project_qkv(x)  # (B, H, T, d_k), 2 × (B, H, T, d_k)
        kv = new if cache is None else cache.append(new.key, new.value)  # (B, H, L + T, d_k)
        return self.attend(query, kv, mask, need_weights, bias)


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
        bias: Tensor | None = None,
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
        return self.attend(self.project_query(x), cache, mask, need_weights, bias)


def _fold_groups(query: Tensor, batch: int, mask: Mask) -> Tensor:
    """(B·G, H, T, d_k) queries -> (B, H, G·T, d_k) for ``batch`` = B key/value rows: the G rows
    that share one key/value row become G·T query positions of it (no key/value is copied)."""
    b_q, h, t, d_k = query.shape
    if b_q % batch or isinstance(mask, Causal) or (mask is not None and mask.size(-2) != 1):
        raise ValueError(
            f"{b_q} query rows cannot share {batch} key/value rows: grouped queries need a batch "
            "that is a multiple of the key/value batch, and a mask that is the same for every query"
        )
    query = query.view(batch, b_q // batch, h, t, d_k)  # (B, G, H, T, d_k)
    return query.transpose(1, 2).reshape(batch, h, b_q // batch * t, d_k)  # (B, H, G·T, d_k)
