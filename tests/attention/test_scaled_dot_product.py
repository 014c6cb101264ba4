"""Scaled dot-product attention (eq. 1): formula, the two paths agree, fully masked rows."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.attention import (
    CAUSAL,
    Causal,
    causal_mask,
    combine_masks,
    lengths_mask,
    scaled_dot_product_attention,
)
from aiayn.attention.scaled_dot_product import _explicit_is_faster


def test_matches_the_formula_by_hand() -> None:
    # one query, two keys: scores [3, 2]·√4/√4 -> softmax (0.7311, 0.2689)
    q = torch.tensor([[[[3.0, 0.0, 0.0, 0.0]]]]) * 2  # scaled by √d_k = 2 below
    k = torch.tensor([[[[1.0, 0, 0, 0], [2 / 3, 0, 0, 0]]]])
    v = torch.tensor([[[[1.0, 0, 0, 0], [0.0, 1, 0, 0]]]])
    out, w = scaled_dot_product_attention(q, k, v, need_weights=True)
    assert w is not None
    e = math.exp(1.0)
    torch.testing.assert_close(w[0, 0, 0], torch.tensor([e / (e + 1), 1 / (e + 1)]))
    torch.testing.assert_close(out[0, 0, 0, :2], torch.tensor([e / (e + 1), 1 / (e + 1)]))


@pytest.mark.parametrize("masked", [False, True])
def test_explicit_and_fast_paths_agree(masked: bool) -> None:
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = lengths_mask(torch.tensor([7, 4]), 7) if masked else None
    fast, none = scaled_dot_product_attention(q, k, v, mask)
    explicit, w = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert none is None and w is not None
    torch.testing.assert_close(fast, explicit, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))
    if masked:
        assert torch.all(w[1, :, :, 4:] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_row_gives_zeros_not_nan(dtype: torch.dtype, need_weights: bool) -> None:
    q = torch.randn(2, 2, 4, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 4, 8, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 2, 4, 8, dtype=dtype, requires_grad=True)
    # batch row 1 has no real key at all; combined with causality
    mask = combine_masks(lengths_mask(torch.tensor([4, 0]), 4), causal_mask(4))
    out, w = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert torch.all(out[1] == 0)
    assert torch.isfinite(out[0]).all() and out[0].abs().sum() > 0
    if need_weights:
        assert w is not None and torch.all(w[1] == 0)
    out.float().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()


def test_non_boolean_mask_is_rejected() -> None:
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(TypeError, match="boolean"):
        scaled_dot_product_attention(q, q, q, torch.zeros(1, 1, 2, 2))


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize(("t", "s"), [(6, 6), (2, 6), (1, 6)])
def test_causal_stand_in_equals_the_built_causal_mask(need_weights: bool, t: int, s: int) -> None:
    """CAUSAL (the is_causal kernel when T = S, no mask when T = 1) == a hand-built lower
    triangle, bottom-right aligned for T < S (incremental decoding), on both paths."""
    q, k, v = torch.randn(2, 3, t, 8), torch.randn(2, 3, s, 8), torch.randn(2, 3, s, 8)
    allowed = torch.ones(t, s, dtype=torch.bool).tril(s - t)  # query i sees keys ≤ s - t + i
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    want_w = scores.masked_fill(~allowed, -math.inf).softmax(-1)
    want = want_w @ v
    got, got_w = scaled_dot_product_attention(q, k, v, CAUSAL, need_weights=need_weights)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    if need_weights:
        assert got_w is not None
        torch.testing.assert_close(got_w, want_w)
    assert torch.equal(Causal().build(t, s)[0, 0], allowed)


@pytest.mark.parametrize("masked", [False, True])
def test_many_short_queries_take_the_explicit_path_and_match_torch(masked: bool) -> None:
    # 32·4 query rows of length 4: the decoding shape where the plain ops beat the fused kernel
    q, k, v = torch.randn(32, 4, 4, 16), torch.randn(32, 4, 9, 16), torch.randn(32, 4, 9, 16)
    assert _explicit_is_faster(q, k, 0.0)
    assert not _explicit_is_faster(q.requires_grad_(), k, 0.0)  # training keeps the fused kernel
    assert not _explicit_is_faster(q[:1], k, 0.0)  # 16 rows: the fused kernel is faster
    # the 4 beams of one sentence over its source (8 heads): explicit; one query each: fused
    assert _explicit_is_faster(torch.randn(1, 8, 4, 16), k, 0.0)
    assert not _explicit_is_faster(torch.randn(1, 8, 1, 16), k, 0.0)
    assert not _explicit_is_faster(torch.randn(1, 8, 4, 16), k[:, :, :4], 0.0)  # S = T
    q = q.detach()
    mask = lengths_mask(torch.randint(1, 10, (32,)), 9) if masked else None
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert weights is None
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
