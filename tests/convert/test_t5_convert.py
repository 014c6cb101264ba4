"""Hugging Face T5 -> aiayn's T5: equal encoder outputs and log-probabilities (full pass and step
by step) for v1.0 (ReLU, tied, scaled output) and v1.1 (gated GELU, untied) models with every
parameter drawn at random; every tensor accounted for; unsupported options refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import T5Config as HFT5Config
from transformers import T5ForConditionalGeneration

from aiayn.convert.hf_folder import read_hf_config, read_hf_weights
from aiayn.convert.t5 import t5_config_from_hf, t5_from_hf_tensors
from aiayn.decoding.fast_step import InferenceStep
from aiayn.decoding.step import encoder_decoder_step
from aiayn.errors import UserError
from aiayn.inference import pack_for_inference
from aiayn.models.t5 import T5

TOLERANCE = 1e-4
VOCAB = 80
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "d_kv": 12,  # H·d_kv = 48 ≠ d_model
    "d_ff": 64,
    "num_layers": 2,
    "num_decoder_layers": 3,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 12,  # short sentences reach the logarithmic buckets
    "decoder_start_token_id": 0,
}
STYLES = {
    "v1.0": {"feed_forward_proj": "relu"},
    "v1.1": {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
}


def random_hf_t5(style: str, seed: int = 0, **config: Any) -> T5ForConditionalGeneration:
    """A tiny T5ForConditionalGeneration of ``style`` with every tensor ~ N(0, 0.3) (Hugging
    Face's own init sets norms to 1, which would hide a norm mapped to the wrong place)."""
    torch.manual_seed(seed)
    values = {**TINY, **STYLES[style], **config}
    hf_config = HFT5Config(**values)
    if values.get("tie_word_embeddings") is False:  # transformers 5 ties unless told after init
        hf_config.tie_word_embeddings = False
    model = T5ForConditionalGeneration(hf_config)
    model.encoder.set_input_embeddings(model.shared)  # v1.1: inputs share, the head does not
    model.decoder.set_input_embeddings(model.shared)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


def save_and_convert(hf: T5ForConditionalGeneration, folder: Path) -> T5:
    hf.save_pretrained(folder)
    model, _ = t5_from_hf_tensors(read_hf_config(folder), read_hf_weights(folder))
    return model


def padded_sources(seed: int = 1) -> torch.Tensor:
    """(4, 19) source ids (no pad inside), right padded with 0 to lengths 19, 5, 1, 12."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, VOCAB, (4, 19), generator=g)
    for row, length in enumerate((19, 5, 1, 12)):
        src[row, length:] = 0
    return src


def targets(seed: int = 2) -> torch.Tensor:
    """(4, 15) decoder inputs starting with the start token (pad, 0)."""
    g = torch.Generator().manual_seed(seed)
    tgt = torch.randint(1, VOCAB, (4, 15), generator=g)
    tgt[:, 0] = 0
    return tgt


@pytest.fixture(params=sorted(STYLES))
def converted(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, T5]:
    hf = random_hf_t5(request.param)
    return hf, save_and_convert(hf, tmp_path / "hf")


@torch.no_grad()
def test_encoder_and_log_probs_equal_hugging_face(converted: tuple[Any, T5]) -> None:
    hf, model = converted
    src, tgt = padded_sources(), targets()
    real = src != 0
    hf_memory = hf.encoder(input_ids=src, attention_mask=real.long()).last_hidden_state
    memory = model.encode(src).memory
    assert (hf_memory - memory)[real].abs().max() < TOLERANCE
    hf_logits = hf(input_ids=src, attention_mask=real.long(), decoder_input_ids=tgt).logits
    expected = torch.log_softmax(hf_logits, dim=-1)
    assert (model(src, tgt) - expected).abs().max() < TOLERANCE


@torch.no_grad()
def test_incremental_steps_equal_full_pass(converted: tuple[Any, T5]) -> None:
    """Each step's log-probs (the bias row of the new position only) equal Hugging Face's
    teacher-forced log-probs at that position."""
    hf, model = converted
    src, tgt = padded_sources(), targets()
    hf_logits = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt).logits
    expected = torch.log_softmax(hf_logits, dim=-1)  # (B, T, V)
    step, state = encoder_decoder_step(model, src, banned=())
    for t in range(tgt.size(1)):
        log_probs, state = step(tgt[:, t : t + 1], state)
        assert (log_probs - expected[:, t]).abs().max() < TOLERANCE, t


def test_config_mapping() -> None:
    v10 = t5_config_from_hf({"model_type": "t5", **TINY, **STYLES["v1.0"]})
    assert (v10.gated, v10.activation, v10.tie_output, v10.scale_output) == (
        False,
        "relu",
        True,
        True,
    )
    v11 = t5_config_from_hf({"model_type": "t5", **TINY, **STYLES["v1.1"]})
    assert (v11.gated, v11.activation, v11.tie_output, v11.scale_output) == (
        True,
        "gelu_tanh",
        False,
        False,
    )
    assert v11.num_encoder_layers == 2 and v11.num_decoder_layers == 3 and v11.d_kv == 12


@pytest.mark.parametrize(
    "change, message",
    [
        ({"feed_forward_proj": "gated-tanh"}, "feed_forward_proj 'gated-tanh'"),
        ({"feed_forward_proj": "double-gelu"}, "feed_forward_proj 'double-gelu'"),
        ({"model_type": "bart"}, "model_type 'bart' is not T5"),
    ],
)
def test_unsupported_options_refused_by_name(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        t5_config_from_hf({"model_type": "t5", **TINY, **change})


def _tensors(tmp_path: Path, style: str = "v1.0") -> tuple[dict[str, Any], dict[str, Any]]:
    folder = tmp_path / "hf"
    random_hf_t5(style).save_pretrained(folder)
    return read_hf_config(folder), read_hf_weights(folder)


def test_missing_extra_and_misshaped_tensors_refused(tmp_path: Path) -> None:
    config, tensors = _tensors(tmp_path)
    missing = dict(tensors)
    del missing["encoder.block.1.layer.0.SelfAttention.k.weight"]
    with pytest.raises(UserError, match="missing tensor 'k'"):
        t5_from_hf_tensors(config, missing)
    no_norm = {k: v for k, v in tensors.items() if k != "decoder.final_layer_norm.weight"}
    with pytest.raises(UserError, match=r"missing tensor for 'decoder\.final_norm\.weight'"):
        t5_from_hf_tensors(config, no_norm)
    extra = {**tensors, "encoder.block.0.layer.0.SelfAttention.x.weight": torch.zeros(1)}
    with pytest.raises(UserError, match=r"unexpected tensor 'encoder\.block\.0\.layer\.0"):
        t5_from_hf_tensors(config, extra)
    deeper = {**tensors, "encoder.block.7.layer.1.layer_norm.weight": torch.zeros(32)}
    with pytest.raises(UserError, match="config has no place"):
        t5_from_hf_tensors(config, deeper)
    wrong = {**tensors, "encoder.final_layer_norm.weight": torch.zeros(31)}
    with pytest.raises(UserError, match=r"shape \(31,\)"):
        t5_from_hf_tensors(config, wrong)


def test_old_checkpoint_extras_are_checked_or_ignored(tmp_path: Path) -> None:
    """Older folders store the stacks' copies of the shared embedding (checked equal) and an
    unused cross-attention position bias (ignored)."""
    config, tensors = _tensors(tmp_path)
    shared = tensors["shared.weight"]
    old = {
        **tensors,
        "encoder.embed_tokens.weight": shared.clone(),
        "decoder.embed_tokens.weight": shared.clone(),
        "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": torch.zeros(8, 4),
    }
    model, _ = t5_from_hf_tensors(config, old)
    assert model.decoder.embedder.embedding is model.encoder.embedder.embedding
    assert model.output_proj.weight is model.encoder.embedder.embedding.weight
    differs = {**old, "decoder.embed_tokens.weight": shared + 1}
    with pytest.raises(UserError, match=r"decoder\.embed_tokens\.weight differs"):
        t5_from_hf_tensors(config, differs)


def test_safetensors_round_trip_of_untied_head(tmp_path: Path) -> None:
    """A v1.1 folder keeps lm_head.weight apart from shared.weight: converted untied."""
    config, tensors = _tensors(tmp_path, "v1.1")
    assert not torch.equal(tensors["lm_head.weight"], tensors["shared.weight"])
    model, _ = t5_from_hf_tensors(config, tensors)
    assert not model.config.tie_output and model.output_scale == 1.0
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "again.safetensors")
    again = load_file(tmp_path / "again.safetensors")
    assert torch.equal(
        t5_from_hf_tensors(config, again)[0].output_proj.weight, tensors["lm_head.weight"]
    )


@pytest.mark.parametrize("packed", [False, True], ids=["modules", "packed"])
@torch.no_grad()
def test_fast_step_equals_hugging_face(converted: tuple[Any, T5], packed: bool) -> None:
    """aiayn's flattened step (RMSNorm, scale 1, the bias table, gated FFN, output scale) on the
    converted model, with two beams per sentence, against Hugging Face's teacher-forced pass."""
    hf, model = converted
    src, tgt = padded_sources(), targets()
    hf_logits = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt).logits
    expected = torch.log_softmax(hf_logits, dim=-1).repeat_interleave(2, dim=0)  # (2B, T, V)
    step = InferenceStep(pack_for_inference(model) if packed else model, banned=())
    state = step.initial_state(src, capacity=4).repeat_interleave(2)  # grows past 4 positions
    for t in range(tgt.size(1)):
        log_probs, state = step(tgt.repeat_interleave(2, dim=0)[:, t : t + 1], state)
        assert (log_probs - expected[:, t]).abs().max() < TOLERANCE, t
