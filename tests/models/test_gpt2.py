"""GPT-2 from the blocks: parameter counts of the published sizes, config validation, and the
invariances a decoder-only language model must keep (causality, padding, cache)."""

from __future__ import annotations

import pytest
import torch

from aiayn.config import ConfigError
from aiayn.models import (
    GPT2,
    GPT2_PRESETS,
    GPT2Config,
    count_parameters,
    expected_gpt2_parameters,
    gpt2_preset,
)

PUBLISHED = {  # Hugging Face's counts of the four checkpoints (tied LM head)
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}


@pytest.mark.parametrize("name", list(GPT2_PRESETS))
def test_preset_parameter_counts(name: str) -> None:
    config = gpt2_preset(name)
    with torch.device("meta"):  # no memory for the 1.5B weights
        model = GPT2(config)
    assert count_parameters(model) == expected_gpt2_parameters(config)
    if name in PUBLISHED:
        assert expected_gpt2_parameters(config) == PUBLISHED[name]
    untied = config.replace(tie_output=False)
    with torch.device("meta"):
        assert count_parameters(GPT2(untied)) == expected_gpt2_parameters(untied)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"activation": "swish"}, "activation must be one of"),
        ({"d_model": 30}, "divisible by num_heads"),
        ({"eos_id": 5000}, "eos_id=5000 is outside the vocabulary"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"num_layers": 0}, "num_layers must be >= 1"),
        ({"d_ff": 0}, "d_ff must be >= 1"),
        ({"layer_norm_eps": float("nan")}, "layer_norm_eps must be finite and > 0"),
        ({"n_embd": 8}, "unknown model config key.*n_embd"),
        ({"d_model": "128"}, "d_model has the wrong type"),
    ],
)
def test_bad_configs_are_refused_by_name(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gpt2_preset("gpt2-tiny", **changes)
    with pytest.raises(ConfigError, match="unknown GPT-2 preset 'gpt3'"):
        gpt2_preset("gpt3")


def _model(seed: int = 0) -> GPT2:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=50,
        max_len=32,
        d_model=32,
        num_heads=4,
        num_layers=2,
        dropout=0.0,
        embedding_dropout=0.0,
        attention_dropout=0.0,
        bos_id=0,
        eos_id=0,
        pad_id=0,
    )
    model = GPT2(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)  # norms and biases away from 1 and 0
    return model


@torch.no_grad()
def test_causal_a_later_token_changes_no_earlier_state() -> None:
    model = _model()
    x = torch.randint(1, 50, (2, 9))
    y = x.clone()
    y[:, 6:] = torch.randint(1, 50, (2, 3))
    a, b = model(x).hidden, model(y).hidden
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@torch.no_grad()
def test_left_padding_gives_each_prompt_its_own_states() -> None:
    model = _model(1)
    short, long = torch.randint(1, 50, (1, 4)), torch.randint(1, 50, (1, 7))
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    real = batch != 0
    real[1] = True
    out = model(batch, key_padding=real).hidden
    torch.testing.assert_close(out[0, 3:], model(short).hidden[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], model(long).hidden[0], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_cached_steps_equal_the_full_pass() -> None:
    model = _model(2)
    x = torch.randint(1, 50, (2, 10))
    real = torch.ones(2, 10, dtype=torch.bool)
    real[0, :2] = False  # left padding
    full = model(x, key_padding=real).hidden
    out = model(x[:, :4], key_padding=real[:, :4])
    cache = out.cache
    for t in range(4, 10):
        out = model(x[:, t : t + 1], key_padding=real[:, : t + 1], cache=cache)
        cache = out.cache
        torch.testing.assert_close(out.hidden[:, 0], full[:, t], atol=1e-5, rtol=1e-5)


def test_the_lm_head_is_tied_and_positions_end_at_max_len() -> None:
    model = _model()
    assert model.output_proj.weight is model.embedder.embedding.weight
    with pytest.raises(ValueError, match="max_len"):
        model(torch.ones(1, 33, dtype=torch.long))
