"""The pure parts of the way back, with hand-checked values: a name table read backwards, the
generation settings written and read back, T5's feed_forward_proj, Marian's shared table."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
import torch

from aiayn.config import TransformerConfig
from aiayn.convert.generation import Seq2SeqSpecials, generation_defaults
from aiayn.convert.hf_export import generation_config_to_hf, label_maps, prefixed, tensors_to_hf
from aiayn.convert.t5_to_hf import feed_forward_proj
from aiayn.convert.transformer_to_hf import shares_a_table
from aiayn.errors import UserError
from aiayn.models.t5 import T5Config


def test_a_table_read_backwards_splits_fused_projections() -> None:
    table = {
        "h.{}.q.weight": ("layers.{}.in_proj.weight", 0),
        "h.{}.k.weight": ("layers.{}.in_proj.weight", 1),
        "h.{}.v.weight": ("layers.{}.in_proj.weight", 2),
        "h.{}.o.weight": ("layers.{}.out_proj.weight", None),
        "emb": ("embedding", None),
        "emb_copy": ("embedding", None),
    }
    fused = torch.arange(12.0).reshape(6, 2)  # rows 0-1 W^Q, 2-3 W^K, 4-5 W^V
    state = {"layers.3.in_proj.weight": fused, "layers.3.out_proj.weight": torch.ones(2, 2)}
    state["embedding"] = torch.zeros(1)
    out = tensors_to_hf(state, table, skip={"emb_copy"})
    assert sorted(out) == ["emb", "h.3.k.weight", "h.3.o.weight", "h.3.q.weight", "h.3.v.weight"]
    assert out["h.3.q.weight"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert out["h.3.k.weight"].tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert out["h.3.v.weight"].tolist() == [[8.0, 9.0], [10.0, 11.0]]
    out["h.3.q.weight"].add_(1)  # a copy, not a view of the model's tensor
    assert fused[0, 0] == 0
    with pytest.raises(KeyError, match="nowhere has no Hugging Face name"):
        tensors_to_hf({"nowhere": torch.zeros(1)}, table)


def test_prefixes_and_labels() -> None:
    tensors = {"encoder.x": torch.zeros(1), "classifier.weight": torch.zeros(1)}
    assert sorted(prefixed(tensors, "bert.", ("classifier.",))) == [
        "bert.encoder.x",
        "classifier.weight",
    ]
    assert label_maps(("no", "yes"), 2) == {
        "id2label": {"0": "no", "1": "yes"},
        "label2id": {"no": 0, "yes": 1},
    }
    assert label_maps((), 5) == {"num_labels": 5}


SPECIALS = [
    Seq2SeqSpecials(decoder_start_id=58, eos_id=0, pad_id=58),
    Seq2SeqSpecials(
        decoder_start_id=1,
        eos_id=2,
        pad_id=0,
        banned_ids=(0, 1),
        num_beams=4,
        max_length=64,
        length_penalty=0.6,
        early_stopping=True,
    ),
    Seq2SeqSpecials(
        decoder_start_id=0,
        eos_id=1,
        pad_id=0,
        banned_ids=(5,),
        forced_eos=True,
        early_stopping="never",
        renormalize_logits=True,
    ),
]


@pytest.mark.parametrize("specials", SPECIALS)
def test_generation_settings_are_read_back_as_written(specials: Seq2SeqSpecials) -> None:
    written = generation_config_to_hf(asdict(specials))
    assert written["decoder_start_token_id"] == specials.decoder_start_id
    assert ("forced_eos_token_id" in written) == specials.forced_eos
    config: dict[str, Any] = {"forced_eos_token_id": None}  # the exporters write it so
    read = generation_defaults(config, written, target_vocab=100, id_defaults={})
    assert read == specials


def test_generation_settings_without_ids_are_refused() -> None:
    with pytest.raises(UserError, match="generation settings lack 'eos_id'"):
        generation_config_to_hf({"decoder_start_id": 0, "pad_id": 0})


@pytest.mark.parametrize(
    ("gated", "activation", "expected"),
    [
        (False, "relu", "relu"),
        (False, "gelu", "gelu"),
        (False, "gelu_tanh", "gelu_new"),
        (True, "gelu_tanh", "gated-gelu"),  # transformers reads it as the tanh GELU
        (True, "gelu", "gated-gelu_python"),
        (True, "relu", "gated-relu"),
        (True, "silu", "gated-silu"),
    ],
)
def test_t5_feed_forward_proj(gated: bool, activation: str, expected: str) -> None:
    assert feed_forward_proj(T5Config(gated=gated, activation=activation)) == expected


@pytest.mark.parametrize(
    ("changes", "shared"),
    [
        ({}, True),
        ({"tie_output": False}, True),
        ({"share_embeddings": False}, False),
        ({"share_embeddings": False, "tie_output": False}, True),
        ({"share_embeddings": False, "tie_output": False, "tgt_vocab_size": 50}, False),
    ],
)
def test_marian_s_shared_table(changes: dict[str, Any], shared: bool) -> None:
    assert shares_a_table(TransformerConfig(vocab_size=100, **changes)) is shared
