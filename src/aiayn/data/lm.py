"""Language-model data: documents joined into one token stream, cut into blocks, batched under a
token budget (the standard recipe of GPT-2-style training, e.g. Hugging Face's ``run_clm``).

Each non-blank line of a text is a document, and every document is followed by EOS, so the
stream is ``d_1 EOS d_2 EOS … d_n EOS``. With block size L, block k holds the stream's tokens
``k·L … k·L + L`` (L + 1 tokens: a block's last token is the next block's first) and its
example is ``inputs = block[:-1]``, ``targets = block[1:]``: every token after the first is
predicted exactly once, from the tokens before it in its own block (no context crosses a block
boundary). A stream of n tokens makes ⌊(n − 1) / L⌋ full blocks. The rest, the *tail* (fewer
than L targets), is dropped for training and kept as a last, shorter block for validation and
``aiayn evaluate``, so that those count every token after the first.

Shape legend:
    B blocks in a batch   T input positions of a block (L, or fewer for the tail)   L block size
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from aiayn.data.batching import TensorBatch
from aiayn.data.corpus import read_lines

__all__ = ["BlockBatchSampler", "LMBatch", "TextBlocks", "read_documents", "token_stream"]


def read_documents(path: str | Path) -> list[str]:
    """The non-blank lines of a UTF-8 text file (plain or .gz): a language model's documents."""
    return [line for line in read_lines(path) if line.strip()]


class TextEncoder(Protocol):
    """What :func:`token_stream` needs of a tokenizer (aiayn's or a pretrained model's)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...


def token_stream(lines: Iterable[str], tokenizer: TextEncoder, eos_id: int) -> NDArray[np.int32]:
    """The (n,) stream of the module docstring: each non-blank line's ids, then ``eos_id``."""
    documents = [line for line in lines if line.strip()]
    ids = tokenizer.encode_batch(documents)
    flat = itertools.chain.from_iterable(itertools.chain(x, (eos_id,)) for x in ids)
    return np.fromiter(flat, dtype=np.int32, count=sum(len(x) + 1 for x in ids))


@dataclass(frozen=True)
class LMBatch(TensorBatch):
    """Blocks of one length, stacked (int64, no padding anywhere).

    Attributes:
        inputs: (B, T) the blocks without their last token.
        targets: (B, T) the blocks without their first token: the next token at each position.
        num_tgt_tokens: B·T, the positions the loss is summed over.
    """

    inputs: Tensor
    targets: Tensor
    num_tgt_tokens: int


@dataclass(frozen=True)
class TextBlocks:
    """A token stream seen as blocks of ``block_size`` targets (see the module docstring).

    Attributes:
        stream: (n,) token ids.
        block_size: L, the input positions of a full block.
        keep_tail: also make the last, shorter block (validation, evaluation).
    """

    stream: NDArray[np.int32]
    block_size: int
    keep_tail: bool = False

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    @property
    def num_full(self) -> int:
        """Full blocks (L targets each)."""
        return max(self.stream.size - 1, 0) // self.block_size

    @property
    def tail_length(self) -> int:
        """Targets of the tail block when it is kept and not empty, else 0."""
        if not self.keep_tail:
            return 0
        return max(self.stream.size - 1, 0) - self.num_full * self.block_size

    @property
    def num_targets(self) -> int:
        """Tokens predicted over all blocks."""
        return self.num_full * self.block_size + self.tail_length

    def __len__(self) -> int:
        return self.num_full + (1 if self.tail_length else 0)

    def lengths(self, indices: Sequence[int] | NDArray[np.int64]) -> NDArray[np.int64]:
        """(k,) targets of the blocks at ``indices``."""
        idx = np.asarray(indices, dtype=np.int64)
        return np.where(idx < self.num_full, self.block_size, self.tail_length)

    def target_tokens(self, indices: Sequence[int] | NDArray[np.int64]) -> int:
        """Targets the blocks at ``indices`` hold together (host-side, no collation)."""
        return int(self.lengths(indices).sum())

    def collate(self, indices: Iterable[int]) -> LMBatch:
        """The :class:`LMBatch` of the blocks at ``indices`` (all of one length)."""
        idx = np.fromiter(indices, dtype=np.int64)
        lengths = self.lengths(idx)
        if idx.size == 0 or (lengths != lengths[0]).any():
            raise ValueError(f"a batch needs blocks of one length, got lengths {lengths.tolist()}")
        t = int(lengths[0])
        starts = idx * self.block_size  # (B,)
        positions = starts[:, None] + np.arange(t + 1)[None, :]  # (B, 1) + (1, T + 1) -> (B, T + 1)
        rows = torch.from_numpy(self.stream[positions].astype(np.int64))  # (B, T + 1)
        return LMBatch(rows[:, :-1], rows[:, 1:], int(idx.size) * t)


class BlockBatchSampler:
    """Batches of ``max(1, max_tokens // L)`` blocks, deterministic in ``(seed, epoch)``.

    Each epoch the full blocks come in a random order (``shuffle=False``: in stream order),
    cut into batches; the tail block, when kept, is a batch of its own at the end. Nothing is
    padded, so :meth:`padding_fraction` is 0.
    """

    def __init__(self, blocks: TextBlocks, max_tokens: int, *, seed: int, shuffle: bool = True):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.num_full = blocks.num_full
        self.has_tail = blocks.tail_length > 0
        self.per_batch = max(1, max_tokens // blocks.block_size)
        self.seed = seed
        self.shuffle = shuffle

    def __len__(self) -> int:
        return -(-self.num_full // self.per_batch) + int(self.has_tail)

    def batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` (block indices), in training order."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
        order = rng.permutation(self.num_full) if self.shuffle else np.arange(self.num_full)
        k = self.per_batch
        batches = [order[a : a + k].tolist() for a in range(0, self.num_full, k)]
        if self.has_tail:
            batches.append([self.num_full])
        return batches

    def padding_fraction(self, epoch: int = 0) -> float:
        """0.0: blocks of one length need no padding."""
        return 0.0
