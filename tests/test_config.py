"""Configs: Table 3 presets, validation with errors naming the bad key or value."""

from __future__ import annotations

import dataclasses

import pytest

from aiayn.config import PRESETS, TransformerConfig, preset
from aiayn.errors import ConfigError
from aiayn.training.translation import TRANSLATION_LABEL_SMOOTHING


@pytest.mark.parametrize(
    ("name", "n", "d_model", "d_ff", "h", "d_k", "p_drop", "eps_ls"),
    [("base", 6, 512, 2048, 8, 64, 0.1, 0.1), ("big", 6, 1024, 4096, 16, 64, 0.3, 0.1)],
)
def test_presets_are_table_3(
    name: str, n: int, d_model: int, d_ff: int, h: int, d_k: int, p_drop: float, eps_ls: float
) -> None:
    c = preset(name)
    assert (c.num_encoder_layers, c.num_decoder_layers) == (n, n)
    assert (c.d_model, c.d_ff, c.num_heads, c.d_k, c.d_v) == (d_model, d_ff, h, d_k, d_k)
    assert c.dropout == p_drop
    assert eps_ls == TRANSLATION_LABEL_SMOOTHING  # ε_ls is a training setting (train config)
    assert c.norm_first is False and c.positional == "sinusoidal"


def test_configs_are_frozen_and_round_trip() -> None:
    c = preset("small")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 3  # type: ignore[misc]
    assert TransformerConfig.from_dict(c.to_dict()) == c
    assert set(PRESETS) >= {"base", "big", "small", "tiny"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_modle": 512}, "unknown model config key.*d_modle"),
        ({"num_heads": 7}, "d_model=512 must be divisible by num_heads=7"),
        ({"dropout": 1.5}, "dropout must be in"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"positional": "rope"}, "positional must be one of"),
        ({"d_model": "512"}, "d_model has the wrong type"),
        ({"num_heads": True}, "num_heads has the wrong type"),
        ({"tgt_vocab_size": 100}, "share_embeddings=True needs one joint vocabulary"),
        ({"pad_id": 40000}, "pad_id=40000"),
    ],
)
def test_invalid_configs_name_the_bad_value(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        preset("base").replace(**changes)


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        preset("huge")
