"""aiayn -> transformers, for every family that converts back, both ways round:

* aiayn -> transformers -> aiayn gives the very tensors (``torch.equal``) and the same config;
* transformers -> aiayn -> transformers gives the same weight names as ``save_pretrained``
  (nothing new, nothing dropped), loads with no missing or unexpected key, and equal outputs.

Every parameter is drawn at random (norm gains ~ N(1, 0.2), the rest ~ N(0, 0.3)), tiny configs.
The paper's own model goes out as MarianMTModel (post-norm; its interleaved sinusoids by a change
of basis) or PegasusForConditionalGeneration (pre-norm).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch import Tensor, nn
from transformers import (
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    MarianConfig,
    MarianMTModel,
    PegasusConfig,
    PegasusForConditionalGeneration,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
)

from aiayn.config import TransformerConfig
from aiayn.convert import from_hf, to_hf
from aiayn.convert.residual_basis import from_halves, halves_permutation, to_halves
from aiayn.errors import UserError
from aiayn.layers import sinusoidal_encoding
from aiayn.models import Transformer
from aiayn.models.bert import BERT
from aiayn.models.bert import BertConfig as AiaynBertConfig
from aiayn.models.t5 import T5
from aiayn.models.t5 import T5Config as AiaynT5Config
from aiayn.models.vit import ViT
from aiayn.models.vit import ViTConfig as AiaynViTConfig

TOLERANCE = 1e-4


def redraw(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter drawn at random (LayerNorm gains around 1), in eval mode; Hugging Face's
    fixed sinusoid tables left as they are."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if not p.requires_grad:
                    continue  # a frozen sinusoid table
                gain = name == "weight" and "norm" in type(module).__name__.lower()
                p.copy_(torch.randn(p.shape, generator=g) * (0.2 if gain else 0.3) + gain)
    return model.eval()


def saved_names(folder: Path) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def assert_same_tensors(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different


def there_and_back(model: nn.Module, tmp_path: Path) -> tuple[Path, nn.Module]:
    """aiayn -> transformers folder -> aiayn."""
    out = to_hf(model, tmp_path / "hf")
    return out, from_hf(out).model


def back_and_forth(hf: Any, tmp_path: Path, auto: Any) -> tuple[Path, Path, nn.Module, Any]:
    """transformers (saved) -> aiayn -> transformers folder, loaded with ``auto``; asserts the
    weight names are save_pretrained's and every key loads."""
    original = tmp_path / "original"
    hf.save_pretrained(original)
    converted = from_hf(original)
    model = converted.model
    state = {} if converted.generation is None else {"generation": asdict(converted.generation)}
    out = to_hf(model, tmp_path / "again", None, state)
    again, info = auto.from_pretrained(out, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert sorted(again.state_dict()) == sorted(hf.state_dict())  # no new or dropped weights
    return original, out, model, again.eval()


def gap(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max())


# ---------------------------------------------------------------------- the paper's model


def paper_model(seed: int = 0, **changes: Any) -> Transformer:
    config = TransformerConfig(
        **{
            "vocab_size": 120,
            "d_model": 16,
            "d_ff": 32,
            "num_heads": 2,
            "num_encoder_layers": 2,
            "num_decoder_layers": 3,
            "max_len": 48,
            "dropout": 0.0,
            **changes,
        }
    )
    model = redraw(Transformer(config), seed)
    assert isinstance(model, Transformer)
    return model


def seq2seq_batch(vocab: int, pad: int, eos: int, start: int) -> tuple[Tensor, Tensor]:
    """(3, 9) sources of 9, 5, 2 tokens (EOS last), right padded; (3, 6) decoder inputs."""
    g = torch.Generator().manual_seed(1)
    src = torch.full((3, 9), pad)
    for row, length in enumerate((9, 5, 2)):
        src[row, : length - 1] = torch.randint(4, vocab - 1, (length - 1,), generator=g)
        src[row, length - 1] = eos
    tgt = torch.randint(4, vocab - 1, (3, 6), generator=g)
    tgt[:, 0] = start
    return src, tgt


@torch.no_grad()
def hf_seq2seq_log_probs(hf: Any, src: Tensor, tgt: Tensor, pad: int) -> Tensor:
    mask = (src != pad).long()
    return torch.log_softmax(
        hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits, -1
    )


PAPER_VARIANTS: dict[str, dict[str, Any]] = {
    "post-norm": {},
    "post-norm-untied": {"tie_output": False},
    "post-norm-two-vocabularies": {"share_embeddings": False, "tgt_vocab_size": 90},
    "post-norm-halves-gelu-bias": {
        "positional": "sinusoidal-halves",
        "activation": "gelu",
        "output_bias": True,
    },
    "pre-norm": {"norm_first": True},
    "pre-norm-untied-silu": {"norm_first": True, "tie_output": False, "activation": "silu"},
}


@pytest.mark.parametrize("changes", list(PAPER_VARIANTS.values()), ids=list(PAPER_VARIANTS))
def test_the_paper_s_model_goes_out_and_back(changes: dict[str, Any], tmp_path: Path) -> None:
    model = paper_model(**changes)
    if model.config.output_bias:
        with torch.no_grad():
            model.output_proj.bias.normal_(0, 0.3)
    out, back = there_and_back(model, tmp_path)
    assert_same_tensors(model, back)
    assert isinstance(back, Transformer) and back.config.positional == model.config.positional
    assert back.config.norm_first == model.config.norm_first
    assert back.config.output_bias == model.config.output_bias
    hf, info = AutoModelForSeq2SeqLM.from_pretrained(out, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    expected = PegasusForConditionalGeneration if model.config.norm_first else MarianMTModel
    assert type(hf) is expected
    src, tgt = seq2seq_batch(model.config.target_vocab_size, pad=0, eos=2, start=1)
    with torch.no_grad():
        ours = model(src, tgt)
    assert gap(ours, hf_seq2seq_log_probs(hf.eval(), src, tgt, 0)) < TOLERANCE


def test_a_wrong_basis_breaks_the_parity(tmp_path: Path) -> None:
    """The check can fail: the interleaved model written without its permutation is another
    function."""
    model = paper_model()
    halves = Transformer(model.config.replace(positional="sinusoidal-halves")).eval()
    halves.load_state_dict(model.state_dict())
    hf = AutoModelForSeq2SeqLM.from_pretrained(to_hf(halves, tmp_path / "hf")).eval()
    src, tgt = seq2seq_batch(model.config.vocab_size, pad=0, eos=2, start=1)
    with torch.no_grad():
        assert gap(model(src, tgt), hf_seq2seq_log_probs(hf, src, tgt, 0)) > 0.01


def test_the_permutation_maps_the_paper_s_table_onto_marian_s() -> None:
    assert halves_permutation(6).tolist() == [0, 2, 4, 1, 3, 5]
    assert halves_permutation(5).tolist() == [0, 2, 4, 1, 3]
    for d_model in (6, 7, 16):
        pi = halves_permutation(d_model)
        interleaved = sinusoidal_encoding(10, d_model)
        assert torch.equal(interleaved[:, pi], sinusoidal_encoding(10, d_model, layout="halves"))
    state = paper_model().state_dict()
    assert all(torch.equal(a, state[k]) for k, a in from_halves(to_halves(state, 16), 16).items())


def marian_hf(**changes: Any) -> MarianMTModel:
    config = MarianConfig(
        vocab_size=90,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=40,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=89,
        decoder_start_token_id=89,
        eos_token_id=0,
        forced_eos_token_id=0,
        **changes,
    )
    model = redraw(MarianMTModel(config))
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.3)
    return model


@pytest.mark.parametrize(
    "changes",
    [{}, {"tie_word_embeddings": False}, {"share_encoder_decoder_embeddings": False}],
    ids=["tied", "untied", "two-vocabularies"],
)
def test_marian_goes_in_and_out(changes: dict[str, Any], tmp_path: Path) -> None:
    hf = marian_hf(**changes)
    _, out, _, again = back_and_forth(hf, tmp_path, AutoModelForSeq2SeqLM)
    src, tgt = seq2seq_batch(90, pad=89, eos=0, start=89)
    assert (
        gap(hf_seq2seq_log_probs(hf, src, tgt, 89), hf_seq2seq_log_probs(again, src, tgt, 89))
        < 1e-6
    )
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["decoder_start_token_id"] == 89 and generation["forced_eos_token_id"] == 0


def test_pegasus_goes_in_and_out(tmp_path: Path) -> None:
    config = PegasusConfig(
        vocab_size=80,
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=40,
        scale_embedding=True,
        activation_function="relu",
    )
    hf = redraw(PegasusForConditionalGeneration(config))
    _, _, model, again = back_and_forth(hf, tmp_path, AutoModelForSeq2SeqLM)
    assert isinstance(model, Transformer) and model.config.norm_first
    src, tgt = seq2seq_batch(80, pad=0, eos=1, start=0)
    theirs = hf_seq2seq_log_probs(hf, src, tgt, 0)
    with torch.no_grad():
        assert gap(model(src, tgt), theirs) < TOLERANCE
    assert gap(theirs, hf_seq2seq_log_probs(again, src, tgt, 0)) < 1e-6


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"positional": "learned"}, "positional='learned' has no transformers"),
        ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06 is not supported"),
        (
            {"norm_first": True, "share_embeddings": False, "tgt_vocab_size": 90},
            "a pre-norm model with separate source and target embeddings",
        ),
    ],
)
def test_what_no_transformers_class_computes_is_refused(
    changes: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match=message):
        to_hf(paper_model(**changes), tmp_path / "hf")


# ---------------------------------------------------------------------- T5

T5_TINY: dict[str, Any] = {
    "vocab_size": 70,
    "d_model": 16,
    "d_kv": 6,
    "d_ff": 32,
    "num_layers": 2,
    "num_decoder_layers": 1,
    "num_heads": 2,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 12,
    "decoder_start_token_id": 0,
}
T5_STYLES: dict[str, dict[str, Any]] = {
    "v1.0": {"feed_forward_proj": "relu"},
    "v1.1": {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
}


def t5_hf(style: str) -> T5ForConditionalGeneration:
    values = {**T5_TINY, **T5_STYLES[style]}
    config = T5Config(**values)
    if values.get("tie_word_embeddings") is False:  # transformers 5 ties unless told after init
        config.tie_word_embeddings = False
    model = T5ForConditionalGeneration(config)
    model.encoder.set_input_embeddings(model.shared)
    model.decoder.set_input_embeddings(model.shared)
    return redraw(model)


@pytest.mark.parametrize("style", list(T5_STYLES))
def test_t5_goes_in_and_out(style: str, tmp_path: Path) -> None:
    hf = t5_hf(style)
    _, _, model, again = back_and_forth(hf, tmp_path, AutoModelForSeq2SeqLM)
    assert isinstance(model, T5)
    src, tgt = seq2seq_batch(70, pad=0, eos=1, start=0)
    theirs = hf_seq2seq_log_probs(hf, src, tgt, 0)
    assert gap(theirs, hf_seq2seq_log_probs(again, src, tgt, 0)) < 1e-6
    with torch.no_grad():
        assert gap(model(src, tgt), theirs) < TOLERANCE


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"gated": True, "activation": "gelu_tanh", "tie_output": False, "scale_output": False},
        {"gated": True, "activation": "gelu", "tie_output": False, "scale_output": False},
        {"gated": True, "activation": "relu"},
    ],
    ids=["v1.0", "v1.1", "gated-exact-gelu", "gated-relu"],
)
def test_t5_goes_out_and_back(changes: dict[str, Any], tmp_path: Path) -> None:
    config = AiaynT5Config(
        vocab_size=70, d_model=16, d_kv=6, d_ff=32, num_heads=2, num_encoder_layers=2,
        num_decoder_layers=1, num_buckets=8, max_distance=12, dropout=0.0, **changes,
    )  # fmt: skip
    model = redraw(T5(config))
    out, back = there_and_back(model, tmp_path)
    assert_same_tensors(model, back)
    assert isinstance(back, T5) and back.config == config
    hf = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    src, tgt = seq2seq_batch(70, pad=0, eos=1, start=0)
    with torch.no_grad():
        assert gap(model(src, tgt), hf_seq2seq_log_probs(hf, src, tgt, 0)) < TOLERANCE


# ---------------------------------------------------------------------- BERT

BERT_TINY: dict[str, Any] = {
    "vocab_size": 60,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 24,
}
BERT_CLASSES: dict[str, tuple[type[nn.Module], Any]] = {
    "BertModel": (BertModel, AutoModel),
    "BertForMaskedLM": (BertForMaskedLM, AutoModelForMaskedLM),
    "BertForSequenceClassification": (
        BertForSequenceClassification,
        AutoModelForSequenceClassification,
    ),
}


def bert_batch() -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 60, (3, 11), generator=g)
    types, mask = torch.zeros_like(tokens), torch.zeros_like(tokens)
    for row, length in enumerate((11, 6, 1)):
        tokens[row, length:] = 0
        types[row, length // 2 : length] = 1
        mask[row, :length] = 1
    return tokens, types, mask


@torch.no_grad()
def bert_outputs(hf: Any) -> Tensor:
    tokens, types, mask = bert_batch()
    out = hf(input_ids=tokens, token_type_ids=types, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("architecture", list(BERT_CLASSES))
def test_bert_goes_in_and_out(architecture: str, tmp_path: Path) -> None:
    cls, auto = BERT_CLASSES[architecture]
    labels = {"id2label": {0: "neg", 1: "neutral", 2: "pos"}}
    hf = redraw(cls(BertConfig(**BERT_TINY, **labels)))
    _, _, model, again = back_and_forth(hf, tmp_path, auto)
    assert isinstance(model, BERT)
    assert gap(bert_outputs(hf), bert_outputs(again)) < 1e-6
    if architecture == "BertForSequenceClassification":
        assert again.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}


@pytest.mark.parametrize(
    "changes",
    [
        {"head": "none"},
        {"head": "mlm", "pooler": False},
        {"head": "mlm", "pooler": True},
        {"head": "classification", "num_labels": 3, "id2label": ("a", "b", "c")},
        {"head": "classification", "num_labels": 4},
    ],
    ids=["model", "mlm", "mlm-with-pooler", "classifier", "unnamed-labels"],
)
def test_bert_goes_out_and_back(changes: dict[str, Any], tmp_path: Path) -> None:
    config = AiaynBertConfig(
        vocab_size=60, max_len=24, d_model=16, num_heads=2, num_layers=2, d_ff=32, **changes
    )
    model = redraw(BERT(config))
    out, back = there_and_back(model, tmp_path)
    assert_same_tensors(model, back)
    assert back.config == config
    auto = {"none": AutoModel, "mlm": AutoModelForMaskedLM}.get(
        config.head, AutoModelForSequenceClassification
    )
    hf = auto.from_pretrained(out).eval()
    tokens, types, mask = bert_batch()
    with torch.no_grad():
        hidden = model(tokens, types, mask).hidden
        if config.head == "classification":
            mine = model.classify(tokens, types, mask)
        else:
            mine = model.mlm_logits(hidden) if config.head == "mlm" else hidden
    theirs = bert_outputs(hf)
    real = mask.bool() if theirs.dim() == 3 else slice(None)
    assert gap(mine[real], theirs[real]) < TOLERANCE


# ---------------------------------------------------------------------- ViT

VIT_TINY: dict[str, Any] = {
    "image_size": 16,
    "patch_size": 8,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}


@torch.no_grad()
def vit_outputs(hf: Any, pixels: Tensor) -> Tensor:
    out = hf(pixel_values=pixels)
    return out.logits if hasattr(out, "logits") else out.pooler_output


@pytest.mark.parametrize("classifier", [False, True], ids=["ViTModel", "classifier"])
def test_vit_goes_in_and_out(classifier: bool, tmp_path: Path) -> None:
    labels = {"id2label": {0: "cat", 1: "dog"}}
    cls, auto = (
        (ViTForImageClassification, AutoModelForImageClassification)
        if classifier
        else (ViTModel, AutoModel)
    )
    hf = redraw(cls(ViTConfig(**VIT_TINY, **labels)))
    _, _, model, again = back_and_forth(hf, tmp_path, auto)
    assert isinstance(model, ViT)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    assert gap(vit_outputs(hf, pixels), vit_outputs(again, pixels)) < 1e-6


@pytest.mark.parametrize(
    "changes",
    [{}, {"pooler": False, "num_labels": 3, "id2label": ("x", "y", "z")}, {"qkv_bias": False}],
    ids=["ViTModel", "classifier", "no-qkv-bias"],
)
def test_vit_goes_out_and_back(changes: dict[str, Any], tmp_path: Path) -> None:
    config = AiaynViTConfig(
        image_size=16, patch_size=8, d_model=16, num_heads=2, num_layers=2, d_ff=32, **changes
    )
    model = redraw(ViT(config))
    out, back = there_and_back(model, tmp_path)
    assert_same_tensors(model, back)
    assert back.config == config
    auto = AutoModelForImageClassification if config.num_labels else AutoModel
    hf = auto.from_pretrained(out).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(pixels)
    mine = ours.logits if config.num_labels else ours.pooled
    assert gap(mine, vit_outputs(hf, pixels)) < TOLERANCE


def test_every_family_with_an_exporter_is_tested() -> None:
    """The families that convert back are those this file covers (the registry's to_hf)."""
    from aiayn.models.families import FAMILIES

    exported = {name for name, f in FAMILIES.items() if f.to_hf is not None}
    assert exported == {"transformer", "gpt2", "t5", "bert", "vit"}
