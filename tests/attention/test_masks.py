"""Masks: hand-checked values, shapes and the boolean convention (True = may attend)."""

from __future__ import annotations

import pytest
import torch

from aiayn.attention import (
    causal_mask,
    combine_masks,
    decoder_self_attention_mask,
    lengths_mask,
    mask_fill_value,
    padding_mask,
)


def test_padding_mask_values_and_shape() -> None:
    tokens = torch.tensor([[5, 6, 0], [7, 0, 0]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]
    assert torch.equal(mask, lengths_mask(torch.tensor([2, 1]), 3))


def test_causal_mask_is_lower_triangular() -> None:
    mask = causal_mask(3)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_causal_mask_with_offset_for_incremental_decoding() -> None:
    # query positions 2 and 3 over keys 0..3
    assert causal_mask(2, offset=2)[0, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_combine_and_decoder_mask() -> None:
    tokens = torch.tensor([[4, 4, 0]])
    mask = decoder_self_attention_mask(tokens, pad_id=0)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert combine_masks(None, None) is None
    with pytest.raises(TypeError, match="boolean"):
        combine_masks(torch.ones(1, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fill_value_comes_from_dtype(dtype: torch.dtype) -> None:
    assert mask_fill_value(dtype) == torch.finfo(dtype).min
