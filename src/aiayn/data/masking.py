"""BERT's masked-LM corruption (Devlin et al. 2019, §3.1 "Task #1: Masked LM", appendix A.1):
pick 15% of the token positions of each sequence as prediction targets and corrupt the picked
inputs: 80% of them become ``[MASK]``, 10% a random token, 10% stay as they are; the loss is only
on the picked positions.

How many positions (as the released ``create_pretraining_data.py``): a sequence with n
candidate positions (neither a special token nor padding) gets exactly
``k = max(1, round(n · p))`` targets (0 when n = 0), chosen uniformly without replacement, so
the number of targets of a sequence is known from its tokens before anything is drawn (the
trainer normalises a step's loss by its target count before collating it). The 80/10/10 choice
is drawn independently for each target; the random token is uniform over the whole vocabulary
(as in BERT's code and Hugging Face's ``DataCollatorForLanguageModeling``), so it may equal
the original token. The released code's cap on targets per sequence
(``max_predictions_per_seq``) is not applied.

:func:`mask_tokens` is a pure function of its arguments: the same tokens, special mask and
generator state give the same result.

Shape legend:  B sequences   S positions
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

IGNORE_INDEX = -100
"""The label of a position that is not a target (PyTorch's and Hugging Face's convention)."""

MLM_PROBABILITY = 0.15
MASK_RATE = 0.8
RANDOM_RATE = 0.1
"""BERT's rates: 15% of positions are targets; of those 80% [MASK], 10% random, 10% kept."""


class MaskedTokens(NamedTuple):
    """A masked-LM example batch.

    Attributes:
        inputs: (B, S) the tokens with the targets corrupted (the model's input).
        labels: (B, S) the original token at each target, :data:`IGNORE_INDEX` elsewhere.
    """

    inputs: Tensor
    labels: Tensor


def num_targets(candidates: Tensor, probability: float = MLM_PROBABILITY) -> Tensor:
    """k = max(1, round(n · p)) targets for n candidate positions, 0 when n = 0 (round half to
    even, as Python's ``round`` in the released code). (…) int64 counts -> (…) int64."""
    n = candidates.to(torch.int64)
    k = torch.round(n.to(torch.float64) * probability).to(torch.int64).clamp(min=1)
    return torch.where(n > 0, k, torch.zeros_like(k))


def mask_tokens(
    tokens: Tensor,
    special: Tensor,
    generator: torch.Generator,
    *,
    vocab_size: int,
    mask_id: int,
    probability: float = MLM_PROBABILITY,
    mask_rate: float = MASK_RATE,
    random_rate: float = RANDOM_RATE,
) -> MaskedTokens:
    """Pick and corrupt the targets of each row (see the module docstring).

    Args:
        tokens: (B, S) int64 ids.
        special: (B, S) bool, True where a position may not be a target (special tokens and
            padding).
        generator: the random stream (CPU); the draws are, in order: one uniform per position
            (the choice of targets), one per position (80/10/10), one random id per position.
        vocab_size: V; random replacements are uniform over 0 … V − 1.
        mask_id: the ``[MASK]`` id.
        probability: p, the share of candidate positions picked.
        mask_rate, random_rate: of the targets, the shares replaced by ``[MASK]`` and by a
            random token (the rest keep their token).

    Returns:
        :class:`MaskedTokens` (new tensors; ``tokens`` is not modified).
    """
    if tokens.shape != special.shape or tokens.ndim != 2:
        raise ValueError(f"tokens {tuple(tokens.shape)} and special {tuple(special.shape)}")
    if not (0.0 < probability < 1.0 and mask_rate >= 0 and random_rate >= 0):
        raise ValueError(f"bad rates: p={probability}, mask {mask_rate}, random {random_rate}")
    if mask_rate + random_rate > 1.0:
        raise ValueError(f"mask_rate + random_rate = {mask_rate + random_rate} exceeds 1")
    shape = tokens.shape
    scores = torch.rand(shape, generator=generator)  # (B, S) in [0, 1)
    scores = scores.masked_fill(special, 2.0)  # never among the k smallest
    rank = scores.argsort(dim=1).argsort(dim=1)  # (B, S): each position's rank in its row
    k = num_targets((~special).sum(dim=1), probability)  # (B,)
    picked = rank < k[:, None]  # (B, S)
    action = torch.rand(shape, generator=generator)  # (B, S)
    to_mask = picked & (action < mask_rate)
    to_random = picked & (action >= mask_rate) & (action < mask_rate + random_rate)
    random_ids = torch.randint(vocab_size, shape, generator=generator, dtype=tokens.dtype)
    inputs = torch.where(to_mask, torch.full_like(tokens, mask_id), tokens)
    inputs = torch.where(to_random, random_ids, inputs)
    labels = torch.where(picked, tokens, torch.full_like(tokens, IGNORE_INDEX))
    return MaskedTokens(inputs, labels)


def seeded_generator(*entropy: int) -> torch.Generator:
    """A CPU generator seeded by a hash of non-negative integers (NumPy's ``SeedSequence``):
    the same integers, the same stream; any other integers, an unrelated one."""
    seed = int(np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator().manual_seed(seed)
