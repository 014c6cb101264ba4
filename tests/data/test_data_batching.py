"""Encoded datasets, collation and token-budget batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.data import (
    ParallelDataset,
    TokenBatchSampler,
    Tokenizer,
    collate,
    filter_pairs,
    padding_fraction,
    read_parallel,
)
from aiayn.errors import UserError

# ------------------------------------------------------------------------------ collate


def test_collate_hand_example() -> None:
    batch = collate([[5, 6, 7], [8]], [[9], [10, 11]], pad_id=0, bos_id=1, eos_id=2)
    assert batch.src.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]  # (B=2, S=4): ids + EOS
    assert batch.tgt_in.tolist() == [[1, 9, 0], [1, 10, 11]]  # (B=2, T=3): BOS + ids
    assert batch.tgt_out.tolist() == [[9, 2, 0], [10, 11, 2]]  # (B=2, T=3): ids + EOS
    for t in (batch.src, batch.tgt_in, batch.tgt_out):
        assert t.dtype == torch.int64
    assert batch.size == 2
    assert batch.num_src_tokens == 6  # 4 ids + 2 EOS
    assert batch.num_tgt_tokens == 5  # 3 ids + 2 EOS
    assert batch.src_padding_fraction == pytest.approx(2 / 8)
    assert batch.tgt_padding_fraction == pytest.approx(1 / 6)
    assert batch.padding_fraction == pytest.approx(3 / 14)


def test_collate_numpy_inputs_and_empty_sentences() -> None:
    src = [np.array([4, 5], dtype=np.int32), np.array([], dtype=np.int32)]
    tgt = [np.array([], dtype=np.int32), np.array([6], dtype=np.int32)]
    batch = collate(src, tgt, pad_id=0, bos_id=1, eos_id=2)
    assert batch.src.tolist() == [[4, 5, 2], [2, 0, 0]]
    assert batch.tgt_in.tolist() == [[1, 0], [1, 6]]
    assert batch.tgt_out.tolist() == [[2, 0], [6, 2]]
    assert batch.to("cpu").src.tolist() == batch.src.tolist()


def test_collate_rejects_mismatched_lists() -> None:
    with pytest.raises(ValueError, match="1 source sequences but 2 target"):
        collate([[4]], [[4], [5]], pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="empty"):
        collate([], [], pad_id=0, bos_id=1, eos_id=2)


# ------------------------------------------------------------------------------ dataset


def test_dataset_from_pairs(small_tokenizer: Tokenizer) -> None:
    pairs = [("Hi.", "Hallo!"), ("Run!", "Lauf!"), ("Tom " * 20, "Tom")]
    long_len = len(small_tokenizer.encode("Tom " * 20))
    ds = ParallelDataset.from_pairs(pairs, small_tokenizer, max_tokens_per_sentence=long_len - 1)
    assert len(ds) == 2
    assert ds.num_dropped_too_long == 1
    assert ds.source_indices.tolist() == [0, 1]
    assert small_tokenizer.decode(ds[1].src) == "Run!"
    assert ds.src_lengths.tolist() == [len(small_tokenizer.encode(s)) for s, _ in pairs[:2]]

    batch = ds.collate([1, 0])
    assert batch.src[0, : ds.src_lengths[1]].tolist() == ds[1].src.tolist()
    assert small_tokenizer.decode(batch.tgt_out[0].tolist()) == "Lauf!"
    assert batch.tgt_in[:, 0].tolist() == [small_tokenizer.bos_id] * 2

    everything = ParallelDataset.from_pairs(pairs, small_tokenizer)
    assert len(everything) == 3 and everything.num_dropped_too_long == 0
    with pytest.raises(UserError, match="max_tokens_per_sentence"):
        ParallelDataset.from_pairs(pairs, small_tokenizer, max_tokens_per_sentence=0)


# ------------------------------------------------------------------------------ sampler


def _random_lengths(n: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 40, size=n)
    tgt = np.clip(src + rng.integers(-5, 6, size=n), 1, None)
    return src, tgt


def _cost(src: np.ndarray, tgt: np.ndarray, batch: list[int]) -> int:
    return len(batch) * (int(np.maximum(src[batch], tgt[batch]).max()) + 1)


def test_hand_checkable_packing() -> None:
    # costs max(src, tgt) + 1 = [2, 2, 2, 2, 4]; budget 4 -> two pairs of 2, then the 4 alone
    sampler = TokenBatchSampler([1, 1, 1, 1, 3], [1, 1, 1, 1, 1], 4, seed=0, shuffle=False)
    assert sampler.batches(0) == [[0, 1], [2, 3], [4]]
    assert len(sampler) == 3
    assert sampler.batches(5) == sampler.batches(0)  # no shuffling: every epoch alike


@pytest.mark.parametrize("bucketing", [True, False])
def test_budget_and_coverage(bucketing: bool) -> None:
    src, tgt = _random_lengths()
    sampler = TokenBatchSampler(src, tgt, 300, seed=3, bucketing=bucketing)
    for epoch in range(3):
        batches = sampler.batches(epoch)
        assert all(_cost(src, tgt, b) <= 300 for b in batches)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(1000))  # every index exactly once
    assert len(sampler) == len(sampler.batches(0))


def test_deterministic_per_seed_and_epoch() -> None:
    src, tgt = _random_lengths()
    a = TokenBatchSampler(src, tgt, 300, seed=7)
    b = TokenBatchSampler(src.tolist(), tgt.tolist(), 300, seed=7)
    assert a.batches(2) == b.batches(2)
    assert a.batches(2) == a.batches(2)
    assert a.batches(2) != a.batches(3)  # new epoch, new order
    assert {tuple(sorted(x)) for x in a.batches(2)} != {tuple(sorted(x)) for x in a.batches(3)}
    assert a.batches(2) != TokenBatchSampler(src, tgt, 300, seed=8).batches(2)


def test_batch_count_is_the_same_every_epoch() -> None:
    src, tgt = _random_lengths()
    sampler = TokenBatchSampler(src, tgt, 500, seed=1)
    assert {len(sampler.batches(e)) for e in range(5)} == {len(sampler)}


def test_batches_group_similar_lengths() -> None:
    src, tgt = _random_lengths()
    sampler = TokenBatchSampler(src, tgt, 300, seed=0)

    # Each batch is a run of the (longer side, tgt_len, src_len) order: put the batches back in
    # that order and the concatenated keys are sorted.
    def key(i: int) -> tuple[int, int, int]:
        return max(int(src[i]), int(tgt[i])), int(tgt[i]), int(src[i])

    keyed = [sorted(key(i) for i in b) for b in sampler.batches(0)]
    keyed.sort()
    flat = [key for run in keyed for key in run]
    assert flat == sorted(flat)
    ranges = [run[-1][0] - run[0][0] for run in keyed]
    assert max(ranges) <= 3 and np.mean(ranges) < 0.5  # random lengths span 1..44


def test_oversized_sentence_gets_its_own_batch() -> None:
    sampler = TokenBatchSampler([3, 50, 3, 4], [3, 2, 4, 3], 20, seed=0)
    assert sampler.num_oversized == 1
    batches = sampler.batches(0)
    assert [1] in batches
    assert sorted(len(b) for b in batches) == [1, 3]


def test_max_sentences_cap() -> None:
    sampler = TokenBatchSampler([1] * 10, [1] * 10, 1000, seed=0, max_sentences=4)
    assert sorted(len(b) for b in sampler.batches(0)) == [2, 4, 4]


def test_sampler_rejects_bad_arguments() -> None:
    with pytest.raises(UserError, match="max_tokens"):
        TokenBatchSampler([1], [1], 0, seed=0)
    with pytest.raises(UserError, match="seed"):
        TokenBatchSampler([1], [1], 10, seed=-1)
    with pytest.raises(ValueError, match="differ in length"):
        TokenBatchSampler([1, 2], [1], 10, seed=0)


def test_padding_fraction_hand_example() -> None:
    # src rows 1+1 and 3+1 -> 2 × 4 slots, 6 real; tgt rows 2+1 twice -> 2 × 3 slots, 6 real
    assert padding_fraction([[0, 1]], [1, 3], [2, 2]) == pytest.approx(2 / 14)
    assert padding_fraction([], [1], [1]) == 0.0


def test_padding_fraction_matches_collate() -> None:
    src, tgt = _random_lengths(200)
    sampler = TokenBatchSampler(src, tgt, 400, seed=0, bucketing=False)
    batches = sampler.batches(0)
    pad = real = 0
    for b in batches:
        batch = collate(
            [[7] * src[i] for i in b], [[7] * tgt[i] for i in b], pad_id=0, bos_id=1, eos_id=2
        )
        pad += batch.src.numel() + batch.tgt_out.numel()
        real += batch.num_src_tokens + batch.num_tgt_tokens
    assert sampler.padding_fraction(0) == pytest.approx(1 - real / pad)


def test_padding_fraction_on_real_tatoeba(
    tatoeba_tsv: Path, demo_pairs: list[tuple[str, str]]
) -> None:
    """§5.1's length bucketing keeps padding low on real sentence pairs; random batches don't."""
    tokenizer = Tokenizer.train((s for pair in demo_pairs for s in pair), vocab_size=8000)
    pairs, _ = filter_pairs(read_parallel(tatoeba_tsv))
    pairs = pairs[::2]  # ~85k pairs, every length kept (the file is sorted by length)
    src_len = [len(x) for x in tokenizer.encode_batch([s for s, _ in pairs])]
    tgt_len = [len(x) for x in tokenizer.encode_batch([t for _, t in pairs])]
    bucketed = TokenBatchSampler(src_len, tgt_len, 4096, seed=1).padding_fraction(0)
    random = TokenBatchSampler(src_len, tgt_len, 4096, seed=1, bucketing=False).padding_fraction(0)
    print(f"padding fraction: bucketed {bucketed:.1%}, random {random:.1%}")
    assert bucketed < 0.07
    # the target side, where padding costs the most (decoder and output layer), stays lowest
    lengths = np.asarray(tgt_len) + 1
    batches = TokenBatchSampler(src_len, tgt_len, 4096, seed=1).batches(0)
    tgt_slots = sum(len(b) * int(lengths[b].max()) for b in batches)
    assert 1 - lengths.sum() / tgt_slots < 0.05
    assert random > 0.4
    assert random > 5 * bucketed
