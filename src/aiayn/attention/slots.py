"""One key/value cache for many decoding rows: a pool of slots, each row of a decode holding one
slot with its own length (the incremental decoding of §3.2.3: each new position attends to the
keys/values of the positions before it, kept rather than recomputed).

The pool is one buffer (N, 2, M, H, C, d_k): N layers, keys and values, M slots of C positions.
A row is a slot index and a length: its keys/values sit in columns 0 .. length − 1 of its slot,
whatever the other rows hold, so rows that started at different steps, or left, never move
another row's keys/values and never pay for another's history (no padding columns). A step
writes each row's new key/value at column ``length`` of its slot and attends over its first
``length + 1`` columns (:func:`attend_slots`). A beam search's reorder copies a parent's columns
into the slot of a row that duplicates it (:func:`select_slots`); a row that leaves frees its
slot. Slots and capacity grow by doubling (one copy of the pool) when a decode needs more.

The idea is that of torchtune's ``KVCache``, gpt-fast's static cache and flash-attention's
``cache_seqlens``/``cache_batch_idx``: per-row lengths into preallocated buffers.

Shape legend:
    N layers   M slots   H heads   C capacity (positions per slot)   d_k size per head
    B rows of a step   S the longest row's keys
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aiayn.attention.scaled_dot_product import scaled_dot_product_attention
from aiayn.kernels.attention import native_attend_rows
from aiayn.settings import performance


class SlotPool:
    """Keys/values of N layers for up to M rows, (N, 2, M, H, C, d_k), and its free slots.

    Args:
        layers, heads, d_k: N, H, d_k.
        like: a tensor of the dtype and device the buffer takes.
        slots: M to start with (doubles when more are taken).
        capacity: C to start with (doubles when a row needs more: :meth:`reserve`).
    """

    def __init__(
        self, layers: int, heads: int, d_k: int, like: Tensor, *, slots: int = 8, capacity: int = 64
    ):
        if min(layers, heads, d_k, slots, capacity) < 1:
            raise ValueError("a slot pool needs layers, heads, d_k, slots and capacity >= 1")
        shape = (layers, 2, slots, heads, capacity, d_k)
        self.buffer = like.new_zeros(shape)  # zeros: a never-written column is never NaN
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: lowest first

    @property
    def slots(self) -> int:
        """M."""
        return self.buffer.size(2)

    @property
    def capacity(self) -> int:
        """C."""
        return self.buffer.size(4)

    @property
    def free(self) -> int:
        """Slots not taken."""
        return len(self._free)

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer ``i``'s keys and values, 2 × (M, H, C, d_k) views."""
        return self.buffer[i, 0], self.buffer[i, 1]

    def take(self, count: int) -> Tensor:
        """``count`` free slots (M doubles until there are enough), (count,) int64."""
        while len(self._free) < count:
            self._grow(slots=2 * self.slots)
        taken = [self._free.pop() for _ in range(count)]
        return torch.tensor(taken, dtype=torch.long, device=self.buffer.device)

    def release(self, slots: Tensor) -> None:
        """Give ``slots`` (k,) back; their contents are left as they are (never read again)."""
        self._free.extend(int(x) for x in slots.tolist())

    def reserve(self, columns: int) -> None:
        """Room for ``columns`` positions per slot (C doubles until there is)."""
        capacity = self.capacity
        while capacity < columns:
            capacity *= 2
        if capacity != self.capacity:
            self._grow(capacity=capacity)

    @torch.inference_mode()
    def _grow(self, *, slots: int | None = None, capacity: int | None = None) -> None:
        """A larger buffer holding the old one's contents (one copy)."""
        n, _, m, h, c, d_k = self.buffer.shape
        new_m, new_c = slots or m, capacity or c
        grown = self.buffer.new_zeros(n, 2, new_m, h, new_c, d_k)
        grown[:, :, :m, :, :c] = self.buffer  # (N, 2, M, H, C, d_k) into the larger buffer
        self.buffer = grown
        self._free[:0] = list(range(new_m - 1, m - 1, -1))  # the new slots, after the old


@dataclass(frozen=True)
class SlotCache:
    """One layer's keys/values of a step's rows, in a :class:`SlotPool`: what self-attention
    appends to and attends over (as :class:`~aiayn.attention.KVCache`, one layer's).

    Attributes:
        key, value: the layer's (M, H, C, d_k) buffers.
        rows: (B,) each row's slot.
        lengths: (B,) each row's positions written.
        longest: an upper bound of ``lengths`` (S), known on the host.
        at: (B·H,) where each row's heads write their next position in the buffers viewed as
            (M·H·C, d_k) rows (:func:`write_index`), or None: computed when appending.
    """

    key: Tensor
    value: Tensor
    rows: Tensor
    lengths: Tensor
    longest: int
    at: Tensor | None = None

    @property
    def length(self) -> int:
        """S, the longest row's keys (an upper bound)."""
        return self.longest

    @torch.inference_mode()
    def append(self, key: Tensor, value: Tensor) -> SlotCache:
        """Each row's (B, H, 1, d_k) new key/value into column ``lengths`` of its slot: the cache
        of the rows one position longer."""
        if key.size(2) != 1:
            raise ValueError(f"a slot cache takes one new position per step, got {key.size(2)}")
        m, h, c, d_k = self.key.shape
        if self.longest >= c:
            raise ValueError(f"the slot pool holds {c} positions: reserve more")
        at = self.at if self.at is not None else write_index(self.rows, self.lengths, h, c)
        b = key.size(0)
        self.key.view(m * h * c, d_k).index_copy_(0, at, key.reshape(b * h, d_k))  # (B·H, d_k)
        self.value.view(m * h * c, -1).index_copy_(0, at, value.reshape(b * h, -1))
        return SlotCache(self.key, self.value, self.rows, self.lengths + 1, self.longest + 1)


def write_index(rows: Tensor, lengths: Tensor, heads: int, capacity: int) -> Tensor:
    """(B·H,) the rows of (M·H·C, d_k) buffers where each row's heads write position
    ``lengths``: (slot·H + head)·C + length. E.g. rows [1, 0], lengths [2, 0], H 2, C 4 ->
    [10, 14, 0, 4]."""
    heads_at = torch.arange(heads, device=rows.device) * capacity  # (H,)
    return ((rows * heads * capacity + lengths)[:, None] + heads_at).reshape(-1)  # (B·H,)


def attend_slots(
    query: Tensor, cache: SlotCache, *, bias: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """Attention (eq. 1) of each row's one query over its own keys/values: query (B, H, 1, d_k)
    over columns 0 .. lengths[b] − 1 of slot rows[b]; ``bias`` broadcastable to (B, H, 1, S).
    Returns (B, H, 1, d_v). A row of length 0 gives zeros.

    aiayn's kernel reads the slots in place (on CPU, float32, no gradients); elsewhere the rows'
    columns are gathered and masked for :func:`scaled_dot_product_attention`. Tests hold the two
    equal."""
    native = _native(query, cache, bias)
    if native is not None:
        macs = performance().native_attention_min_parallel_macs
        k, v = cache.key, cache.value
        return native(query, k, v, cache.rows, cache.lengths, bias, scale, macs)  # (B, H, 1, d_v)
    return attend_slots_reference(query, cache, bias=bias, scale=scale)


def attend_slots_reference(
    query: Tensor, cache: SlotCache, *, bias: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """:func:`attend_slots` by gathering each row's S columns and masking those past its length."""
    s = cache.longest
    keys = cache.key[:, :, :s].index_select(0, cache.rows)  # (M, H, S, d_k) -> (B, H, S, d_k)
    values = cache.value[:, :, :s].index_select(0, cache.rows)  # (B, H, S, d_v)
    own = torch.arange(s, device=query.device) < cache.lengths[:, None]  # (B, S)
    out, _ = scaled_dot_product_attention(
        query, keys, values, own[:, None, None, :], bias=bias, scale=scale
    )  # (B, H, 1, d_v)
    return out


def _native(query: Tensor, cache: SlotCache, bias: Tensor | None) -> Any | None:
    """aiayn's ``attend_rows`` where it takes the call, else None."""
    tensors = (query, cache.key, cache.value) + (() if bias is None else (bias,))
    if any(t.dtype is not torch.float32 or not t.is_cpu for t in tensors):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    if performance().native_attention_max_queries < 1 or query.size(2) != 1:
        return None
    return native_attend_rows()


@torch.inference_mode()
def select_slots(pool: SlotPool, rows: Tensor, index: Tensor, lengths: Tensor) -> Tensor:
    """The slots of rows ``index`` (B',) of the B rows in slots ``rows`` (B,), each holding
    ``lengths`` (B,) positions: the first row to pick an old row keeps its slot, a row that
    picks one again gets a free slot with a copy of its columns (a beam that two survivors
    continue), and the slots no row picks are released. Returns (B',) slots.

    E.g. rows [4, 7, 9], index [1, 1, 0]: row 7 keeps 7, the second copy takes slot 9 (freed:
    nobody picked row 2) and row 4 keeps 4 -> [7, 9, 4]."""
    b = rows.numel()
    picked = torch.zeros(b, dtype=torch.bool, device=rows.device)
    picked[index] = True
    order = torch.sort(index, stable=True)  # the first pick of each old row comes first
    first = torch.ones_like(index, dtype=torch.bool)
    first[order.indices[1:]] = order.values[1:] != order.values[:-1]
    out = rows.index_select(0, index)  # (B',)
    pool.release(rows[~picked])
    again = (~first).nonzero()[:, 0]  # (k,) the rows that pick an old row again
    if again.numel():
        fresh = pool.take(again.numel())  # (k,)
        parents = out.index_select(0, again)  # (k,) the slots they copy
        s = int(lengths.index_select(0, index.index_select(0, again)).max())
        pool.buffer[:, :, fresh, :, :s] = pool.buffer[:, :, parents, :, :s]  # (N, 2, k, H, S, d_k)
        out[again] = fresh
    return out


@dataclass(frozen=True)
class SlotRows:
    """The rows of a decode in a :class:`SlotPool`: each row's slot and length.

    Attributes:
        pool: the pool.
        rows: (B,) each row's slot.
        lengths: (B,) each row's positions written.
        longest: max(lengths), on the host (0 for no rows).
    """

    pool: SlotPool
    rows: Tensor
    lengths: Tensor
    longest: int

    @staticmethod
    def taken(pool: SlotPool, lengths: list[int], columns: int = 0) -> SlotRows:
        """Free slots for rows of ``lengths`` positions (written by the caller), in a pool
        with room for at least ``columns`` positions per slot."""
        rows = pool.take(len(lengths))  # (B,)
        pool.reserve(max(columns, *lengths) if lengths else columns)
        return SlotRows(pool, rows, torch.tensor(lengths, device=rows.device), max(lengths))

    def cache(self, layer: int, at: Tensor | None = None) -> SlotCache:
        """Layer ``layer``'s view of the rows, for a step's attention; ``at``: the step's
        :meth:`write_index`, the same in every layer (computed once a step by the caller)."""
        key, value = self.pool.layer(layer)
        return SlotCache(key, value, self.rows, self.lengths, self.longest, at)

    def write_index(self) -> Tensor:
        """(B·H,) where the rows write their next position (:func:`write_index`)."""
        _, _, _, h, c, _ = self.pool.buffer.shape
        return write_index(self.rows, self.lengths, h, c)

    @torch.inference_mode()
    def advanced(self) -> SlotRows:
        """The rows one position longer (after a step wrote it)."""
        return SlotRows(self.pool, self.rows, self.lengths + 1, self.longest + 1)

    def select(self, index: Tensor) -> SlotRows:
        """Rows ``index`` (B',) as their own rows (:func:`select_slots`: a row picked twice gets
        a copy); the slots no row picks are released."""
        rows = select_slots(self.pool, self.rows, index, self.lengths)  # (B',)
        return self._with(rows, self.lengths.index_select(0, index))

    @torch.inference_mode()
    def select_shared(self, index: Tensor) -> SlotRows:
        """Rows ``index`` (B',) sharing the slots they pick (read-only rows, e.g. the beams of
        one source); the slots no row picks any more are released."""
        rows = self.rows.index_select(0, index)  # (B',)
        kept = torch.zeros(self.pool.slots, dtype=torch.bool, device=rows.device)
        kept[rows] = True
        gone = self.rows[~kept[self.rows]].unique()
        self.pool.release(gone)
        return self._with(rows, self.lengths.index_select(0, index))

    def release(self) -> None:
        """Give every row's slot back (distinct slots: a decode's own rows)."""
        self.pool.release(self.rows.unique())

    @staticmethod
    def concat(parts: list[SlotRows]) -> SlotRows:
        """The rows of ``parts`` (one pool) in order, as one decode's."""
        rows = torch.cat([p.rows for p in parts])  # (ΣB,)
        lengths = torch.cat([p.lengths for p in parts])
        return SlotRows(parts[0].pool, rows, lengths, max(p.longest for p in parts))

    def _with(self, rows: Tensor, lengths: Tensor) -> SlotRows:
        longest = int(lengths.max()) if lengths.numel() else 0
        return SlotRows(self.pool, rows, lengths, longest)
