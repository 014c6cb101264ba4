"""aiayn's BERT: the published sizes' parameter counts (against Hugging Face's own models built from
the same config on the meta device), config validation, padding, the heads, and a checkpoint
round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import BertConfig as HFBertConfig
from transformers import BertForMaskedLM, BertForSequenceClassification, BertModel

from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.errors import ConfigError
from aiayn.models import BERT, BertConfig, bert_preset, count_parameters, expected_bert_parameters
from aiayn.models.families import family_of

PUBLISHED = {"bert-base-uncased": 109_482_240, "bert-large-uncased": 335_141_888}
"""Hugging Face's BertModel (with the pooler) of the two released sizes."""

TOKENIZER = (
    Path(__file__).parents[1] / "checkpoint" / "fixtures" / "format1_tied" / "tokenizer.json"
)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name: str) -> None:
    config = bert_preset(name)
    assert expected_bert_parameters(config) == PUBLISHED[name]
    with torch.device("meta"):
        assert count_parameters(BERT(config)) == PUBLISHED[name]


HF_CLASSES = {
    "none": BertModel,
    "mlm": BertForMaskedLM,
    "classification": BertForSequenceClassification,
}


@pytest.mark.parametrize("head", sorted(HF_CLASSES))
def test_counts_match_hugging_face_for_every_head(head: str) -> None:
    """bert-base-uncased's shape with each head, counted by transformers (tied MLM decoder)."""
    config = bert_preset("bert-base-uncased", head=head, pooler=head != "mlm", num_labels=3)
    with torch.device("meta"):
        hf = HF_CLASSES[head](HFBertConfig(num_labels=3))
        ours = BERT(config)
    assert sum(p.numel() for p in hf.parameters()) == expected_bert_parameters(config)
    assert count_parameters(ours) == expected_bert_parameters(config)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"d_model": 30}, "d_model=30 must be divisible by num_heads=4"),
        ({"type_vocab_size": 0}, "type_vocab_size must be >= 1"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"head": "nsp"}, "head must be one of"),
        ({"head": "classification", "pooler": False}, "needs pooler=True"),
        ({"classifier_dropout": 1.0}, r"classifier_dropout must be in \[0, 1\)"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps must be finite and > 0"),
        ({"pad_id": 1000}, "pad_id=1000 is outside"),
        ({"num_labels": 0}, "num_labels must be >= 1"),
        ({"pooler": "yes"}, "pooler has the wrong type"),
        ({"colour": 1}, "unknown model config key"),
    ],
)
def test_bad_values_refused_by_name(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        bert_preset("bert-tiny", **change)


def test_config_round_trip_and_family() -> None:
    config = bert_preset("bert-large-uncased", head="classification", num_labels=5)
    assert BertConfig.from_dict(config.to_dict()) == config
    with torch.device("meta"):
        assert family_of(BERT(config)).name == "bert"


def _tiny(head: str = "mlm") -> BERT:
    torch.manual_seed(0)
    return BERT(bert_preset("bert-tiny", head=head, num_labels=3)).eval()


@torch.no_grad()
def test_padding_does_not_change_real_positions_and_empty_rows_stay_finite() -> None:
    model = _tiny()
    tokens = torch.randint(1, 1000, (2, 6))
    types = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    alone = model(tokens, types).hidden
    padded = torch.cat([tokens, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    padded_types = torch.cat([types, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(2, 6), torch.zeros(2, 3)], dim=1).long()
    out = model(padded, padded_types, mask)
    torch.testing.assert_close(out.hidden[:, :6], alone, atol=1e-5, rtol=0)
    empty = model(padded, padded_types, torch.zeros_like(mask))
    assert empty.hidden.isfinite().all() and model.mlm_logits(empty.hidden).isfinite().all()


@torch.no_grad()
def test_heads_shapes_and_tied_decoder() -> None:
    model = _tiny("mlm")
    tokens = torch.randint(1, 1000, (2, 5))
    out = model(tokens, need_weights=True)
    assert out.pooled is not None and out.pooled.shape == (2, 64)
    assert (
        out.weights is not None and len(out.weights) == 2 and out.weights[0].shape == (2, 4, 5, 5)
    )
    assert model.mlm_logits(out.hidden).shape == (2, 5, 1000)
    assert model.mlm_head is not None
    assert model.mlm_head.decoder.weight is model.encoder.embedder.embedding.weight
    with pytest.raises(ValueError, match="no classifier"):
        model.classify(tokens)
    classifier = _tiny("classification")
    assert classifier.classify(tokens).shape == (2, 3)
    with pytest.raises(ValueError, match="no masked-LM head"):
        classifier.mlm_logits(out.hidden)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        classifier(tokens, attention_mask=torch.ones(2, 4))


@torch.no_grad()
def test_a_bert_checkpoint_round_trips(tmp_path: Path) -> None:
    model = _tiny("mlm")
    save_checkpoint(tmp_path / "ck", model, {"step": 1}, TOKENIZER)
    loaded = load_checkpoint(tmp_path / "ck", expect=BERT).model
    assert isinstance(loaded, BERT) and loaded.config == model.config
    assert loaded.mlm_head is not None
    assert loaded.mlm_head.decoder.weight is loaded.encoder.embedder.embedding.weight
    tokens = torch.randint(1, 1000, (2, 5))
    torch.testing.assert_close(
        loaded.mlm_logits(loaded(tokens).hidden), model.mlm_logits(model(tokens).hidden)
    )
