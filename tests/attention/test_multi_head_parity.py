"""Parity: aiayn multi-head attention equals torch.nn.MultiheadAttention after copying weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn.attention import (
    CrossAttention,
    KVCache,
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


def test_kv_cache_appends_in_place_and_copies_on_write() -> None:
    k0, v0 = torch.randn(2, H, 3, 8), torch.randn(2, H, 3, 8)
    cache = KVCache(k0, v0)
    steps = [(torch.randn(2, H, 1, 8), torch.randn(2, H, 1, 8)) for _ in range(40)]
    for k, v in steps:  # 43 positions: the buffers grow past their first capacity
        cache = cache.append(k, v)
    want_k = torch.cat([k0, *(k for k, _ in steps)], dim=2)
    want_v = torch.cat([v0, *(v for _, v in steps)], dim=2)
    assert cache.length == 43
    torch.testing.assert_close(cache.key, want_k, rtol=0, atol=0)
    torch.testing.assert_close(cache.value, want_v, rtol=0, atol=0)
    # two continuations of one prefix: neither sees the other's position
    a = cache.append(torch.zeros(2, H, 1, 8), torch.zeros(2, H, 1, 8))
    b = cache.append(torch.ones(2, H, 1, 8), torch.ones(2, H, 1, 8))
    assert torch.all(a.key[:, :, -1] == 0) and torch.all(b.key[:, :, -1] == 1)
    torch.testing.assert_close(a.key[:, :, :43], want_k, rtol=0, atol=0)
    assert cache.length == 43
    # reordered rows keep their whole history and can be appended to
    index = torch.tensor([1, 1, 0])
    picked = b.index_select(index).append(torch.full((3, H, 1, 8), 2.0), torch.zeros(3, H, 1, 8))
    torch.testing.assert_close(picked.key[:, :, :44], b.key[index], rtol=0, atol=0)
    assert torch.all(picked.key[:, :, 44] == 2)
    assert torch.all(b.key[:, :, -1] == 1)  # the source of the reorder is untouched


def test_kv_cache_reserve_holds_later_appends_in_one_buffer() -> None:
    k0, v0 = torch.randn(2, H, 3, 8), torch.randn(2, H, 3, 8)
    cache = KVCache(k0, v0).reserve(40)  # more than a first append allocates (16 or 2 × L)
    buffer = cache.key.untyped_storage().data_ptr()
    for _ in range(37):  # up to the capacity reserved: no new buffer
        cache = cache.append(torch.randn(2, H, 1, 8), torch.randn(2, H, 1, 8))
        assert cache.key.untyped_storage().data_ptr() == buffer
    assert cache.length == 40
    torch.testing.assert_close(cache.key[:, :, :3], k0, rtol=0, atol=0)
    torch.testing.assert_close(cache.value[:, :, :3], v0, rtol=0, atol=0)
    assert cache.reserve(6) is cache  # the newest cache of a buffer large enough
    grown = cache.reserve(50)
    assert grown.key.untyped_storage().data_ptr() != buffer
    torch.testing.assert_close(grown.key, cache.key, rtol=0, atol=0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_queries_share_keys_values_exactly_like_copies(need_weights: bool) -> None:
    # 3 sentences × 4 beams of queries over each sentence's one memory row
    attn = CrossAttention(D, H).eval()
    memory = torch.randn(3, 5, D)
    pad = lengths_mask(torch.tensor([5, 2, 4]), 5)  # (3, 1, 1, 5)
    x = torch.randn(12, 2, D)
    grouped = attn(x, memory, pad, need_weights=need_weights)
    copied = attn(
        x,
        memory.repeat_interleave(4, dim=0),
        pad.repeat_interleave(4, dim=0),
        need_weights=need_weights,
    )
    assert grouped.cache.key.size(0) == 3  # the source keys/values were not copied
    torch.testing.assert_close(grouped.output, copied.output, atol=1e-6, rtol=1e-5)
    if need_weights:
        assert grouped.weights is not None and copied.weights is not None
        assert grouped.weights.shape == (12, H, 2, 5)
        torch.testing.assert_close(grouped.weights, copied.weights, atol=1e-6, rtol=1e-5)


def test_grouped_queries_reject_a_mask_that_varies_per_query() -> None:
    attn = CrossAttention(D, H).eval()
    memory = torch.randn(2, 5, D)
    per_query = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="cannot share"):
        attn(torch.randn(4, 3, D), memory, per_query)
    with pytest.raises(ValueError, match="cannot share"):
        attn(torch.randn(5, 3, D), memory)  # 5 rows cannot be split over 2


def test_kv_cache_can_be_trained_through_step_by_step() -> None:
    # each step attends to the cache (saving it for backward) and then appends to it: in-place
    # writes into shared buffers would break the backward pass
    k0 = torch.randn(1, H, 2, 8, requires_grad=True)
    k1 = torch.randn(1, H, 1, 8, requires_grad=True)
    q = torch.randn(1, H, 1, 8)
    cache = KVCache(k0, k0 * 2).append(k1, k1 * 2)
    first = (q @ cache.key.transpose(-2, -1)).softmax(-1) @ cache.value  # (1, H, 1, 8)
    cache = cache.append(k1, k1)
    second = (q @ cache.key.transpose(-2, -1)).softmax(-1) @ cache.value
    (first.sum() + second.sum() + cache.key.sum()).backward()
    assert k0.grad is not None and k1.grad is not None
    # the same computation on plain concatenated tensors gives the same gradients
    a0, a1 = k0.detach().requires_grad_(), k1.detach().requires_grad_()
    key1, value1 = torch.cat([a0, a1], 2), torch.cat([a0 * 2, a1 * 2], 2)
    key2, value2 = torch.cat([key1, a1], 2), torch.cat([value1, a1], 2)
    want = (q @ key1.transpose(-2, -1)).softmax(-1) @ value1
    want2 = (q @ key2.transpose(-2, -1)).softmax(-1) @ value2
    (want.sum() + want2.sum() + key2.sum()).backward()
    torch.testing.assert_close(k0.grad, a0.grad)
    torch.testing.assert_close(k1.grad, a1.grad)
