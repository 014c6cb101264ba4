"""Data for training BERT (family ``bert``): a WordPiece vocabulary learnt from text, and the two
training tasks' examples and batches.

* :func:`train_wordpiece`: BERT's tokenizer pipeline (``BertNormalizer``, ``BertPreTokenizer``,
  ``WordPiece`` with ``##`` continuations) trained by Hugging Face ``tokenizers``' WordPiece
  trainer, the specials ``[PAD] [UNK] [CLS] [SEP] [MASK]`` first (ids 0–4); the result is a
  :class:`~aiayn.data.bert_tokenizer.BertTokenizer`, saved as a converted BERT's is.
* masked-LM pre-training (:class:`MaskedLMSet`): one example per non-blank line,
  ``[CLS] line [SEP]`` truncated to ``max_length`` tokens; the targets and their corruption
  are :func:`~aiayn.data.masking.mask_tokens`, drawn anew each epoch for training
  (a pure function of the seed, the epoch and the batch's examples: see
  :class:`EncoderBatchSampler`'s draw ids) and once, with a fixed seed, for validation.
* sequence classification (:class:`ClassificationSet`): ``label<TAB>text`` lines (or
  ``label<TAB>text<TAB>second text``, a pair: ``[CLS] A [SEP] B [SEP]`` with token types);
  labels are strings, numbered in sorted order (:func:`label_set`).

Both batch by length under a token budget (:class:`EncoderBatchSampler`) and pad on the right;
the attention mask tells the model which positions are real.

Shape legend:  B examples in a batch   S longest example of the batch (tokens)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers
from torch import Tensor

from aiayn.data.batching import SPECIALS_PER_ROW, TensorBatch, TokenBatchSampler
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.corpus import read_lines
from aiayn.data.masking import (
    IGNORE_INDEX,
    MLM_PROBABILITY,
    mask_tokens,
    num_targets,
    seeded_generator,
)
from aiayn.errors import UserError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""The specials of a trained vocabulary, ids 0–4 in this order."""

ENCODE_CHUNK = 10_000
"""Lines encoded per call of the tokenizer (bounds the Python lists alive at once)."""

_MASK_SALT = 0x6D6C6D  # apart from the seeds of the batch order


# -- reading -------------------------------------------------------------------------------------


def read_texts(path: str | Path) -> list[str]:
    """The non-blank lines of a UTF-8 text file (plain or .gz): one example each."""
    return [line for line in read_lines(path) if line.strip()]


class LabelledText(NamedTuple):
    """One classification example: its label, its text and an optional second text."""

    label: str
    text: str
    pair: str | None = None


def read_labelled(path: str | Path) -> list[LabelledText]:
    """The ``label<TAB>text`` (or ``label<TAB>text<TAB>second text``) lines of a UTF-8 file
    (plain or .gz); blank lines skipped.

    Raises:
        UserError: naming the file and line of a line with no tab, more than two tabs or an
            empty label, or with pairs where the lines before have none (or the other way
            round); a file without examples.
    """
    examples: list[LabelledText] = []
    width = 0  # fields of the file's lines: 2, or 3 (pairs)
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (2, 3) or not fields[0].strip():
            raise UserError(
                f"{path}:{number}: expected label<TAB>text or label<TAB>text<TAB>text, got "
                f"{line[:80]!r}"
            )
        if width and len(fields) != width:
            raise UserError(
                f"{path}:{number}: {len(fields) - 1} text(s) after the label where the lines "
                f"before have {width - 1}: a file holds single texts or pairs, not both"
            )
        width = len(fields)
        label = fields[0].strip()
        examples.append(LabelledText(label, fields[1], fields[2] if len(fields) == 3 else None))
    if not examples:
        raise UserError(f"{path}: no examples (expected label<TAB>text lines)")
    return examples


def label_set(examples: Iterable[LabelledText], source: str | Path) -> tuple[str, ...]:
    """The distinct labels, sorted (label id = position); at least two.

    Raises:
        UserError: fewer than two labels in ``source``.
    """
    labels = tuple(sorted({e.label for e in examples}))
    if len(labels) < 2:
        raise UserError(f"{source}: a classifier needs at least 2 labels, found {list(labels)}")
    return labels


def label_ids(
    examples: Sequence[LabelledText], labels: Sequence[str], source: str | Path
) -> NDArray[np.int64]:
    """(N,) the id of each example's label in ``labels``.

    Raises:
        UserError: naming a label of ``source`` that ``labels`` (the training file's) lacks.
    """
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted({e.label for e in examples} - index.keys())
    if unknown:
        raise UserError(
            f"{source}: label {unknown[0]!r} is not among the training labels ({', '.join(labels)})"
        )
    return np.asarray([index[e.label] for e in examples], dtype=np.int64)


# -- the vocabulary ------------------------------------------------------------------------------


def train_wordpiece(
    texts: Sequence[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    lowercase: bool = True,
    model_max_length: int | None = None,
) -> BertTokenizer:
    """A WordPiece vocabulary of at most ``vocab_size`` tokens learnt from ``texts`` through
    BERT's normaliser (lowercasing and accent stripping when ``lowercase``) and pre-tokeniser,
    as a :class:`BertTokenizer` whose encodings stop at ``model_max_length`` tokens by default.
    The specials :data:`SPECIAL_TOKENS` have ids 0–4.

    The same texts give the same vocabulary, ids included, on every run (every rank):
    ``tokenizers``' trainer numbers the continuation pieces (``##a``, ``##b`` …) in the order
    of a Rust hash map, and breaks ties between equally frequent merges by those numbers. So a
    first pass (no merges) finds the continuation pieces, and the real pass is handed them,
    sorted, as its first tokens (after the specials), which fixes every number and tie."""
    continuations = sorted(
        token
        for token in _wordpiece_pass(texts, 1, 1, lowercase, ()).get_vocab()
        if token.startswith("##") and len(token) == 3
    )
    trained = _wordpiece_pass(texts, vocab_size, min_frequency, lowercase, continuations)
    vocab = trained.get_vocab(with_added_tokens=True)  # the specials were added tokens
    wordpiece = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##")
    return BertTokenizer(
        _HFTokenizer(wordpiece), do_lower_case=lowercase, model_max_length=model_max_length
    )


def _wordpiece_pass(
    texts: Sequence[str],
    vocab_size: int,
    min_frequency: int,
    lowercase: bool,
    first: Sequence[str],
) -> _HFTokenizer:
    """One run of ``tokenizers``' WordPiece trainer; ``first`` numbered right after the
    specials."""
    hf = _HFTokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *first],
        continuing_subword_prefix="##",
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    return hf


# -- encoded examples ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodedTexts:
    """Encoded examples, concatenated: example i is ``ids[offsets[i]:offsets[i + 1]]``.

    Attributes:
        ids: (total,) int32 token ids, ``[CLS] … [SEP]`` each.
        token_types: (total,) int8 segment ids (0, and 1 for a pair's second text).
        offsets: (N + 1,) int64 starts, then the end.
        full: examples that fill all ``max_length`` positions (longer ones were cut there).
    """

    ids: NDArray[np.int32]
    token_types: NDArray[np.int8]
    offsets: NDArray[np.int64]
    full: int

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> NDArray[np.int64]:
        """(N,) tokens of each example, specials included."""
        return np.diff(self.offsets)

    def layout(self, indices: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
        """Where the examples ``indices`` lie in the flat arrays, right-padded: ``gather``
        (B, S) flat positions (0 at padding) and ``real`` (B, S), False at padding; S is the
        longest example's length."""
        lengths = self.lengths[indices]
        width = int(lengths.max(initial=0))
        real = np.arange(width)[None, :] < lengths[:, None]  # (B, S)
        gather = (self.offsets[indices][:, None] + np.arange(width)[None, :]) * real  # (B, S)
        return gather, real

    def padded(self, indices: NDArray[np.int64], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
        """(ids, token types, attention mask), each (B, S), right-padded with ``pad_id``, 0
        and False."""
        gather, real = self.layout(indices)
        ids = np.where(real, self.ids[gather], pad_id)
        types = np.where(real, self.token_types[gather], 0)
        return (
            torch.from_numpy(ids.astype(np.int64)),
            torch.from_numpy(types.astype(np.int64)),
            torch.from_numpy(real),
        )


def encode_texts(
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_length: int,
) -> EncodedTexts:
    """``[CLS] text [SEP]`` (with ``pairs``: ``[CLS] text [SEP] pair [SEP]``) of each text,
    truncated to ``max_length`` tokens as the tokenizer truncates (longest text first)."""
    ids: list[NDArray[np.int32]] = []
    types: list[NDArray[np.int8]] = []
    lengths: list[NDArray[np.int64]] = []
    for start in range(0, len(texts), ENCODE_CHUNK):
        end = start + ENCODE_CHUNK
        second = None if pairs is None else pairs[start:end]
        batch = tokenizer.encode_batch(texts[start:end], second, max_length=max_length)
        real = batch.attention_mask  # (B, S); right-padded: row-major order = concatenation
        ids.append(batch.ids[real].numpy().astype(np.int32))
        types.append(batch.token_types[real].numpy().astype(np.int8))
        lengths.append(real.sum(dim=1).numpy().astype(np.int64))
    length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    offsets = np.zeros(len(length) + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    return EncodedTexts(
        np.concatenate(ids) if ids else np.zeros(0, np.int32),
        np.concatenate(types) if types else np.zeros(0, np.int8),
        offsets,
        int(np.count_nonzero(length >= max_length)),
    )


# -- batching ------------------------------------------------------------------------------------


class EncoderBatchSampler:
    """Batches of examples of similar length under a token budget, deterministic in
    ``(seed, epoch)``: :class:`~aiayn.data.batching.TokenBatchSampler`'s bucketing on the
    examples' lengths (specials included), so that B × the longest length of a batch stays
    within ``max_tokens`` (an example longer than that on its own gets a batch alone).

    With ``draw_ids`` the indices of epoch e are *draw ids* e·N + i (example i = draw id mod
    N): a batch then names the epoch it belongs to, and :class:`MaskedLMSet` draws that
    epoch's masks from them (a pure function of the seed and the ids, so the trainer can count
    a step's targets on every rank, and a resumed run draws the same masks).

    Args:
        lengths: (N,) tokens of each example.
        max_tokens: token budget per batch (padding included).
        seed: with the epoch, fixes the order.
        shuffle: random tie-breaks and batch order (training), or none (evaluation).
        draw_ids: return draw ids instead of example indices.
    """

    def __init__(
        self,
        lengths: NDArray[np.int64],
        max_tokens: int,
        *,
        seed: int,
        shuffle: bool = True,
        draw_ids: bool = False,
    ) -> None:
        costs = np.asarray(lengths, dtype=np.int64) - SPECIALS_PER_ROW  # it adds them back
        self.num_examples = len(costs)
        self.draw_ids = draw_ids
        self._sampler = TokenBatchSampler(costs, costs, max_tokens, seed=seed, shuffle=shuffle)

    def __len__(self) -> int:
        return len(self._sampler)

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches of ``epoch`` (example indices, or draw ids), in training order."""
        batches = self._sampler.batches(epoch)
        if not self.draw_ids or epoch == 0:
            return batches
        offset = epoch * self.num_examples
        return [[offset + i for i in batch] for batch in batches]

    def padding_fraction(self, epoch: int = 0) -> float:
        """Fraction of padded positions in ``epoch``'s batches."""
        return self._sampler.padding_fraction(epoch)


@dataclass(frozen=True)
class MaskedLMBatch(TensorBatch):
    """A masked-LM batch.

    Attributes:
        inputs: (B, S) int64 tokens with the targets corrupted, padded with ``[PAD]``.
        attention_mask: (B, S) bool, True at real positions.
        labels: (B, S) int64 original tokens at the targets, IGNORE_INDEX elsewhere.
        num_tgt_tokens: the targets.
    """

    inputs: Tensor
    attention_mask: Tensor
    labels: Tensor
    num_tgt_tokens: int


@dataclass(frozen=True)
class ClassificationBatch(TensorBatch):
    """A sequence-classification batch.

    Attributes:
        ids: (B, S) int64 tokens, padded with ``[PAD]``.
        token_types: (B, S) int64 segment ids, padded with 0.
        attention_mask: (B, S) bool, True at real positions.
        labels: (B,) int64 label ids.
    """

    ids: Tensor
    token_types: Tensor
    attention_mask: Tensor
    labels: Tensor

    @property
    def num_tgt_tokens(self) -> int:
        """B: one target per example."""
        return int(self.labels.numel())


def padding_of(masks: Iterable[Tensor]) -> float:
    """Fraction of padded positions (False) in attention masks; 0.0 for none."""
    slots = real = 0
    for mask in masks:
        slots += mask.numel()
        real += int(mask.sum().item())
    return 1.0 - real / slots if slots else 0.0


# -- the two tasks' examples ---------------------------------------------------------------------

VALID_MASK_SEED = 0
"""The masking seed of validation and test sets: their targets are drawn once, the same in
every run on the same text and vocabulary, so that their losses compare across runs."""

_FIXED_CHUNK = 256  # examples masked together when the masks are drawn once


class MaskedLMSet:
    """Masked-LM examples (one per line), collated with their targets corrupted.

    Args:
        texts: the encoded lines.
        tokenizer: gives the special ids (never targets), ``[MASK]``, ``[PAD]`` and V.
        seed: the masking seed.
        probability: the share of targets (BERT: 0.15).
        fixed: draw the masks once, at construction, from ``seed`` (validation, test: the
            same targets at every evaluation; indices are example indices); else draw them
            at each collation from ``seed`` and the batch's draw ids (training; see
            :class:`EncoderBatchSampler`).
    """

    def __init__(
        self,
        texts: EncodedTexts,
        tokenizer: BertTokenizer,
        *,
        seed: int,
        probability: float = MLM_PROBABILITY,
        fixed: bool = False,
    ) -> None:
        self.texts, self.seed, self.probability = texts, seed, probability
        self.vocab_size, self.mask_id = tokenizer.vocab_size, tokenizer.mask_id
        self.pad_id = tokenizer.pad_id
        self.special = np.isin(texts.ids, list(tokenizer.special_tokens.values()))  # (total,)
        counts = np.concatenate([[0], np.cumsum(~self.special)])
        candidates = counts[texts.offsets[1:]] - counts[texts.offsets[:-1]]  # (N,)
        self.targets = num_targets(torch.from_numpy(candidates), probability).numpy()  # (N,)
        self._fixed = self._draw_once() if fixed else None

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_targets(self) -> int:
        """The targets of all examples (one epoch's)."""
        return int(self.targets.sum())

    def target_tokens(self, indices: Sequence[int] | NDArray[np.int64]) -> int:
        """The targets of the examples ``indices`` (or draw ids) name, known from their tokens
        alone (see :mod:`aiayn.data.masking`)."""
        return int(self.targets[np.asarray(indices, dtype=np.int64) % len(self)].sum())

    def collate(self, indices: Iterable[int]) -> MaskedLMBatch:
        """The batch of ``indices`` (draw ids; example indices with ``fixed``)."""
        draws = np.asarray(list(indices), dtype=np.int64)
        examples = draws % len(self)
        if self._fixed is None:
            generator = seeded_generator(_MASK_SALT, self.seed, *draws.tolist())
            inputs, real, labels = self._mask(examples, generator)
        else:
            gather, real_np = self.texts.layout(examples)
            inputs = torch.from_numpy(np.where(real_np, self._fixed[0][gather], self.pad_id))
            labels = torch.from_numpy(np.where(real_np, self._fixed[1][gather], IGNORE_INDEX))
            real = torch.from_numpy(real_np)
        count = int(self.targets[examples].sum())
        assert int((labels != IGNORE_INDEX).sum()) == count  # the count the trainer was given
        return MaskedLMBatch(inputs, real, labels, count)

    def _mask(
        self, examples: NDArray[np.int64], generator: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(inputs, attention mask, labels) of ``examples``, padded, masked by ``generator``."""
        ids, _, real = self.texts.padded(examples, self.pad_id)
        gather, real_np = self.texts.layout(examples)
        special = torch.from_numpy(np.where(real_np, self.special[gather], True))  # (B, S)
        masked = mask_tokens(
            ids,
            special,
            generator,
            vocab_size=self.vocab_size,
            mask_id=self.mask_id,
            probability=self.probability,
        )
        return masked.inputs, real, masked.labels

    def _draw_once(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Flat (inputs, labels) aligned with ``texts.ids``: the examples masked in file order,
        :data:`_FIXED_CHUNK` at a time, chunk c by the generator of (seed, c)."""
        inputs = np.zeros(len(self.texts.ids), dtype=np.int64)
        labels = np.zeros(len(self.texts.ids), dtype=np.int64)
        for c, start in enumerate(range(0, len(self), _FIXED_CHUNK)):
            examples = np.arange(start, min(start + _FIXED_CHUNK, len(self)), dtype=np.int64)
            chunk_inputs, real, chunk_labels = self._mask(
                examples, seeded_generator(_MASK_SALT, self.seed, c)
            )
            gather, real_np = self.texts.layout(examples)
            inputs[gather[real_np]] = chunk_inputs[real].numpy()
            labels[gather[real_np]] = chunk_labels[real].numpy()
        return inputs, labels


class ClassificationSet:
    """Classification examples: encoded texts (or pairs) and their label ids.

    Args:
        texts: the encoded texts.
        labels: (N,) label ids.
        pad_id: the ``[PAD]`` id.
    """

    def __init__(self, texts: EncodedTexts, labels: NDArray[np.int64], pad_id: int) -> None:
        if len(labels) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        self.texts, self.labels, self.pad_id = texts, labels, pad_id

    def __len__(self) -> int:
        return len(self.texts)

    def target_tokens(self, indices: Sequence[int] | NDArray[np.int64]) -> int:
        """One target per example."""
        return len(indices)

    def collate(self, indices: Iterable[int]) -> ClassificationBatch:
        """The batch of examples ``indices``."""
        examples = np.asarray(list(indices), dtype=np.int64)
        ids, types, mask = self.texts.padded(examples, self.pad_id)
        return ClassificationBatch(ids, types, mask, torch.from_numpy(self.labels[examples]))
