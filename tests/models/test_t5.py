"""aiayn's T5: the published sizes' parameter counts (against Hugging Face's own models built from
the same config), config validation, and the behaviour the decoding code relies on."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config as HFT5Config
from transformers import T5ForConditionalGeneration

from aiayn.errors import ConfigError
from aiayn.models import T5, count_parameters, expected_t5_parameters, t5_preset
from aiayn.models.t5 import T5Config

PUBLISHED = {
    "t5-small": 60_506_624,
    "flan-t5-small": 76_961_152,
    "t5-base": 222_903_552,  # transformers T5ForConditionalGeneration, counted on meta
    "flan-t5-base": 247_577_856,  # the same, untied head and shared input embeddings
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name: str) -> None:
    config = t5_preset(name)
    assert expected_t5_parameters(config) == PUBLISHED[name]
    with torch.device("meta"):
        assert count_parameters(T5(config)) == PUBLISHED[name]


def test_count_matches_hugging_face_for_odd_shapes() -> None:
    """A model with H·d_kv ≠ D and N_enc ≠ N_dec, gated and untied, counted by transformers."""
    config = t5_preset("t5-tiny", d_kv=10, num_decoder_layers=3, gated=True, tie_output=False)
    hf_config = HFT5Config(
        vocab_size=1000, d_model=64, d_kv=10, d_ff=128, num_heads=4, num_layers=2,
        num_decoder_layers=3, feed_forward_proj="gated-gelu",
    )  # fmt: skip
    hf_config.tie_word_embeddings = False
    hf = T5ForConditionalGeneration(hf_config)
    hf.encoder.set_input_embeddings(hf.shared)  # untied head, shared inputs (as FLAN-T5)
    hf.decoder.set_input_embeddings(hf.shared)
    assert count_parameters(T5(config)) == expected_t5_parameters(config)
    assert expected_t5_parameters(config) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize(
    "change, message",
    [
        ({"d_kv": 0}, "d_kv must be >= 1"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"layer_norm_eps": float("nan")}, "layer_norm_eps must be finite and > 0"),
        ({"pad_id": 1000}, "pad_id=1000 is outside"),
        ({"num_buckets": 3}, "num_buckets must be >= 4"),
        ({"num_buckets": 32, "max_distance": 16}, "max_distance must exceed num_buckets / 2"),
        ({"gated": "yes"}, "gated has the wrong type"),
        ({"colour": 1}, "unknown model config key"),
    ],
)
def test_bad_values_refused_by_name(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        t5_preset("t5-tiny", **change)


def test_causal_and_padding_invariance() -> None:
    """A target position's log-probs do not depend on later target tokens, and a source's
    padding does not change its translation's log-probs."""
    torch.manual_seed(0)
    model = T5(t5_preset("t5-tiny", dropout=0.0)).eval()
    src = torch.randint(2, 1000, (1, 7))
    tgt = torch.randint(2, 1000, (1, 6))
    tgt[:, 0] = 0
    changed = tgt.clone()
    changed[:, 4:] = 5
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
        assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
        padded = torch.cat([src, torch.zeros(1, 5, dtype=torch.long)], dim=1)
        assert torch.allclose(model(padded, tgt), a, atol=1e-5)


def test_config_round_trip() -> None:
    config = t5_preset("flan-t5-small")
    assert T5Config.from_dict(config.to_dict()) == config


def test_float16_refused_bfloat16_runs() -> None:
    """T5 overflows float16: refused before any work; bfloat16 runs."""
    model = T5(t5_preset("t5-tiny")).eval()
    src = torch.randint(2, 1000, (1, 5))
    tgt = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="bfloat16"):
        model.half()(src, tgt)
    assert model.bfloat16()(src, tgt).isfinite().all()


@pytest.mark.parametrize("gated", [False, True])
def test_feed_forward_drops_out_at_dropout_rate_as_hugging_face(gated: bool) -> None:
    """Each feed-forward network drops out its inner activations at ``dropout``, where Hugging
    Face's T5 has a ``Dropout(dropout_rate)`` (``DenseReluDense.dropout``); in training only."""
    from aiayn.layers import FeedForward, GatedFeedForward

    config = t5_preset("t5-tiny", dropout=0.2, gated=gated, activation="gelu_tanh")
    model = T5(config)
    ours = [m for m in model.modules() if isinstance(m, (FeedForward, GatedFeedForward))]
    hf = T5ForConditionalGeneration(
        HFT5Config(
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            d_kv=config.d_kv,
            d_ff=config.d_ff,
            num_layers=config.num_encoder_layers,
            num_decoder_layers=config.num_decoder_layers,
            num_heads=config.num_heads,
            dropout_rate=0.2,
            feed_forward_proj="gated-gelu" if gated else "gelu_new",
        )
    )
    theirs = [m.dropout.p for name, m in hf.named_modules() if name.endswith("DenseReluDense")]
    assert [m.dropout.p for m in ours] == theirs == [0.2] * len(ours) and ours
    ff, x = ours[0], torch.randn(2, 3, config.d_model)
    ff.train()
    torch.manual_seed(1)
    a = ff(x)
    torch.manual_seed(2)
    assert not torch.allclose(a, ff(x))  # another mask
    ff.eval()
    torch.manual_seed(1)
    assert not torch.allclose(a, ff(x)) and torch.equal(ff(x), ff(x))  # eval: no dropout
