"""Hugging Face GPT-2 -> aiayn's GPT-2 and back: equal logits, every tensor accounted for,
unsupported options and tensors refused by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel

from aiayn.convert import from_hf, gpt2_config_from_hf, gpt2_from_hf, gpt2_to_hf
from aiayn.convert import gpt2 as convert_gpt2
from aiayn.convert.gpt2 import Rule, gpt2_from_hf_tensors
from aiayn.errors import UserError
from aiayn.models.gpt2 import GPT2

MakeHF = Callable[..., Any]
Gap = Callable[[GPT2LMHeadModel, GPT2], float]
TOLERANCE = 1e-4


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"tie_word_embeddings": False},
        {"activation_function": "gelu", "n_inner": 48, "layer_norm_epsilon": 1e-3},
        {"activation_function": "relu"},
        {"activation_function": "gelu_pytorch_tanh"},
    ],
    ids=["tied", "untied", "gelu-n_inner-eps", "relu", "gelu_pytorch_tanh"],
)
def test_logits_equal_hugging_face(make_hf: MakeHF, logit_gap: Gap, config: dict[str, Any]) -> None:
    hf = make_hf(**config)
    model, tokenizer = gpt2_from_hf(hf.path)
    assert tokenizer is None  # the folder has none
    assert not model.training and model.config.tie_output == hf.model.config.tie_word_embeddings
    assert logit_gap(hf.model, model) < TOLERANCE


def test_sharded_safetensors_folder(make_hf: MakeHF, logit_gap: Gap) -> None:
    hf = make_hf(shard="30KB")
    assert (hf.path / "model.safetensors.index.json").is_file()
    assert not (hf.path / "model.safetensors").exists()
    assert logit_gap(hf.model, gpt2_from_hf(hf.path)[0]) < TOLERANCE


@pytest.mark.parametrize("tied", [True, False])
def test_old_pytorch_bin_folder(make_hf: MakeHF, logit_gap: Gap, tied: bool) -> None:
    """OpenAI-era folders: pytorch_model.bin, GPT2Model names (no "transformer."), the causal
    mask buffers attn.bias / attn.masked_bias, and lm_head.weight stored even when tied."""
    hf = make_hf(tie_word_embeddings=tied)
    tensors = {k.removeprefix("transformer."): v for k, v in hf.model.state_dict().items()}
    for i in range(hf.model.config.n_layer):
        tensors[f"h.{i}.attn.bias"] = torch.ones(64, 64).tril()[None, None]
        tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    (hf.path / "model.safetensors").unlink()
    torch.save(tensors, hf.path / "pytorch_model.bin")
    assert ("lm_head.weight" in tensors) and ("wte.weight" in tensors)
    assert logit_gap(hf.model, gpt2_from_hf(hf.path)[0]) < TOLERANCE


@pytest.mark.parametrize("tied", [True, False])
def test_round_trip_through_hugging_face(
    make_hf: MakeHF, logit_gap: Gap, tmp_path: Path, tied: bool
) -> None:
    hf = make_hf(tie_word_embeddings=tied)
    model, _ = gpt2_from_hf(hf.path)
    out = gpt2_to_hf(model, tmp_path / "back")
    back, info = GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert not info["mismatched_keys"] and not info["error_msgs"]
    assert back.config.tie_word_embeddings == tied
    assert logit_gap(back.eval(), model) < TOLERANCE
    assert ("lm_head.weight" in load_file(out / "model.safetensors")) == (not tied)
    assert gpt2_config_from_hf(back.config.to_dict()) == model.config


def test_generic_from_hf_dispatches_on_model_type(make_hf: MakeHF, logit_gap: Gap) -> None:
    hf = make_hf(tokenizer=True)
    converted = from_hf(hf.path)
    assert isinstance(converted.model, GPT2) and converted.tokenizer is not None
    assert converted.tensors_mapped == len(load_file(hf.path / "model.safetensors"))
    assert converted.hf_config["model_type"] == "gpt2"
    assert logit_gap(hf.model, converted.model) < TOLERANCE
    config = (hf.path / "config.json").read_text().replace('"gpt2"', '"bart"')
    (hf.path / "config.json").write_text(config)
    with pytest.raises(UserError, match="model_type 'bart' is not supported yet"):
        from_hf(hf.path)


def _hf_config(**changes: Any) -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "vocab_size": 300,
        "bos_token_id": 0,
        "eos_token_id": 0,
        **changes,
    }


def test_config_defaults_are_hugging_face_s() -> None:
    config = gpt2_config_from_hf({"model_type": "gpt2"})  # every other key left out
    assert (config.vocab_size, config.max_len, config.d_model) == (50257, 1024, 768)
    assert (config.num_layers, config.num_heads, config.d_ff) == (12, 12, None)
    assert config.activation == "gelu_tanh" and config.tie_output
    assert config.bos_id == config.eos_id == config.pad_id == 50256
    assert gpt2_config_from_hf(_hf_config(pad_token_id=7)).pad_id == 7


@pytest.mark.parametrize(
    ("hf_activation", "activation"),
    [
        ("gelu_new", "gelu_tanh"),
        ("gelu_pytorch_tanh", "gelu_tanh"),
        ("gelu", "gelu"),
        ("relu", "relu"),
    ],
)
def test_activations_map_to_the_same_function(hf_activation: str, activation: str) -> None:
    """GELU and its tanh approximation differ little in the logits: checked by name too."""
    config = gpt2_config_from_hf(_hf_config(activation_function=hf_activation))
    assert config.activation == activation


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
        ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn=True"),
        ({"scale_attn_weights": False}, "scale_attn_weights=False"),
        ({"add_cross_attention": True}, "add_cross_attention=True"),
        ({"activation_function": "gelu_fast"}, "activation_function 'gelu_fast'"),
        ({"activation_function": "quick_gelu"}, "activation_function 'quick_gelu'"),
        ({"model_type": "bert"}, "model_type 'bert' is not GPT-2"),
        ({"eos_token_id": 300}, "eos_token_id=300 is not an id of the vocabulary"),
        ({"bos_token_id": [0, 1]}, r"bos_token_id=\[0, 1\]"),
        ({"n_embd": 30, "n_head": 4}, "d_model=30 must be divisible by num_heads=4"),
    ],
)
def test_unsupported_options_are_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        gpt2_config_from_hf(_hf_config(**changes))


def _rewrite(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("config", "edit", "message"),
    [
        (
            {},
            lambda t: t.update({"transformer.h.0.attn.rotary.weight": torch.ones(4)}),
            "unexpected tensor 'transformer.h.0.attn.rotary.weight'",
        ),
        (
            {},
            lambda t: t.update({"transformer.h.2.ln_1.weight": torch.ones(32)}),
            r"unexpected tensor 'h.2.ln_1.weight': the config \(n_layer=2\)",
        ),
        (
            {},
            lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"),
            "missing tensor 'h.1.mlp.c_fc.bias'",
        ),
        (
            {},
            lambda t: t.update({"transformer.h.0.mlp.c_fc.weight": torch.ones(32, 100)}),
            r"'h.0.mlp.c_fc.weight' has shape \(32, 100\); the config says \(32, 128\)",
        ),
        (
            {},
            lambda t: t.update({"lm_head.weight": torch.ones(300, 32)}),
            "lm_head.weight differs from wte.weight",
        ),
        (
            {},
            lambda t: t.update({"wte.weight": t["transformer.wte.weight"].clone()}),
            r"'(transformer\.)?wte.weight' is in the checkpoint twice",
        ),
        (
            {"tie_word_embeddings": False},
            lambda t: t.pop("lm_head.weight"),
            "missing tensor 'lm_head.weight'",
        ),
    ],
    ids=[
        "extra",
        "extra-layer",
        "missing",
        "shape",
        "tied-head-differs",
        "twice",
        "untied-no-head",
    ],
)
def test_extra_missing_or_misshapen_tensors_are_refused_by_name(
    make_hf: MakeHF,
    config: dict[str, Any],
    edit: Callable[[dict[str, torch.Tensor]], None],
    message: str,
) -> None:
    hf = make_hf(**config)
    _rewrite(hf.path, edit)
    with pytest.raises(UserError, match=message):
        gpt2_from_hf(hf.path)


@pytest.mark.parametrize(
    "wrong",
    [
        {
            "h.{}.ln_1.bias": Rule("layers.{}.ff_sublayer.norm.bias"),
            "h.{}.ln_2.bias": Rule("layers.{}.attn_sublayer.norm.bias"),
        },
        {"h.{}.attn.c_proj.weight": Rule("layers.{}.self_attn.out_proj.weight")},
    ],
    ids=["ln_1-ln_2-swapped", "c_proj-not-transposed"],
)
def test_a_wrong_map_breaks_the_parity_check(
    make_hf: MakeHF, logit_gap: Gap, monkeypatch: pytest.MonkeyPatch, wrong: dict[str, Rule]
) -> None:
    """The random draws make a mis-mapped tensor visible even where the shapes agree."""
    hf = make_hf()
    for hf_name, rule in wrong.items():
        monkeypatch.setitem(convert_gpt2.HF_TO_AIAYN, hf_name, rule)
    model, _ = gpt2_from_hf_tensors(
        hf.model.config.to_dict(), load_file(hf.path / "model.safetensors")
    )
    assert logit_gap(hf.model, model) > 1e-2
