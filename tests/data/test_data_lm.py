"""Language-model data: the EOS-joined stream, blocks whose targets cover every token after the
first exactly once, and deterministic token-budget batches of blocks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from aiayn.data.lm import BlockBatchSampler, TextBlocks, token_stream


class _CharTokenizer:
    """One id per character (ord): enough to check the stream's layout."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[ord(c) for c in text] for text in texts]


def test_stream_joins_non_blank_lines_each_followed_by_eos() -> None:
    stream = token_stream(["ab", "", "  ", "c"], _CharTokenizer(), eos_id=2)
    assert stream.tolist() == [97, 98, 2, 99, 2]
    assert stream.dtype == np.int32


@pytest.mark.parametrize("n", [2, 9, 10, 11, 23])
def test_blocks_predict_every_token_after_the_first_once(n: int) -> None:
    stream = np.arange(100, 100 + n, dtype=np.int32)
    blocks = TextBlocks(stream, block_size=5, keep_tail=True)
    sampler = BlockBatchSampler(blocks, max_tokens=10, seed=0, shuffle=False)
    targets, contexts = [], []
    for ids in sampler.batches(0):
        batch = blocks.collate(ids)
        assert batch.inputs.shape == batch.targets.shape
        assert batch.num_tgt_tokens == batch.targets.numel() == blocks.target_tokens(ids)
        assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])  # shifted by one
        targets += batch.targets.reshape(-1).tolist()
        contexts += batch.inputs[:, 0].tolist()
    assert targets == stream[1:].tolist()
    assert blocks.num_targets == n - 1
    assert contexts == stream[:-1:5].tolist()  # a block starts where the last one ended
    train = TextBlocks(stream, block_size=5)  # training drops the tail
    assert len(train) == (n - 1) // 5 and train.num_targets == 5 * ((n - 1) // 5)


def test_sampler_is_deterministic_per_epoch_and_covers_every_block() -> None:
    blocks = TextBlocks(np.arange(1000, dtype=np.int32), block_size=8)
    sampler = BlockBatchSampler(blocks, max_tokens=30, seed=4)  # 3 blocks a batch
    assert sampler.per_batch == 3 and len(sampler) == -(-len(blocks) // 3)
    first, again, other = sampler.batches(0), sampler.batches(0), sampler.batches(1)
    assert first == again and first != other
    for epoch in (first, other):
        assert sorted(i for batch in epoch for i in batch) == list(range(len(blocks)))
    assert sampler.padding_fraction() == 0.0
    assert BlockBatchSampler(blocks, max_tokens=3, seed=0).per_batch == 1  # at least one


def test_a_batch_holds_blocks_of_one_length() -> None:
    blocks = TextBlocks(np.arange(12, dtype=np.int32), block_size=5, keep_tail=True)
    assert blocks.tail_length == 1 and len(blocks) == 3
    with pytest.raises(ValueError, match="one length"):
        blocks.collate([0, 2])
