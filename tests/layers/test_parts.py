"""The parts families receive: norms (LayerNorm, RMSNorm), activations and the gated
feed-forward network, the embedding scale and the input embedder."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aiayn.layers import (
    Embedder,
    FeedForward,
    GatedFeedForward,
    LearnedPositionalEmbedding,
    RMSNorm,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    layer_norm,
    rms_norm,
    sinusoidal_encoding,
)


def test_rms_norm_by_hand() -> None:
    norm = RMSNorm(2, eps=0.0 + 1e-12)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, -1.0]))
    x = torch.tensor([[3.0, 4.0]])  # mean square (9 + 16) / 2 = 12.5
    want = torch.tensor([[2 * 3 / math.sqrt(12.5), -4 / math.sqrt(12.5)]])
    torch.testing.assert_close(norm(x), want)
    half = norm.to(torch.bfloat16)(x.bfloat16())  # squares in fp32, result in the gain's dtype
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), want, atol=2e-2, rtol=1e-2)


def test_norm_factories_and_their_checks() -> None:
    ln = layer_norm(1e-3)(6)
    assert isinstance(ln, nn.LayerNorm) and ln.eps == 1e-3 and ln.normalized_shape == (6,)
    rms = rms_norm(1e-6)(6)
    assert isinstance(rms, RMSNorm) and rms.eps == 1e-6 and not hasattr(rms, "bias")
    for factory in (layer_norm, rms_norm):
        with pytest.raises(ValueError, match="eps must be positive"):
            factory(0.0)


def test_gelu_tanh_is_the_gpt2_formula() -> None:
    x = torch.linspace(-4, 4, 41, dtype=torch.float64)
    ffn = FeedForward(1, 1, "gelu_tanh")
    want = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(ffn.activation(x), want)
    assert not torch.allclose(FeedForward(1, 1, "gelu").activation(x), want, atol=1e-6)
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(1, 1, "swish")


def test_gated_feed_forward_is_the_glu_variant() -> None:
    torch.manual_seed(0)
    ffn = GatedFeedForward(4, 6, "gelu_tanh")
    assert all(m.bias is None for m in (ffn.gate, ffn.linear1, ffn.linear2))
    x = torch.randn(2, 3, 4)
    gate = nn.functional.gelu(x @ ffn.gate.weight.T, approximate="tanh")
    want = (gate * (x @ ffn.linear1.weight.T)) @ ffn.linear2.weight.T
    torch.testing.assert_close(ffn(x), want)


@pytest.mark.parametrize("gated", [False, True])
def test_feed_forward_inner_dropout_by_hand(gated: bool) -> None:
    """T5's dropout inside the network: on the (gated) activations, before W_2; none in eval
    mode, and none by default (the paper's network)."""
    from aiayn.dropout import dropout

    torch.manual_seed(0)
    make = GatedFeedForward if gated else FeedForward
    ffn = make(4, 64, "relu", dropout=0.5)  # type: ignore[operator]
    x = torch.randn(2, 3, 4)
    inner = torch.relu(ffn.linear1(x)) if not gated else torch.relu(ffn.gate(x)) * ffn.linear1(x)
    torch.manual_seed(1)
    got = ffn(x)
    torch.manual_seed(1)
    torch.testing.assert_close(got, ffn.linear2(dropout(inner, 0.5)))
    ffn.eval()
    torch.testing.assert_close(ffn(x), ffn.linear2(inner))
    assert not torch.allclose(got, ffn(x))
    assert make(4, 6, "relu").dropout.p == 0.0  # type: ignore[operator]


def test_embedding_scale_is_an_option() -> None:
    emb = TokenEmbedding(10, 16, scale=1.0)
    tokens = torch.tensor([[3, 4]])
    torch.testing.assert_close(emb(tokens), emb.weight[tokens])
    assert TokenEmbedding(10, 16).scale == 4.0  # √d_model, the paper's default


def test_embedder_adds_token_types_then_norms() -> None:
    torch.manual_seed(0)
    emb, pos = TokenEmbedding(10, 8, scale=1.0), LearnedPositionalEmbedding(8, 6)
    types, norm = nn.Embedding(2, 8), nn.LayerNorm(8)
    embedder = Embedder(emb, pos, 0.0, token_types=types, norm=norm)
    tokens, segments = torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 1]])
    want = norm(emb.weight[tokens] + pos.weight[:3] + types.weight[segments])
    torch.testing.assert_close(embedder(tokens, token_types=segments), want)
    zeros = norm(emb.weight[tokens] + pos.weight[:3] + types.weight[0])  # no types given: 0
    torch.testing.assert_close(embedder(tokens), zeros)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_per_row_positions(kind: str) -> None:
    pos = (
        LearnedPositionalEmbedding(4, 8)
        if kind == "learned"
        else SinusoidalPositionalEncoding(4, 3)
    )
    table = pos.weight if isinstance(pos, LearnedPositionalEmbedding) else sinusoidal_encoding(8, 4)
    x = torch.zeros(2, 3, 4)
    positions = torch.tensor([[0, 1, 2], [0, 0, 5]])  # the second row beyond a 3-row table
    got = pos(x, positions=positions)
    torch.testing.assert_close(got, table[positions])


def test_sinusoid_layouts_by_hand() -> None:
    """D = 4: frequencies 1 and 1/100 (10000^(2i/4), i = 0, 1). The paper interleaves sin and
    cos of each; Marian's "halves" puts the sines first."""
    for pos in (0, 1, 7):
        s1, s2, c1, c2 = math.sin(pos), math.sin(pos / 100), math.cos(pos), math.cos(pos / 100)
        interleaved = sinusoidal_encoding(8, 4)[pos]
        halves = sinusoidal_encoding(8, 4, layout="halves")[pos]
        torch.testing.assert_close(interleaved, torch.tensor([s1, c1, s2, c2]))
        torch.testing.assert_close(halves, torch.tensor([s1, s2, c1, c2]))
    # odd D = 5: three sines (frequencies 10000^(-2i/5), i = 0, 1, 2), then two cosines
    f = [10000 ** (-2 * i / 5) for i in range(3)]
    want = [math.sin(3 * f[0]), math.sin(3 * f[1]), math.sin(3 * f[2])]
    want += [math.cos(3 * f[0]), math.cos(3 * f[1])]
    torch.testing.assert_close(
        sinusoidal_encoding(1, 5, offset=3, layout="halves")[0], torch.tensor(want)
    )
    with pytest.raises(ValueError, match="layout must be one of"):
        sinusoidal_encoding(2, 4, layout="alternating")  # type: ignore[arg-type]


def test_sinusoid_halves_module_past_its_table() -> None:
    pos = SinusoidalPositionalEncoding(6, 2, layout="halves")  # two positions tabulated
    got = pos(torch.zeros(1, 5, 6))[0]  # (5, 6): positions 2..4 computed on demand
    torch.testing.assert_close(got, sinusoidal_encoding(5, 6, layout="halves"))
    torch.testing.assert_close(pos(torch.zeros(1, 1, 6), offset=4)[0], got[4:])
    assert not torch.allclose(got, sinusoidal_encoding(5, 6))  # not the paper's layout


def test_silu_activation() -> None:
    x = torch.linspace(-4, 4, 17, dtype=torch.float64)
    torch.testing.assert_close(FeedForward(1, 1, "silu").activation(x), x * torch.sigmoid(x))
