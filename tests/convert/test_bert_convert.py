"""Hugging Face BERT -> aiayn's BERT: equal final states, pooled states, masked-LM logits and
classifier logits on a padded batch with token types, for BertModel, BertForMaskedLM,
BertForSequenceClassification and BertForPreTraining with every parameter drawn at random;
every tensor accounted for; unsupported options refused by name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import BertConfig as HFBertConfig
from transformers import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)

from aiayn.convert import from_hf
from aiayn.convert.bert import bert_config_from_hf, bert_from_hf_tensors
from aiayn.convert.hf_folder import read_hf_config, read_hf_weights
from aiayn.errors import UserError
from aiayn.models.bert import BERT

TOLERANCE = 1e-4
VOCAB = 100
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "num_labels": 3,
}
HF_CLASSES: dict[str, type[nn.Module]] = {
    "BertModel": BertModel,
    "BertForMaskedLM": BertForMaskedLM,
    "BertForSequenceClassification": BertForSequenceClassification,
    "BertForPreTraining": BertForPreTraining,
}


def random_hf_bert(architecture: str, seed: int = 0, **config: Any) -> Any:
    """A tiny Hugging Face BERT with every tensor redrawn: norms ~ N(1, 0.2), everything else
    ~ N(0, 0.3) (Hugging Face's own init sets norms to 1 and biases to 0, which would hide a
    norm or bias mapped to the wrong place)."""
    torch.manual_seed(seed)
    model = HF_CLASSES[architecture](HFBertConfig(**{**TINY, **config}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.2) if "LayerNorm" in name else p.normal_(0.0, 0.3)
    return model.eval()


def save(hf: Any, folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    hf.save_pretrained(folder)
    return read_hf_config(folder), read_hf_weights(folder)


def convert(hf: Any, folder: Path) -> BERT:
    return bert_from_hf_tensors(*save(hf, folder))[0]


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(4, 13) ids right-padded (with 0) to lengths 13, 6, 1, 9; segment ids 0 then 1 within
    each real span; the (4, 13) attention mask."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (4, 13), generator=g)
    types = torch.zeros(4, 13, dtype=torch.long)
    mask = torch.zeros(4, 13, dtype=torch.long)
    for row, length in enumerate((13, 6, 1, 9)):
        tokens[row, length:] = 0
        types[row, length // 2 : length] = 1
        mask[row, :length] = 1
    return tokens, types, mask


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@torch.no_grad()
def test_bert_model_states_and_pooler_equal_hugging_face(tmp_path: Path) -> None:
    hf = random_hf_bert("BertModel")
    model = convert(hf, tmp_path / "hf")
    assert model.config.head == "none" and model.config.pooler
    tokens, types, mask = batch()
    expected = hf(input_ids=tokens, token_type_ids=types, attention_mask=mask)
    out = model(tokens, types, mask)
    real = mask.bool()
    assert max_diff(out.hidden[real], expected.last_hidden_state[real]) < TOLERANCE
    assert out.pooled is not None
    assert max_diff(out.pooled, expected.pooler_output) < TOLERANCE


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertForPreTraining"])
@torch.no_grad()
def test_masked_lm_logits_equal_hugging_face(architecture: str, tmp_path: Path) -> None:
    """The MLM head (and, from BertForPreTraining, the pooler; its NSP layer is dropped)."""
    hf = random_hf_bert(architecture)
    model = convert(hf, tmp_path / "hf")
    assert model.config.head == "mlm" and model.config.pooler == (architecture != "BertForMaskedLM")
    tokens, types, mask = batch()
    expected = hf(input_ids=tokens, token_type_ids=types, attention_mask=mask)
    logits = expected.logits if architecture == "BertForMaskedLM" else expected.prediction_logits
    out = model(tokens, types, mask)
    real = mask.bool()
    assert max_diff(model.mlm_logits(out.hidden)[real], logits[real]) < TOLERANCE
    if architecture == "BertForPreTraining":
        assert out.pooled is not None
        assert max_diff(out.pooled, hf.bert(tokens, mask, types).pooler_output) < TOLERANCE


@torch.no_grad()
def test_classifier_logits_equal_hugging_face_through_from_hf(tmp_path: Path) -> None:
    """The whole path of ``aiayn convert``: the folder, FROM_HF["bert"], no tokenizer yet."""
    hf = random_hf_bert("BertForSequenceClassification")
    hf.save_pretrained(tmp_path / "hf")
    converted = from_hf(tmp_path / "hf")
    model = converted.model
    assert isinstance(model, BERT) and converted.tokenizer is None
    assert model.config.head == "classification" and model.config.num_labels == 3
    assert model.config.id2label == ("LABEL_0", "LABEL_1", "LABEL_2")  # transformers' names
    tokens, types, mask = batch()
    expected = hf(input_ids=tokens, token_type_ids=types, attention_mask=mask).logits
    assert max_diff(model.classify(tokens, types, mask), expected) < TOLERANCE


def test_label_names_are_kept_in_index_order(tmp_path: Path) -> None:
    labels = {"0": "negative", "2": "positive", "1": "neutral"}
    hf = random_hf_bert("BertForSequenceClassification", id2label=labels)
    hf.save_pretrained(tmp_path / "hf")
    config = from_hf(tmp_path / "hf").model.config
    assert config.id2label == ("negative", "neutral", "positive") and config.num_labels == 3
    masked = random_hf_bert("BertForMaskedLM", id2label=labels)  # labels without a classifier
    masked.save_pretrained(tmp_path / "mlm")
    assert from_hf(tmp_path / "mlm").model.config.id2label == ()


def test_config_mapping_and_head_from_tensors(tmp_path: Path) -> None:
    config, tensors = save(random_hf_bert("BertForMaskedLM"), tmp_path / "hf")
    ours = bert_config_from_hf(config, tensors.keys())
    assert (ours.d_model, ours.num_heads, ours.num_layers, ours.d_ff) == (32, 4, 2, 64)
    assert (ours.max_len, ours.type_vocab_size, ours.activation) == (64, 2, "gelu")
    assert (ours.layer_norm_eps, ours.head, ours.pooler) == (1e-12, "mlm", False)
    no_architectures = {k: v for k, v in config.items() if k != "architectures"}
    assert bert_config_from_hf(no_architectures, tensors.keys()).head == "mlm"
    assert bert_config_from_hf(no_architectures, ["classifier.weight"]).head == "classification"
    assert bert_config_from_hf(no_architectures, ["pooler.dense.weight"]).head == "none"
    assert bert_config_from_hf({**config, "hidden_act": "gelu_new"}).activation == "gelu_tanh"


BASE: dict[str, Any] = {"model_type": "bert", **TINY}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
        ({"is_decoder": True}, "is_decoder=True is not supported"),
        ({"add_cross_attention": True}, "add_cross_attention=True is not supported"),
        ({"hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
        ({"model_type": "roberta"}, "model_type 'roberta' is not BERT"),
        ({"architectures": ["BertForTokenClassification"]}, "'BertForTokenClassification'"),
        (
            {"architectures": ["BertForMaskedLM"], "tie_word_embeddings": False},
            "tie_word_embeddings=False",
        ),
    ],
)
def test_unsupported_options_refused_by_name(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        bert_config_from_hf({**BASE, **change})


@pytest.fixture
def mlm_folder(tmp_path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return save(random_hf_bert("BertForMaskedLM"), tmp_path / "hf")


L0, L1 = "bert.encoder.layer.0.", "bert.encoder.layer.1."
EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
EDITS: dict[str, tuple[dict[str, torch.Tensor | None], str]] = {
    # what the edit does: (tensors replaced, added, or removed (None)), the message
    "missing_qkv_part": (
        {L1 + "attention.self.key.bias": None},
        f"missing tensor '{L1}attention.self.key.bias'",
    ),
    "missing": (
        {L1 + "output.LayerNorm.weight": None},
        "missing tensor 'encoder.layer.1.output.LayerNorm.weight'",
    ),
    "missing_head": (
        {"cls.predictions.transform.dense.bias": None},
        "missing tensor 'cls.predictions.transform.dense.bias'",
    ),
    "half_a_pooler": (
        {"bert.pooler.dense.weight": torch.zeros(32, 32)},
        "missing tensor 'pooler.dense.bias'",
    ),
    "unknown": (
        {L0 + "attention.self.gate.weight": torch.zeros(1)},
        f"unexpected tensor '{L0}attention.self.gate.weight': not part of a BERT model",
    ),
    "deeper": (
        {"bert.encoder.layer.2.output.dense.bias": torch.zeros(32)},
        "'encoder.layer.2.output.dense.bias': the config (num_hidden_layers=2",
    ),
    "misshaped": (
        {"bert.embeddings.LayerNorm.bias": torch.zeros(31)},
        "'embeddings.LayerNorm.bias' has shape (31,); the config says (32,)",
    ),
    "misshaped_qkv_part": (
        {L0 + "attention.self.value.weight": torch.zeros(32, 31)},
        f"'{L0}attention.self.value.weight' has shape (32, 31)",
    ),
    "untied_decoder": (
        {"cls.predictions.decoder.weight": torch.zeros(VOCAB, 32)},
        f"cls.predictions.decoder.weight differs from {EMBEDDINGS}",
    ),
    "twice": (
        {"embeddings.word_embeddings.weight": torch.zeros(VOCAB, 32)},
        "'embeddings.word_embeddings.weight' is in the checkpoint twice",
    ),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_missing_extra_and_misshaped_tensors_refused_by_name(mlm_folder: Any, edit: str) -> None:
    config, tensors = mlm_folder
    changes, message = EDITS[edit]
    edited = {k: v for k, v in tensors.items() if changes.get(k, v) is not None}
    edited |= {k: v for k, v in changes.items() if v is not None}
    with pytest.raises(UserError, match=re.escape(message)):
        bert_from_hf_tensors(config, edited)


def test_a_classifier_without_pooler_is_refused(tmp_path: Path) -> None:
    config, tensors = save(random_hf_bert("BertForSequenceClassification"), tmp_path / "hf")
    no_pooler = {k: v for k, v in tensors.items() if not k.startswith("bert.pooler.")}
    with pytest.raises(UserError, match=r"missing tensor 'pooler\.dense\.bias'"):
        bert_from_hf_tensors(config, no_pooler)


@torch.no_grad()
def test_old_checkpoint_names_and_copies_are_read(mlm_folder: Any) -> None:
    """The TensorFlow release's gamma/beta names, the index buffers, the stored tied decoder
    weight and bias, and an NSP layer: converted to the same model."""
    config, tensors = mlm_folder
    legacy = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}
    old = {
        re.sub(r"\.LayerNorm\.(weight|bias)$", lambda m: legacy[m[0]], k): v
        for k, v in tensors.items()
    }
    assert sum(k.endswith(".LayerNorm.gamma") for k in old) == 6  # embeddings, 2 per layer, head
    old |= {
        "bert.embeddings.position_ids": torch.arange(64)[None],
        "bert.embeddings.token_type_ids": torch.zeros(1, 64, dtype=torch.long),
        "cls.predictions.decoder.weight": tensors["bert.embeddings.word_embeddings.weight"].clone(),
        "cls.predictions.decoder.bias": tensors["cls.predictions.bias"].clone(),
        "cls.seq_relationship.weight": torch.zeros(2, 32),
        "cls.seq_relationship.bias": torch.zeros(2),
    }
    new_model, mapped = bert_from_hf_tensors(config, tensors)
    old_model, old_mapped = bert_from_hf_tensors(config, old)
    assert mapped == old_mapped
    tokens, types, mask = batch()
    expected = new_model.mlm_logits(new_model(tokens, types, mask).hidden)
    torch.testing.assert_close(
        old_model.mlm_logits(old_model(tokens, types, mask).hidden), expected
    )
    differs = {**old, "cls.predictions.decoder.bias": tensors["cls.predictions.bias"] + 1}
    with pytest.raises(UserError, match=r"cls\.predictions\.decoder\.bias differs"):
        bert_from_hf_tensors(config, differs)
