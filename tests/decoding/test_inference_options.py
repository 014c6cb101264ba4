"""House rule 7 for the flattened inference step: every value of every model option is held to the
module step, and every part the fast path does not compute is refused, never run differently.

A new field of TransformerConfig fails ``test_every_option_is_enumerated`` until its values are
added to OPTION_VALUES (and so checked here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn

from aiayn.attention import CrossAttention, SelfAttention
from aiayn.config import TransformerConfig, preset
from aiayn.decoding import encoder_decoder_step, inference_step
from aiayn.layers import FeedForward, GatedFeedForward, RMSNorm
from aiayn.models import Transformer

V = 30
PAD, BOS, EOS = 0, 1, 2

# every settable field, with the values checked (defaults of the tiny test model included)
OPTION_VALUES: dict[str, list[object]] = {
    "vocab_size": [V, 41],
    "tgt_vocab_size": [None, 37],  # separate vocabularies need share_embeddings=False
    "d_model": [32, 48],
    "d_ff": [64, 24],
    "num_heads": [4, 1, 8],
    "num_encoder_layers": [2, 0, 1],
    "num_decoder_layers": [2, 1, 3],
    "dropout": [0.0, 0.3],  # eval mode: no dropout on either path
    "attention_dropout": [0.0, 0.2],
    "activation": ["relu", "gelu"],
    "norm_first": [False, True],
    "positional": ["sinusoidal", "learned", "none"],
    "max_len": [64, 3],  # 3: the step computes sinusoids past its table
    "share_embeddings": [True, False],
    "tie_output": [True, False],
    "layer_norm_eps": [1e-5, 1e-2],
    "pad_id": [PAD],  # the searches' PAD/BOS/EOS ids are fixed by the tokenizer
}
NEEDS = {("tgt_vocab_size", 37): {"share_embeddings": False}}


def test_every_option_is_enumerated() -> None:
    fields = {f.name for f in dataclasses.fields(TransformerConfig) if f.init}
    assert fields == set(OPTION_VALUES)


def _cases() -> list[tuple[str, object]]:
    return [(name, value) for name, values in OPTION_VALUES.items() for value in values]


def _base() -> TransformerConfig:
    return preset("tiny", vocab_size=V, d_model=32, d_ff=64, num_heads=4, dropout=0.0)


@pytest.mark.parametrize(("name", "value"), _cases(), ids=lambda x: str(x))
@torch.no_grad()
def test_fast_step_equals_module_step_for_every_option_value(name: str, value: object) -> None:
    torch.manual_seed(0)
    config = _base().replace(**{name: value, **NEEDS.get((name, value), {})})
    model = Transformer(config).eval()
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    module_step, module_state = encoder_decoder_step(model, src)
    fast_step, fast_state = inference_step(model, src, capacity=2)
    tokens = torch.full((2, 1), BOS)
    for _ in range(5):
        want, module_state = module_step(tokens, module_state)
        got, fast_state = fast_step(tokens, fast_state)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        tokens = torch.randint(3, config.target_vocab_size, (2, 1))


def _swap_feed_forward(build: Callable[[int, int], nn.Module]) -> Callable[[Transformer], None]:
    def swap(model: Transformer) -> None:
        for layer in model.decoder.layers:
            layer.feed_forward = build(32, 64)

    return swap


def _swap_norm(model: Transformer) -> None:
    model.decoder.layers[1].cross_sublayer.norm = RMSNorm(32)


def _swap_attention(model: Transformer) -> None:
    model.decoder.layers[0].self_attn = SelfAttention(32, 4, scale=1.0)


def _swap_cross_attention(model: Transformer) -> None:
    model.decoder.layers[0].cross_attn = CrossAttention(32, 4, head_dim=4, scale=1.0)


def _other_head_size(model: Transformer) -> None:
    model.decoder.layers[1].cross_attn = CrossAttention(32, 8, head_dim=4)  # scale 1/√d_k


def _other_norm_placement(model: Transformer) -> None:
    model.decoder.layers[0].ff_sublayer.norm_first = True  # the config is post-norm


def _add_token_types(model: Transformer) -> None:
    model.decoder.embedder.token_types = nn.Embedding(2, 32)


UNKNOWN_PARTS: dict[str, tuple[Callable[[Transformer], None], str]] = {
    "GELU (tanh) feed-forward": (
        _swap_feed_forward(lambda d, f: FeedForward(d, f, "gelu_tanh")),
        "activation relu or gelu",
    ),
    "gated feed-forward": (
        _swap_feed_forward(lambda d, f: GatedFeedForward(d, f, "gelu_tanh")),
        "GatedFeedForward",
    ),
    "RMSNorm": (_swap_norm, "LayerNorm, got RMSNorm"),
    "unscaled self-attention": (_swap_attention, "scale 1/√d_k"),
    "unscaled cross-attention": (_swap_cross_attention, "scale 1/√d_k"),
    "token-type embeddings": (_add_token_types, "no token types"),
    "heads of another size": (_other_head_size, "4 heads of size 8 .*got 8 of size 4"),
    "a sub-layer normed first": (_other_norm_placement, "norm_first=False"),
}


@pytest.mark.parametrize("part", list(UNKNOWN_PARTS))
def test_parts_the_fast_step_does_not_compute_are_refused(part: str) -> None:
    """The module step runs any part; the fast step refuses what it would compute otherwise."""
    torch.manual_seed(0)
    model = Transformer(_base()).eval()
    swap, message = UNKNOWN_PARTS[part]
    swap(model)
    src = torch.tensor([[5, 6, EOS]])
    step, state = encoder_decoder_step(model, src)
    step(torch.full((1, 1), BOS), state)  # the reference path runs it
    with pytest.raises(TypeError, match=message):
        inference_step(model, src)
