"""Parity: aiayn multi-head attention equals torch.nn.MultiheadAttention after copying weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn.attention import (
    CrossAttention,
    MultiHeadAttention,
    SelfAttention,
    causal_mask,
    combine_masks,
    lengths_mask,
)

D, H = 32, 4


def _torch_causal(n: int) -> torch.Tensor:
    """torch's convention: True = blocked."""
    return torch.ones(n, n, dtype=torch.bool).triu(1)


def _pair(
    cls: type[MultiHeadAttention] = MultiHeadAttention,
) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    ours = cls(D, H)
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    with torch.no_grad():
        ref.in_proj_bias.normal_()  # non-zero biases, so that they are really compared
        ref.out_proj.bias.normal_()
        ours.in_proj.weight.copy_(ref.in_proj_weight)
        ours.in_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)
    return ours.eval(), ref.eval()


def test_self_attention_with_key_padding() -> None:
    ours, ref = _pair(SelfAttention)
    x = torch.randn(3, 7, D)
    lengths = torch.tensor([7, 4, 1])
    mask = lengths_mask(lengths, 7)  # (B, 1, 1, S)
    got = ours(x, mask, need_weights=True)
    want, want_w = ref(x, x, x, key_padding_mask=~mask[:, 0, 0], average_attn_weights=False)
    torch.testing.assert_close(got.output, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.weights, want_w, atol=1e-5, rtol=1e-5)
    fast = ours(x, mask).output  # the fused path without weights agrees too
    torch.testing.assert_close(fast, want, atol=1e-5, rtol=1e-5)


def test_causal_self_attention() -> None:
    ours, ref = _pair(SelfAttention)
    x = torch.randn(2, 6, D)
    got = ours(x, causal_mask(6)).output
    want, _ = ref(x, x, x, attn_mask=_torch_causal(6))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cross_attention_with_padding_and_general_forward() -> None:
    ours, ref = _pair(CrossAttention)
    x, memory = torch.randn(2, 5, D), torch.randn(2, 9, D)
    mask = lengths_mask(torch.tensor([9, 3]), 9)
    want, _ = ref(x, memory, memory, key_padding_mask=~mask[:, 0, 0])
    torch.testing.assert_close(ours(x, memory, mask).output, want, atol=1e-5, rtol=1e-5)
    # the general MultiHead(Q, K, V) with distinct key and value tensors
    general, ref2 = _pair()
    value = torch.randn(2, 9, D)
    want2, _ = ref2(x, memory, value, key_padding_mask=~mask[:, 0, 0])
    got2 = general(x, memory, value, mask).output
    torch.testing.assert_close(got2, want2, atol=1e-5, rtol=1e-5)


def test_combined_padding_and_causal() -> None:
    ours, ref = _pair(SelfAttention)
    x = torch.randn(2, 6, D)
    pad = lengths_mask(torch.tensor([6, 4]), 6)
    mask = combine_masks(pad, causal_mask(6))
    want, _ = ref(
        x,
        x,
        x,
        key_padding_mask=~pad[:, 0, 0],
        attn_mask=_torch_causal(6),
    )
    torch.testing.assert_close(ours(x, mask).output, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [1, 3])
def test_incremental_self_attention_equals_full_causal(steps: int) -> None:
    attn = SelfAttention(D, H).eval()
    x = torch.randn(2, 6, D)
    full = attn(x, causal_mask(6)).output
    prefix = 6 - steps
    out = attn(x[:, :prefix], causal_mask(prefix))
    pieces, cache = [out.output], out.cache
    for t in range(prefix, 6):
        step = attn(x[:, t : t + 1], causal_mask(1, offset=t), cache=cache)
        pieces.append(step.output)
        cache = step.cache
    assert cache.length == 6
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
