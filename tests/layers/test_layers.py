"""Layers: positional encoding (§3.5) by hand, embeddings (§3.4), FFN (eq. 2), and parity of the
encoder/decoder layers with torch.nn.TransformerEncoderLayer / TransformerDecoderLayer."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aiayn.attention import causal_mask, lengths_mask
from aiayn.config import TransformerConfig, preset
from aiayn.layers import (
    FeedForward,
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    sinusoidal_encoding,
)
from aiayn.models.transformer import decoder_layer, encoder_layer


def test_sinusoidal_encoding_hand_computed_entries() -> None:
    pe = sinusoidal_encoding(4, 4)  # d_model = 4: frequencies 1 and 1/10000^(2/4) = 1/100
    assert pe.shape == (4, 4)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert pe[1, 0].item() == pytest.approx(math.sin(1.0))  # PE(1, 0) = sin(1)
    assert pe[1, 1].item() == pytest.approx(math.cos(1.0))  # PE(1, 1) = cos(1)
    assert pe[2, 2].item() == pytest.approx(math.sin(0.02))  # PE(2, 2) = sin(2 / 100)
    assert pe[3, 3].item() == pytest.approx(math.cos(0.03))  # PE(3, 3) = cos(3 / 100)
    big = sinusoidal_encoding(60, 512)
    pos, i = 57, 100  # PE(57, 2·100) = sin(57 / 10000^(200/512))
    assert big[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 512)), abs=1e-6)
    assert big[pos, 2 * i + 1].item() == pytest.approx(
        math.cos(pos / 10000 ** (2 * i / 512)), abs=1e-6
    )


def test_positional_modules_with_offset_and_beyond_table() -> None:
    module = SinusoidalPositionalEncoding(8, max_len=4)
    x = torch.zeros(1, 3, 8)
    torch.testing.assert_close(module(x, offset=3)[0], sinusoidal_encoding(6, 8)[3:])  # past table
    learned = LearnedPositionalEmbedding(8, max_len=4)
    with pytest.raises(ValueError, match="max_len"):
        learned(x, offset=2)


def test_token_embedding_is_scaled_by_sqrt_d_model() -> None:
    emb = TokenEmbedding(10, 16, pad_id=0)
    tokens = torch.tensor([[3, 0]])
    torch.testing.assert_close(emb(tokens)[0, 0], emb.weight[3] * 4.0)
    assert torch.all(emb(tokens)[0, 1] == 0)  # padding row is zero


def test_feed_forward_is_equation_2() -> None:
    ffn = FeedForward(6, 10)
    x = torch.randn(2, 3, 6)
    w1, b1, w2, b2 = ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight, ffn.linear2.bias
    want = torch.clamp(x @ w1.T + b1, min=0) @ w2.T + b2  # max(0, x W_1 + b_1) W_2 + b_2
    torch.testing.assert_close(ffn(x), want)


def _copy_attention(ours: nn.Module, ref: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.copy_(ref.in_proj_weight)
    ours.in_proj.bias.copy_(ref.in_proj_bias)
    ours.out_proj.weight.copy_(ref.out_proj.weight)
    ours.out_proj.bias.copy_(ref.out_proj.bias)


def _copy_common(ours: nn.Module, ref: nn.Module, norms: list[str]) -> None:
    for p in ref.parameters():
        p.data.normal_(0, 0.2)  # random biases and norms too, so that all are really compared
    _copy_attention(ours.self_attn, ref.self_attn)
    ours.feed_forward.linear1.load_state_dict(ref.linear1.state_dict())
    ours.feed_forward.linear2.load_state_dict(ref.linear2.state_dict())
    for ours_norm, ref_norm in zip(norms, ["norm1", "norm2", "norm3"], strict=False):
        getattr(ours, ours_norm).norm.load_state_dict(getattr(ref, ref_norm).state_dict())


def _config(norm_first: bool) -> TransformerConfig:
    return preset("tiny", d_model=32, d_ff=64, num_heads=4, dropout=0.0, norm_first=norm_first)


@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_encoder_layer_matches_torch(norm_first: bool) -> None:
    c = _config(norm_first)
    ours = encoder_layer(c).eval()
    ref = nn.TransformerEncoderLayer(
        c.d_model, c.num_heads, c.d_ff, dropout=0.0, batch_first=True, norm_first=norm_first
    ).eval()
    _copy_common(ours, ref, ["attn_sublayer", "ff_sublayer"])
    x = torch.randn(3, 7, c.d_model)
    mask = lengths_mask(torch.tensor([7, 5, 2]), 7)
    got = ours(x, mask).output
    want = ref(x, src_key_padding_mask=~mask[:, 0, 0])
    real = mask[:, 0, 0]  # torch's fast path may zero padded rows: compare real positions
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_decoder_layer_matches_torch(norm_first: bool) -> None:
    c = _config(norm_first)
    ours = decoder_layer(c).eval()
    ref = nn.TransformerDecoderLayer(
        c.d_model, c.num_heads, c.d_ff, dropout=0.0, batch_first=True, norm_first=norm_first
    ).eval()
    _copy_common(ours, ref, ["self_sublayer", "cross_sublayer", "ff_sublayer"])
    _copy_attention(ours.cross_attn, ref.multihead_attn)
    x, memory = torch.randn(2, 6, c.d_model), torch.randn(2, 9, c.d_model)
    src_mask = lengths_mask(torch.tensor([9, 4]), 9)
    got = ours(x, memory, causal_mask(6), src_mask).output
    want = ref(
        x,
        memory,
        tgt_mask=torch.ones(6, 6, dtype=torch.bool).triu(1),  # torch: True = blocked
        memory_key_padding_mask=~src_mask[:, 0, 0],
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
