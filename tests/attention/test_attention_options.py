"""Attention's options for the descendants: an additive bias on the scores (T5's position bias), a
scale other than 1/√d_k, a head size apart from d_model, projections without bias — each held to
the formula computed by hand in float64, on both the explicit and the fused path."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.attention import CAUSAL, SelfAttention, causal_mask, scaled_dot_product_attention


def _reference(q, k, v, mask, bias, scale):  # type: ignore[no-untyped-def]
    """softmax(scale · Q Kᵀ + bias) V with blocked scores at −∞; rows with no key -> 0."""
    scores = scale * (q.double() @ k.double().transpose(-2, -1))  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias.double()
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-blocked rows: NaN -> 0
    return (weights @ v.double()).float(), weights.float()


@pytest.mark.parametrize("need_weights", [True, False], ids=["explicit", "fused"])
@pytest.mark.parametrize("scale", [None, 1.0, 0.37])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bias_and_scale_match_the_formula(need_weights: bool, scale: float | None, with_bias: bool):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    bias = torch.randn(1, 3, 5, 7) if with_bias else None  # one bias shared by the batch
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[0, 0, :, 4:] = False  # padding
    mask[1, 0, 2] = False  # a query with no key at all
    out, weights = scaled_dot_product_attention(
        q, k, v, mask, bias=bias, scale=scale, need_weights=need_weights
    )
    want, want_weights = _reference(
        q, k, v, mask, bias, 1 / math.sqrt(8) if scale is None else scale
    )
    assert not out.isnan().any()
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert torch.all(out[1, :, 2] == 0)
    if need_weights:
        assert weights is not None
        torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)


def test_bias_with_the_unbuilt_causal_mask() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    bias = torch.randn(1, 2, 4, 4)
    got, _ = scaled_dot_product_attention(q, k, v, CAUSAL, bias=bias)
    want, _ = _reference(q, k, v, causal_mask(4), bias, 1 / math.sqrt(8))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_blocked_keys_stay_blocked_whatever_their_bias() -> None:
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([True, True, False])[None, None, None, :]
    bias = torch.tensor([0.0, 0.0, 1e4])[None, None, None, :]  # huge bias on the blocked key
    for need_weights in (True, False):
        out, _ = scaled_dot_product_attention(q, k, v, mask, bias=bias, need_weights=need_weights)
        want, _ = _reference(q, k, v, mask, None, 0.5)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_head_size_apart_from_d_model_and_no_bias() -> None:
    """T5's layout: h·d_k = 3·10 = 30 ≠ D = 16, no projection biases, scale 1."""
    torch.manual_seed(2)
    attn = SelfAttention(16, 3, head_dim=10, bias=False, scale=1.0).eval()
    assert attn.in_proj.weight.shape == (90, 16) and attn.out_proj.weight.shape == (16, 30)
    assert attn.in_proj.bias is None and attn.out_proj.bias is None
    x = torch.randn(2, 5, 16)
    bias = torch.randn(1, 3, 5, 5)
    got = attn(x, CAUSAL, bias=bias).output  # (B, T, D)
    wq, wk, wv = attn.in_proj.weight.chunk(3)  # 3 × (I, D)
    heads = [t.view(2, 5, 3, 10).transpose(1, 2) for t in (x @ wq.T, x @ wk.T, x @ wv.T)]
    out, _ = _reference(*heads, causal_mask(5), bias, 1.0)  # (B, H, T, d_k)
    want = out.transpose(1, 2).reshape(2, 5, 30) @ attn.out_proj.weight.T
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_bias_cannot_be_shared_by_grouped_queries() -> None:
    attn = SelfAttention(8, 2).eval()
    query = torch.randn(4, 2, 1, 4)  # 4 beam rows over 2 key/value rows
    kv = attn.project_key_value(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="one key/value row per query row"):
        attn.attend(query, kv, None, False, torch.zeros(1, 2, 1, 3))


def test_attention_dropout_on_cpu_uses_aiayns_mask_on_the_causal_weights() -> None:
    """With dropout on the weights (training), CPU attention is the explicit computation with
    aiayn's dropout mask (torch's fused kernel would fall back to a Bernoulli draw per weight)."""
    from aiayn.dropout import dropout

    q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    torch.manual_seed(5)
    got, _ = scaled_dot_product_attention(q, k, v, CAUSAL, dropout_p=0.4)
    _, weights = _reference(q, k, v, causal_mask(6), None, 1 / math.sqrt(8))
    torch.manual_seed(5)
    want = dropout(weights, 0.4) @ v
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, weights @ v, atol=1e-3)  # some weights were dropped
