"""Hugging Face Marian (OPUS-MT) -> aiayn's Transformer: equal encoder outputs and log-probs
(teacher-forced, step by step, and through the flattened inference step), every tensor accounted
for, unsupported options and tensors refused by name, and the special ids read.

Hugging Face initialises norms to 1 and biases to 0, which would hide a norm or bias mapped to the
wrong place: every parameter (and ``final_logits_bias``) is drawn from N(0, 0.3) instead. The
sinusoid tables are left as Hugging Face builds them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor
from transformers import MarianConfig, MarianMTModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from aiayn.convert.hf_folder import read_hf_config, read_hf_weights
from aiayn.convert.marian import (
    Seq2SeqSpecials,
    marian_config_from_hf,
    marian_from_hf_tensors,
    marian_generation_defaults,
)
from aiayn.decoding import encoder_decoder_step, inference_step
from aiayn.errors import UserError
from aiayn.inference import pack_for_inference, packing_available
from aiayn.layers import sinusoidal_encoding
from aiayn.models import Transformer
from aiayn.models.params import count_parameters, expected_parameter_count

TOLERANCE = 1e-4
VOCAB, POSITIONS, EOS = 90, 64, 0
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": POSITIONS,
    "activation_function": "swish",
    "scale_embedding": True,
    "pad_token_id": VOCAB - 1,  # Marian's pad is its last id, and the decoder's start token
    "decoder_start_token_id": VOCAB - 1,
    "eos_token_id": EOS,
    "forced_eos_token_id": EOS,
}
SEPARATE = {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 70}
SEPARATE_PAD = {"pad_token_id": 69, "decoder_start_token_id": 69}  # in both vocabularies


class HFFolder(NamedTuple):
    model: MarianMTModel  # eval mode
    path: Path


def random_hf_marian(seed: int = 0, **config: Any) -> MarianMTModel:
    """A MarianMTModel of the tiny config (with ``config`` changes), every parameter and the
    logits bias ~ N(0, 0.3); the sinusoid tables as Hugging Face builds them."""
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**{**TINY, **config}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0, 0.3)
        model.final_logits_bias.normal_(0, 0.3)
    return model.eval()


def save(model: MarianMTModel, path: Path) -> HFFolder:
    model.save_pretrained(path)
    return HFFolder(model, path)


def convert(path: Path) -> tuple[Transformer, int]:
    return marian_from_hf_tensors(read_hf_config(path), read_hf_weights(path))


def batch(hf: MarianMTModel, seed: int = 1) -> tuple[Tensor, Tensor]:
    """(B, S) source ids of 9, 5 and 2 tokens (EOS last), right-padded, and (B, T) decoder inputs
    starting with the decoder start token (Marian's pad id) and no padding."""
    c = hf.config
    g = torch.Generator().manual_seed(seed)
    src = torch.full((3, 9), c.pad_token_id)
    for row, length in enumerate((9, 5, 2)):
        src[row, : length - 1] = torch.randint(1, c.pad_token_id, (length - 1,), generator=g)
        src[row, length - 1] = EOS
    tgt = torch.randint(1, c.pad_token_id, (3, 6), generator=g)  # neither pad nor EOS
    tgt[:, 0] = c.decoder_start_token_id
    return src, tgt


@torch.no_grad()
def hf_log_probs(hf: MarianMTModel, src: Tensor, tgt: Tensor) -> Tensor:
    mask = (src != hf.config.pad_token_id).long()
    return torch.log_softmax(
        hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits, -1
    )


@torch.no_grad()
def hf_step_log_probs(hf: MarianMTModel, src: Tensor, tgt: Tensor) -> list[Tensor]:
    """Hugging Face's own incremental decoding (its key/value cache), one (B, V) per step."""
    mask = (src != hf.config.pad_token_id).long()
    encoder_outputs = hf.get_encoder()(input_ids=src, attention_mask=mask)
    past, steps = None, []
    for t in range(tgt.size(1)):
        out = hf(
            encoder_outputs=encoder_outputs,
            attention_mask=mask,
            decoder_input_ids=tgt[:, t : t + 1],
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        steps.append(torch.log_softmax(out.logits[:, -1], -1))
    return steps


VARIANTS: dict[str, dict[str, Any]] = {
    "swish-2+2": {},
    "swish-3+2": {"encoder_layers": 3},
    "relu": {"activation_function": "relu"},
    "gelu-2+3": {"activation_function": "gelu", "decoder_layers": 3},
    "untied": {"tie_word_embeddings": False},
    "separate-vocab": {**SEPARATE, **SEPARATE_PAD},
    "separate-untied": {**SEPARATE, **SEPARATE_PAD, "tie_word_embeddings": False},
}


@pytest.mark.parametrize("changes", list(VARIANTS.values()), ids=list(VARIANTS))
@torch.no_grad()
def test_equal_to_hugging_face(tmp_path: Path, changes: dict[str, Any]) -> None:
    hf = save(random_hf_marian(**changes), tmp_path / "hf")
    model, mapped = convert(hf.path)
    c, hc = model.config, hf.model.config
    assert not model.training
    assert (c.positional, c.output_bias, c.norm_first, c.layer_norm_eps) == (
        "sinusoidal-halves",
        True,
        False,
        1e-5,
    )
    assert c.tie_output == hc.tie_word_embeddings
    assert c.share_embeddings == (hc.share_encoder_decoder_embeddings and hc.tie_word_embeddings)
    assert c.target_vocab_size == hf.model.lm_head.out_features
    stored = load_file(hf.path / "model.safetensors")
    ignored = 1 if "model.shared.weight" in stored and not c.share_embeddings else 0
    assert mapped == len(stored) - ignored  # every stored tensor used (or the unread shared one)
    assert count_parameters(model) == expected_parameter_count(c)

    src, tgt = batch(hf.model)
    real = src != hc.pad_token_id
    mask = real.long()
    hf_memory = hf.model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    memory = model.encode(src).memory
    assert float((hf_memory - memory)[real].abs().max()) < TOLERANCE

    want = hf_log_probs(hf.model, src, tgt)  # (B, T, V): by causality, also each step's
    assert float((model(src, tgt) - want).abs().max()) < TOLERANCE
    for name, (step, state) in {
        "module step": encoder_decoder_step(model, src, banned=()),
        "inference step": inference_step(model, src, banned=(), capacity=2),
    }.items():
        for t in range(tgt.size(1)):
            got, state = step(tgt[:, t : t + 1], state)
            torch.testing.assert_close(got, want[:, t], atol=TOLERANCE, rtol=0, msg=name)


@torch.no_grad()
def test_steps_equal_hugging_face_incremental_decoding(tmp_path: Path) -> None:
    """Each step against Hugging Face's own cached decoding, beams included (two rows per
    sentence, as beam search has them), and through the packed inference step."""
    hf = save(random_hf_marian(encoder_layers=3), tmp_path / "hf")
    model, _ = convert(hf.path)
    src, tgt = batch(hf.model)
    hf_steps = hf_step_log_probs(hf.model, src.repeat_interleave(2, 0), tgt.repeat_interleave(2, 0))
    steppers = {
        "module step": encoder_decoder_step(model, src, banned=()),
        "inference step": inference_step(model, src, banned=(), capacity=2),
    }
    if packing_available():
        steppers["packed inference step"] = inference_step(
            pack_for_inference(model), src, banned=()
        )
    for name, (step, state) in steppers.items():
        state = state.repeat_interleave(2)
        for t in range(tgt.size(1)):
            tokens = tgt[:, t : t + 1].repeat_interleave(2, 0)
            got, state = step(tokens, state)
            torch.testing.assert_close(got, hf_steps[t], atol=TOLERANCE, rtol=0, msg=name)


@torch.no_grad()
def test_old_pytorch_bin_with_every_tied_copy_and_the_sinusoid_tables(tmp_path: Path) -> None:
    """transformers 4 folders: pytorch_model.bin with model.shared, both embed_tokens, lm_head
    and the embed_positions tables stored; the tables are checked, not loaded."""
    hf = save(random_hf_marian(), tmp_path / "hf")
    tensors = hf.model.state_dict()
    assert {"model.shared.weight", "lm_head.weight", "model.encoder.embed_positions.weight"} <= set(
        tensors
    )
    (hf.path / "model.safetensors").unlink()
    torch.save(tensors, hf.path / "pytorch_model.bin")
    model, mapped = convert(hf.path)
    assert mapped == len(tensors) - 2  # all but the two sinusoid tables
    assert model.output_proj.weight is model.encoder.embedder.embedding.weight
    assert model.decoder.embedder.embedding is model.encoder.embedder.embedding
    src, tgt = batch(hf.model)
    assert float((model(src, tgt) - hf_log_probs(hf.model, src, tgt)).abs().max()) < TOLERANCE


@pytest.mark.parametrize("d_model", [32, 33])
def test_sinusoid_halves_are_hugging_face_table(d_model: int) -> None:
    hf = MarianSinusoidalPositionalEmbedding(POSITIONS, d_model).create_weight()
    torch.testing.assert_close(
        sinusoidal_encoding(POSITIONS, d_model, layout="halves"), hf, atol=1e-6, rtol=0
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "bart"}, "model_type 'bart' is not Marian"),
        ({"scale_embedding": False}, "scale_embedding=False"),
        ({"activation_function": "gelu_new"}, "activation_function 'gelu_new'"),
        ({"activation_function": "tanh"}, "activation_function 'tanh'"),
        ({"activation_dropout": 0.1}, "activation_dropout=0.1"),
        ({"encoder_layerdrop": 0.2}, "encoder_layerdrop=0.2"),
        ({"decoder_attention_heads": 8}, "decoder_attention_heads=8 differs"),
        ({"decoder_ffn_dim": 48}, "decoder_ffn_dim=48 differs"),
        ({"normalize_before": True}, "normalize_before=True"),
        ({"normalize_embedding": True}, "normalize_embedding=True"),
        ({"add_final_layer_norm": True}, "add_final_layer_norm=True"),
        ({"static_position_embeddings": False}, "static_position_embeddings=False"),
        ({"is_encoder_decoder": False}, "is_encoder_decoder=False"),
        ({"pad_token_id": None}, "pad_token_id=None"),
        ({**SEPARATE, "pad_token_id": 80}, "pad_token_id=80 is not an id of both"),
        ({"decoder_vocab_size": 70}, "decoder_vocab_size=70 differs"),
    ],
)
def test_unsupported_options_are_refused_by_name(changes: dict[str, Any], message: str) -> None:
    config = {**MarianConfig(**TINY).to_dict(), **changes}
    with pytest.raises(UserError, match=message):
        marian_config_from_hf(config)


def test_missing_config_keys_mean_marian_config_defaults() -> None:
    """A config.json without scale_embedding means MarianConfig's False: refused."""
    config = {k: v for k, v in MarianConfig(**TINY).to_dict().items() if k != "scale_embedding"}
    with pytest.raises(UserError, match="scale_embedding=False"):
        marian_config_from_hf(config)
    minimal = {"model_type": "marian", "scale_embedding": True, "vocab_size": 100}
    with pytest.raises(UserError, match="pad_token_id=58100"):  # MarianConfig's default pad
        marian_config_from_hf(minimal)
    c = marian_config_from_hf({**minimal, "pad_token_id": 99})
    assert (c.d_model, c.d_ff, c.num_heads, c.num_encoder_layers) == (1024, 4096, 16, 12)
    assert (c.activation, c.max_len, c.dropout) == ("gelu", 1024, 0.1)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> HFFolder:
    return save(random_hf_marian(), tmp_path_factory.mktemp("marian") / "hf")


def _convert_with(folder: HFFolder, change: dict[str, Tensor | None]) -> None:
    tensors: dict[str, Tensor] = dict(read_hf_weights(folder.path))
    for name, tensor in change.items():
        if tensor is None:
            del tensors[name]
        else:
            tensors[name] = tensor
    marian_from_hf_tensors(read_hf_config(folder.path), tensors)


def test_missing_tensors_are_refused_by_name(tiny_folder: HFFolder) -> None:
    for name in (
        "model.decoder.layers.1.encoder_attn.k_proj.bias",
        "model.encoder.layers.0.fc2.weight",
        "model.shared.weight",
    ):
        with pytest.raises(UserError, match=f"missing tensor '{name}'"):
            _convert_with(tiny_folder, {name: None})
    # final_logits_bias may be left out: Hugging Face loads it as zeros
    tensors = dict(read_hf_weights(tiny_folder.path))
    del tensors["final_logits_bias"]
    model, _ = marian_from_hf_tensors(read_hf_config(tiny_folder.path), tensors)
    assert model.output_proj.bias is not None and not model.output_proj.bias.any()


def test_wrong_shapes_and_unexpected_tensors_are_refused_by_name(tiny_folder: HFFolder) -> None:
    name = "model.encoder.layers.1.fc1.weight"
    with pytest.raises(UserError, match=rf"tensor '{name}' has shape \(64, 31\); .* \(64, 32\)"):
        _convert_with(tiny_folder, {name: torch.zeros(64, 31)})
    with pytest.raises(UserError, match=r"'final_logits_bias' has shape \(90,\)"):
        _convert_with(tiny_folder, {"final_logits_bias": torch.zeros(VOCAB)})
    extra = "model.decoder.layers.2.fc1.weight"  # a third decoder layer
    with pytest.raises(UserError, match=f"unexpected tensor '{extra}'.*decoder_layers=2"):
        _convert_with(tiny_folder, {extra: torch.zeros(64, 32)})
    with pytest.raises(UserError, match=r"unexpected tensor 'model.encoder.layernorm_embedding"):
        _convert_with(tiny_folder, {"model.encoder.layernorm_embedding.weight": torch.ones(32)})


def test_tied_copies_must_be_equal_and_tables_sinusoids(tiny_folder: HFFolder) -> None:
    head = torch.randn(VOCAB, 32)
    with pytest.raises(UserError, match=r"'model.shared.weight' differs from 'lm_head.weight'"):
        _convert_with(tiny_folder, {"lm_head.weight": head})
    table = "model.decoder.embed_positions.weight"
    interleaved = sinusoidal_encoding(POSITIONS, 32)  # the paper's layout is not Marian's
    with pytest.raises(UserError, match=f"'{table}' is not Marian's sinusoid table"):
        _convert_with(tiny_folder, {table: interleaved})
    with pytest.raises(UserError, match=rf"'{table}' has shape \(32, 32\)"):
        _convert_with(tiny_folder, {table: interleaved[:32]})


def test_generation_defaults(tmp_path: Path) -> None:
    hf = save(random_hf_marian(), tmp_path / "hf")
    generation = json.loads((hf.path / "generation_config.json").read_text())
    specials = marian_generation_defaults(read_hf_config(hf.path), generation)
    assert specials == Seq2SeqSpecials(decoder_start_id=89, eos_id=EOS, pad_id=89, forced_eos=True)
    opus = {  # an OPUS-MT generation_config.json
        "bad_words_ids": [[89]],
        "decoder_start_token_id": 89,
        "eos_token_id": 0,
        "forced_eos_token_id": 0,
        "max_length": 512,
        "num_beams": 4,
        "pad_token_id": 89,
        "renormalize_logits": True,
    }
    specials = marian_generation_defaults(read_hf_config(hf.path), opus)
    assert specials.banned_ids == (89,) and specials.renormalize_logits is True
    assert (specials.num_beams, specials.max_length) == (4, 512)
    assert specials.length_penalty is None and specials.early_stopping is None
    # config.json alone (older folders keep generation settings there)
    config = {**read_hf_config(hf.path), "num_beams": 6, "length_penalty": 0.6}
    specials = marian_generation_defaults(config)
    assert (specials.num_beams, specials.length_penalty, specials.decoder_start_id) == (6, 0.6, 89)


@pytest.mark.parametrize(
    ("generation", "message"),
    [
        ({"bad_words_ids": [[3, 4]]}, r"bad_words_ids entry \[3, 4\]"),
        ({"bad_words_ids": [[90]]}, r"bad_words_ids entry \[90\]"),
        ({"forced_eos_token_id": 5}, "forced_eos_token_id=5 differs"),
        ({"eos_token_id": [0, 2]}, r"eos_token_id=\[0, 2\]"),
        ({"decoder_start_token_id": 90}, "decoder_start_token_id=90"),
        ({"num_beams": 0}, "num_beams=0"),
        ({"early_stopping": "sometimes"}, "early_stopping='sometimes'"),
    ],
)
def test_generation_settings_refused_by_name(generation: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        marian_generation_defaults(MarianConfig(**TINY).to_dict(), generation)
