"""Encoded datasets, token-budget batching and collation into padded tensors (§5.1).

"Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
tokens." — :class:`TokenBatchSampler` does this much as fairseq does: sort the sentences by
length, breaking ties at random, pack consecutive sentences into batches under a token budget,
then shuffle the order of the batches. The sort key is (longer side, target length, source
length), not fairseq's (source length, target length): sorting by the source alone lets target
lengths spread inside a batch, and target padding is the costly kind (the decoder and the output
layer run on it); docs/performance.md compares the two keys. Everything random is drawn from
``(seed, epoch)``,
so a trainer can rebuild an epoch's batch list and resume at any batch index.

Lengths passed to the sampler are subword counts *without* specials (as returned by
:attr:`ParallelDataset.src_lengths`); :func:`collate` adds exactly one special per tensor row
(``src = ids + EOS``, ``tgt_in = BOS + ids``, ``tgt_out = ids + EOS``), so a sentence pair
occupies ``max(src_len, tgt_len) + 1`` positions of the budget.

Shape legend:
    B  batch size (sentence pairs in the batch)
    S  padded source length = longest source in the batch + 1 (EOS)
    T  padded target length = longest target in the batch + 1 (BOS on input, EOS on output)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from torch import Tensor

from aiayn.errors import UserError
from aiayn.validation import is_int_at_least

if TYPE_CHECKING:
    from aiayn.data.pretrained_tokenizer import TranslationTokenizer

__all__ = [
    "SPECIALS_PER_ROW",
    "Batch",
    "Example",
    "ParallelDataset",
    "TensorBatch",
    "TokenBatchSampler",
    "collate",
    "padding_fraction",
]

SPECIALS_PER_ROW = 1
"""Specials :func:`collate` adds to each row of ``src``, ``tgt_in`` and ``tgt_out``."""

IdArray = NDArray[np.int32]


# --------------------------------------------------------------------------------- dataset


@dataclass(frozen=True)
class Example:
    """One encoded sentence pair: subword ids without specials."""

    src: IdArray
    tgt: IdArray


@dataclass(frozen=True)
class ParallelDataset:
    """Sentence pairs encoded with a :class:`~aiayn.data.tokenizer.Tokenizer` (or a converted
    model's :class:`~aiayn.data.pretrained_tokenizer.TranslationTokenizer`).

    Build one with :meth:`from_pairs`. Ids are stored without specials as int32 arrays.

    Attributes:
        src: source ids, one array per kept pair.
        tgt: target ids, one array per kept pair.
        source_indices: for each kept pair, its index in the pairs given to :meth:`from_pairs`
            (e.g. to find the reference text of a validation sentence).
        pad_id, bos_id, eos_id: the tokenizer's special ids, used by :meth:`collate`.
        num_dropped_too_long: pairs dropped for having more than ``max_tokens_per_sentence``
            subword tokens on either side.
        max_tokens_per_sentence: the limit applied (None = none).
    """

    src: tuple[IdArray, ...]
    tgt: tuple[IdArray, ...]
    source_indices: NDArray[np.int64]
    pad_id: int
    bos_id: int
    eos_id: int
    num_dropped_too_long: int = 0
    max_tokens_per_sentence: int | None = None

    def __post_init__(self) -> None:
        if not len(self.src) == len(self.tgt) == len(self.source_indices):
            raise ValueError(
                f"src, tgt and source_indices differ in length: "
                f"{len(self.src)}, {len(self.tgt)}, {len(self.source_indices)}"
            )

    @classmethod
    def from_pairs(
        cls,
        pairs: Sequence[tuple[str, str]],
        tokenizer: TranslationTokenizer,
        *,
        max_tokens_per_sentence: int | None = None,
    ) -> ParallelDataset:
        """Encode ``pairs`` (normally the output of :func:`~aiayn.data.corpus.filter_pairs`).

        Args:
            pairs: ``(source, target)`` sentence pairs.
            tokenizer: the joint vocabulary, or a pretrained model's (sources by its
                ``encode_batch``, targets by its ``encode_target_batch``).
            max_tokens_per_sentence: drop (not truncate: a cut sentence is no longer a
                translation) pairs with more subword tokens than this on either side, specials
                not counted; :attr:`num_dropped_too_long` counts them. None keeps every pair.
        """
        if max_tokens_per_sentence is not None and not is_int_at_least(max_tokens_per_sentence, 1):
            raise UserError(
                f"max_tokens_per_sentence must be a positive integer or None, "
                f"got {max_tokens_per_sentence!r}"
            )
        src_ids = tokenizer.encode_batch([s for s, _ in pairs])
        tgt_ids = tokenizer.encode_target_batch([t for _, t in pairs])
        src: list[IdArray] = []
        tgt: list[IdArray] = []
        kept: list[int] = []
        limit = max_tokens_per_sentence
        for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
            if limit is not None and (len(s) > limit or len(t) > limit):
                continue
            src.append(np.asarray(s, dtype=np.int32))
            tgt.append(np.asarray(t, dtype=np.int32))
            kept.append(i)
        return cls(
            src=tuple(src),
            tgt=tuple(tgt),
            source_indices=np.asarray(kept, dtype=np.int64),
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            num_dropped_too_long=len(pairs) - len(kept),
            max_tokens_per_sentence=limit,
        )

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> Example:
        return Example(self.src[index], self.tgt[index])

    @functools.cached_property
    def src_lengths(self) -> NDArray[np.int64]:
        """(N,) source lengths in subword tokens, specials not counted."""
        return np.fromiter((len(x) for x in self.src), dtype=np.int64, count=len(self.src))

    @functools.cached_property
    def tgt_lengths(self) -> NDArray[np.int64]:
        """(N,) target lengths in subword tokens, specials not counted."""
        return np.fromiter((len(x) for x in self.tgt), dtype=np.int64, count=len(self.tgt))

    def target_tokens(self, indices: Sequence[int] | NDArray[np.int64]) -> int:
        """Non-pad ``tgt_out`` entries (EOS included) of the pairs at ``indices`` together, as
        :func:`collate` counts them, from the lengths alone (no collation)."""
        idx = np.asarray(indices, dtype=np.int64)
        return int(self.tgt_lengths[idx].sum()) + SPECIALS_PER_ROW * idx.size

    def collate(self, indices: Iterable[int]) -> Batch:
        """The padded :class:`Batch` of the pairs at ``indices`` (e.g. one sampler batch)."""
        idx = list(indices)
        return collate(
            [self.src[i] for i in idx],
            [self.tgt[i] for i in idx],
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
        )


# --------------------------------------------------------------------------------- collation

_B = TypeVar("_B", bound="TensorBatch")


class TensorBatch:
    """What every frozen batch dataclass shares: its tensor fields moved together (pinned, or to a
    device), its other fields kept."""

    def pin_memory(self: _B) -> _B:
        """The same batch in page-locked host memory (for asynchronous copies to a GPU)."""
        return self._map(lambda tensor: tensor.pin_memory())

    def to(self: _B, device: torch.device | str, *, non_blocking: bool = False) -> _B:
        """The same batch with its tensors on ``device``."""
        return self._map(lambda tensor: tensor.to(device, non_blocking=non_blocking))

    def _map(self: _B, move: Callable[[Tensor], Tensor]) -> _B:
        assert dataclasses.is_dataclass(self)
        fields = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return dataclasses.replace(
            self, **{name: move(value) for name, value in fields if isinstance(value, Tensor)}
        )


@dataclass(frozen=True)
class Batch(TensorBatch):
    """A padded batch of sentence pairs (all tensors int64, padded with ``pad_id`` on the right).

    Attributes:
        src: (B, S) source ids followed by EOS — the encoder input.
        tgt_in: (B, T) BOS followed by target ids — the decoder input (teacher forcing).
        tgt_out: (B, T) target ids followed by EOS — what the decoder must predict.
        num_src_tokens: non-pad entries of ``src`` (EOS included).
        num_tgt_tokens: non-pad entries of ``tgt_out`` (EOS included): the tokens the loss
            is averaged over.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    num_src_tokens: int
    num_tgt_tokens: int

    @property
    def size(self) -> int:
        """B, the number of sentence pairs."""
        return int(self.src.size(0))

    @property
    def src_padding_fraction(self) -> float:
        """Fraction of ``src`` entries that are padding."""
        return 1.0 - self.num_src_tokens / max(self.src.numel(), 1)

    @property
    def tgt_padding_fraction(self) -> float:
        """Fraction of ``tgt_out`` (equally ``tgt_in``) entries that are padding."""
        return 1.0 - self.num_tgt_tokens / max(self.tgt_out.numel(), 1)

    @property
    def padding_fraction(self) -> float:
        """Fraction of padding over ``src`` and ``tgt_out`` together."""
        return batches_padding_fraction([self])


def batches_padding_fraction(batches: Iterable[Batch]) -> float:
    """Fraction of padding over the ``src`` and ``tgt_out`` of collated ``batches`` together
    (host-side counts: no device sync, no pass over the dataset's lengths)."""
    slots = real = 0
    for batch in batches:
        slots += batch.src.numel() + batch.tgt_out.numel()
        real += batch.num_src_tokens + batch.num_tgt_tokens
    return 1.0 - real / max(slots, 1)


def collate(
    src_ids_list: Sequence[Sequence[int] | IdArray],
    tgt_ids_list: Sequence[Sequence[int] | IdArray],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Batch:
    """Pad sentence pairs into a :class:`Batch`.

    For ids ``x`` (source) and ``y`` (target), without specials, row b holds::

        src[b]     = x + [EOS] + [PAD] * ...
        tgt_in[b]  = [BOS] + y + [PAD] * ...
        tgt_out[b] = y + [EOS] + [PAD] * ...

    so ``tgt_out[b, t]`` is the token to predict after reading ``tgt_in[b, : t + 1]``.

    Args:
        src_ids_list: B source id sequences (lists or arrays), no specials.
        tgt_ids_list: B target id sequences, no specials.
        pad_id, bos_id, eos_id: special ids (``Tokenizer.pad_id`` etc.).
    """
    batch_size = len(src_ids_list)
    if batch_size == 0:
        raise ValueError("cannot collate an empty batch")
    if len(tgt_ids_list) != batch_size:
        raise ValueError(f"{batch_size} source sequences but {len(tgt_ids_list)} target sequences")
    src_lens = [len(x) for x in src_ids_list]
    tgt_lens = [len(y) for y in tgt_ids_list]
    s = max(src_lens) + SPECIALS_PER_ROW
    t = max(tgt_lens) + SPECIALS_PER_ROW
    src = np.full((batch_size, s), pad_id, dtype=np.int64)  # (B, S)
    tgt_in = np.full((batch_size, t), pad_id, dtype=np.int64)  # (B, T)
    tgt_out = np.full((batch_size, t), pad_id, dtype=np.int64)  # (B, T)
    for b, (x, y) in enumerate(zip(src_ids_list, tgt_ids_list, strict=True)):
        n, m = src_lens[b], tgt_lens[b]
        src[b, :n] = x
        src[b, n] = eos_id
        tgt_in[b, 0] = bos_id
        tgt_in[b, 1 : m + 1] = y
        tgt_out[b, :m] = y
        tgt_out[b, m] = eos_id
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        num_src_tokens=sum(src_lens) + batch_size * SPECIALS_PER_ROW,
        num_tgt_tokens=sum(tgt_lens) + batch_size * SPECIALS_PER_ROW,
    )


# --------------------------------------------------------------------------------- batching


def _as_lengths(name: str, values: ArrayLike) -> NDArray[np.int64]:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0):
        raise ValueError(f"{name} must be non-negative integers")
    return arr.astype(np.int64, copy=False)


def padding_fraction(
    batches: Iterable[Sequence[int]], src_lengths: ArrayLike, tgt_lengths: ArrayLike
) -> float:
    """Fraction of padded slots in the tensors :func:`collate` would build for ``batches``.

    Counts ``src`` (B × S) and ``tgt_out`` (B × T) of every batch; lengths are without specials,
    as for :class:`TokenBatchSampler`. 0.0 for no batches.
    """
    src_len = _as_lengths("src_lengths", src_lengths) + SPECIALS_PER_ROW
    tgt_len = _as_lengths("tgt_lengths", tgt_lengths) + SPECIALS_PER_ROW
    slots = real = 0
    for batch in batches:
        idx = np.asarray(batch, dtype=np.int64)
        if idx.size == 0:
            continue
        s, t = src_len[idx], tgt_len[idx]
        slots += idx.size * (int(s.max()) + int(t.max()))
        real += int(s.sum()) + int(t.sum())
    return 1.0 - real / slots if slots else 0.0


class TokenBatchSampler:
    """fairseq-style token-budget batches, deterministic in ``(seed, epoch)``.

    Each epoch:

    1. order the sentences by (max(source, target) length, target length, source length), ties
       broken at random
       (``bucketing=False``: a random order instead — only useful to measure what bucketing saves);
    2. walk that order and cut a new batch whenever adding the next sentence would make
       ``batch size × (longest length in the batch + 1)`` exceed ``max_tokens``, where a
       sentence's length is ``max(src_len, tgt_len)`` (the ``+ 1`` is the BOS/EOS of
       :func:`collate`), or the batch would exceed ``max_sentences``;
    3. shuffle the order of the batches.

    A sentence whose length + 1 exceeds ``max_tokens`` on its own is **not** an error: it gets a
    batch of its own (:attr:`num_oversized` counts them; drop them beforehand with
    ``ParallelDataset.from_pairs(..., max_tokens_per_sentence=...)``).

    With ``bucketing=True`` the batch boundaries do not depend on the epoch (only sentences of
    equal length pairs trade places), so ``len()`` is exact for every epoch.

    With ``shuffle=False`` nothing is random: ties keep index order and batches come shortest
    first, the same in every epoch (for validation and for decoding a test set).

    Args:
        src_lengths: (N,) source lengths in subword tokens, without specials.
        tgt_lengths: (N,) target lengths, without specials.
        max_tokens: token budget per batch, per side (the paper's ≈25000).
        seed: random seed; with the epoch it fixes everything.
        shuffle: shuffle ties and batch order (training) or not (evaluation).
        bucketing: sort by length (True) or pack in random order (False).
        max_sentences: optional cap on sentences per batch.
    """

    def __init__(
        self,
        src_lengths: ArrayLike,
        tgt_lengths: ArrayLike,
        max_tokens: int,
        *,
        seed: int,
        shuffle: bool = True,
        bucketing: bool = True,
        max_sentences: int | None = None,
    ) -> None:
        self.src_lengths = _as_lengths("src_lengths", src_lengths)
        self.tgt_lengths = _as_lengths("tgt_lengths", tgt_lengths)
        if self.src_lengths.shape != self.tgt_lengths.shape:
            raise ValueError(
                f"src_lengths and tgt_lengths differ in length: "
                f"{self.src_lengths.size} vs {self.tgt_lengths.size}"
            )
        if not is_int_at_least(max_tokens, 1):
            raise UserError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if max_sentences is not None and not is_int_at_least(max_sentences, 1):
            raise UserError(
                f"max_sentences must be a positive integer or None, got {max_sentences!r}"
            )
        if not is_int_at_least(seed, 0):
            raise UserError(f"seed must be a non-negative integer, got {seed!r}")
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.seed = seed
        self.shuffle = shuffle
        self.bucketing = bucketing
        # (N,) positions each sentence occupies in the token budget
        self.costs = np.maximum(self.src_lengths, self.tgt_lengths) + SPECIALS_PER_ROW
        self._sorted_bounds: NDArray[np.int64] | None = None

    def __len__(self) -> int:
        """Batches per epoch (with ``bucketing=False``: epoch 0's count; it varies slightly)."""
        if self.bucketing:
            return len(self._bucketed_bounds()) - 1
        return len(self.batches(0))

    @property
    def num_sentences(self) -> int:
        """N, the number of sentences batched each epoch."""
        return int(self.costs.size)

    @property
    def num_oversized(self) -> int:
        """Sentences longer than ``max_tokens`` on their own (each alone in its batch)."""
        return int(np.count_nonzero(self.costs > self.max_tokens))

    def batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` (sentence indices), in training order.

        The same ``(seed, epoch)`` always gives the same list, so training can resume at
        ``batches(epoch)[k]``. Every index appears exactly once.
        """
        if not is_int_at_least(epoch, 0):
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        n = self.num_sentences
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
        if self.bucketing:
            if self.shuffle:
                tie_break = rng.random(n)
                order = np.lexsort((tie_break, *self._sort_keys()))
            else:
                order = np.lexsort(self._sort_keys())  # stable: ties keep index order
            bounds = self._bucketed_bounds()
        else:
            order = rng.permutation(n) if self.shuffle else np.arange(n)
            bounds = self._pack(self.costs[order])
        batches = [order[a:b].tolist() for a, b in itertools.pairwise(bounds.tolist())]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def padding_fraction(self, epoch: int = 0) -> float:
        """Fraction of padded slots over ``epoch``'s batches (see :func:`padding_fraction`)."""
        return padding_fraction(self.batches(epoch), self.src_lengths, self.tgt_lengths)

    def _bucketed_bounds(self) -> NDArray[np.int64]:
        # The cost sequence in sorted order is the same whatever the tie-break, so the batch
        # boundaries are computed once.
        if self._sorted_bounds is None:
            order = np.lexsort(self._sort_keys())
            self._sorted_bounds = self._pack(self.costs[order])
        return self._sorted_bounds

    def _sort_keys(self) -> tuple[NDArray[np.int64], ...]:
        """np.lexsort keys, last = primary: (longer side, target length, source length)."""
        return (self.src_lengths, self.tgt_lengths, self.costs)

    def _pack(self, costs: NDArray[np.int64]) -> NDArray[np.int64]:
        """Greedy packing of ``costs`` in the given order; returns the batch boundaries
        ``[0, b1, ..., N]`` (batch k is positions ``bounds[k]:bounds[k + 1]``)."""
        max_tokens = self.max_tokens
        max_sentences = self.max_sentences if self.max_sentences is not None else len(costs) + 1
        bounds = [0]
        size = 0
        longest = 0
        for i, cost in enumerate(costs.tolist()):
            new_longest = max(longest, cost)
            if size > 0 and ((size + 1) * new_longest > max_tokens or size + 1 > max_sentences):
                bounds.append(i)
                size, longest = 1, cost
            else:
                size, longest = size + 1, new_longest
        if size > 0:
            bounds.append(len(costs))
        return np.asarray(bounds, dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"TokenBatchSampler(sentences={self.num_sentences}, max_tokens={self.max_tokens}, "
            f"batches={len(self)}, seed={self.seed}, shuffle={self.shuffle}, "
            f"bucketing={self.bucketing})"
        )
