"""T5's relative position buckets (hand-checked values and Hugging Face's own function) and the
bias module's layouts (full, incremental rows, the causal table of the fast step)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from aiayn.layers.relative_position import RelativePositionBias, relative_position_bucket


def test_buckets_by_hand() -> None:
    """8 buckets, max distance 16, bidirectional: 4 per direction, distances 0, 1 exact, then
    log-spaced up to 16: ⌊log(d/2)/log(8)·2⌋ + 2 — d = 3 -> 2, d = 5 -> 2, d = 6 -> 3, ≥ 16 -> 3."""
    r = torch.tensor([0, -1, -2, -3, -5, -6, -16, -100, 1, 2, 6, 100])
    got = relative_position_bucket(r, bidirectional=True, num_buckets=8, max_distance=16)
    assert got.tolist() == [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 7]
    causal = relative_position_bucket(r, bidirectional=False, num_buckets=8, max_distance=16)
    # causal: 8 buckets by −r, 4 exact, then 4 + ⌊log(d/4)/log(4)·4⌋; keys after the query: 0
    assert causal.tolist() == [0, 1, 2, 3, 4, 5, 7, 7, 0, 0, 0, 0]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets, distance", [(32, 128), (8, 12), (7, 5), (33, 300), (4, 3)])
def test_buckets_equal_hugging_face(bidirectional: bool, buckets: int, distance: int) -> None:
    r = torch.arange(-400, 400)
    ours = relative_position_bucket(
        r, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
    )
    theirs = T5Attention._relative_position_bucket(r, bidirectional, buckets, distance)
    assert torch.equal(ours, theirs)


def test_bias_rows_and_causal_table_agree() -> None:
    torch.manual_seed(0)
    bias = RelativePositionBias(3, bidirectional=False, num_buckets=6, max_distance=9)
    full = bias(20, 20)  # (1, H, T, S)
    assert full.shape == (1, 3, 20, 20)
    for offset in (0, 7, 19):  # the rows of new positions only, during incremental decoding
        assert torch.equal(bias(1, offset + 1, offset)[0, :, 0], full[0, :, offset, : offset + 1])
    table = bias.causal_table(20)  # (H, 20)
    for p in (0, 5, 19):
        assert torch.equal(table[:, 20 - 1 - p :], full[0, :, p, : p + 1])
    with pytest.raises(ValueError, match="num_buckets >= 4"):
        RelativePositionBias(2, bidirectional=True, num_buckets=3)
    with pytest.raises(ValueError, match="max_distance > 3"):
        RelativePositionBias(2, bidirectional=False, num_buckets=6, max_distance=3)
