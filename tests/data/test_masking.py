"""BERT's masked-LM corruption (aiayn.data.masking): the counts of targets by hand, the 80/10/10
proportions over a large draw, specials and padding never targets, labels only at the targets,
the same draw for the same generator state."""

from __future__ import annotations

import pytest
import torch

from aiayn.data.masking import IGNORE_INDEX, mask_tokens, num_targets, seeded_generator

V, MASK, CLS, SEP, PAD = 1000, 4, 2, 3, 0


def _rows(lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] w … w [SEP] [PAD] … rows with ids from 10 on, and their special mask."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.full((len(lengths), width), PAD)
    for r, n in enumerate(lengths):
        tokens[r, 0], tokens[r, n + 1] = CLS, SEP
        tokens[r, 1 : n + 1] = torch.randint(10, V, (n,), generator=generator)
    special = (tokens == CLS) | (tokens == SEP) | (tokens == PAD)
    return tokens, special


def test_targets_per_sequence_as_the_released_code_counts_them() -> None:
    """k = max(1, round(0.15 n)), 0 for no candidate; Python's round (half to even)."""
    n = torch.tensor([0, 1, 3, 7, 10, 17, 20, 100, 101])
    want = [0] + [max(1, round(int(x) * 0.15)) for x in n[1:]]
    assert num_targets(n).tolist() == want == [0, 1, 1, 1, 2, 3, 3, 15, 15]
    assert num_targets(torch.tensor([10]), 0.5).tolist() == [5]


def test_a_hand_checkable_row() -> None:
    """[CLS] a b [SEP] [PAD]: one target (round(0.3) = 0 -> 1), at a or b."""
    tokens = torch.tensor([[CLS, 11, 12, SEP, PAD]])
    special = torch.tensor([[True, False, False, True, True]])
    for seed in range(20):
        out = mask_tokens(tokens, special, seeded_generator(seed), vocab_size=V, mask_id=MASK)
        picked = (out.labels != IGNORE_INDEX)[0].tolist()
        assert picked in ([False, True, False, False, False], [False, False, True, False, False])
        assert out.labels[0][picked].tolist() == tokens[0][picked].tolist()
        assert out.inputs[0][[0, 3, 4]].tolist() == [CLS, SEP, PAD]


def test_proportions_over_a_large_draw() -> None:
    """15% targets exactly (100 candidates a row); of them ~80% [MASK], ~10% a random token,
    ~10% unchanged (4,000 rows: 60,000 targets, binomial sd 0.2% for 80%)."""
    tokens, special = _rows([100] * 4000, 104)
    out = mask_tokens(tokens, special, seeded_generator(1), vocab_size=V, mask_id=MASK)
    picked = out.labels != IGNORE_INDEX
    assert picked.sum(dim=1).eq(15).all()
    n = int(picked.sum())
    masked = (out.inputs == MASK) & picked
    kept = (out.inputs == tokens) & picked
    other = picked & ~masked & ~kept
    assert abs(masked.sum().item() / n - 0.8) < 0.01
    assert abs(kept.sum().item() / n - 0.1) < 0.01  # (+ 0.1/V: a random token may be its own)
    assert abs(other.sum().item() / n - 0.1) < 0.01
    # positions that are not targets: unchanged input, ignored label
    assert torch.equal(out.inputs[~picked], tokens[~picked])
    assert (out.labels[~picked] == IGNORE_INDEX).all()
    assert torch.equal(out.labels[picked], tokens[picked])
    # the random tokens are uniform over the whole vocabulary: ~6,000 draws of 1,000 ids
    assert out.inputs[other].unique().numel() > 950


def test_specials_and_padding_are_never_targets() -> None:
    tokens, special = _rows([0, 1, 2, 5, 13, 40], 44)
    tokens[3, 2] = MASK  # text that spelled [MASK]: special, not a candidate
    special[3, 2] = True
    for seed in range(50):
        out = mask_tokens(tokens, special, seeded_generator(seed), vocab_size=V, mask_id=MASK)
        assert (out.labels[special] == IGNORE_INDEX).all()
        assert torch.equal(out.inputs[special], tokens[special])
        counts = (out.labels != IGNORE_INDEX).sum(dim=1)
        assert torch.equal(counts, num_targets((~special).sum(dim=1)))
    assert counts.tolist() == [0, 1, 1, 1, 2, 6]


def test_deterministic_for_a_generator_state_and_pure() -> None:
    tokens, special = _rows([30, 12, 7], 32)
    before = tokens.clone()
    a = mask_tokens(tokens, special, seeded_generator(7, 3), vocab_size=V, mask_id=MASK)
    b = mask_tokens(tokens, special, seeded_generator(7, 3), vocab_size=V, mask_id=MASK)
    c = mask_tokens(tokens, special, seeded_generator(7, 4), vocab_size=V, mask_id=MASK)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.labels, c.labels)
    assert torch.equal(tokens, before)  # the input is not modified


def test_rates_and_shapes_are_checked() -> None:
    tokens, special = _rows([5], 7)
    g = seeded_generator(0)
    everything = mask_tokens(
        tokens, special, g, vocab_size=V, mask_id=MASK, mask_rate=1.0, random_rate=0.0
    )
    picked = everything.labels != IGNORE_INDEX
    assert (everything.inputs[picked] == MASK).all()
    with pytest.raises(ValueError, match="exceeds 1"):
        mask_tokens(tokens, special, g, vocab_size=V, mask_id=MASK, mask_rate=0.9, random_rate=0.2)
    with pytest.raises(ValueError, match="bad rates"):
        mask_tokens(tokens, special, g, vocab_size=V, mask_id=MASK, probability=0.0)
    with pytest.raises(ValueError, match="special"):
        mask_tokens(tokens, special[:, 1:], g, vocab_size=V, mask_id=MASK)
