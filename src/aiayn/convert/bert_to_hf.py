"""aiayn's :class:`~aiayn.models.bert.BERT` -> a transformers folder, exactly: ``BertModel``
(no head), ``BertForMaskedLM`` (``head="mlm"``) or ``BertForSequenceClassification``
(``head="classification"``, its labels as ``id2label``).

The name map of :mod:`aiayn.convert.bert` read backwards (:func:`~aiayn.convert.hf_export.
tensors_to_hf`): the fused [W^Q; W^K; W^V] split into ``query``, ``key``, ``value``, the body
under ``bert.`` in the task models. The masked LM's output layer is the word embeddings (not
stored, as transformers saves it). Two combinations have no transformers class of their own: a
masked LM with a pooler keeps its pooler as ``bert.pooler.*`` (transformers' masked LM ignores
it; converting back restores it), and a bare encoder without a pooler is a ``BertModel`` whose
pooler transformers draws at random (its final states are exact). The tokenizer
(``tokenizer.json``: the whole pipeline) goes with a ``tokenizer_config.json`` naming its
special tokens and settings.

Shape legend:  V vocabulary   D hidden size   C labels
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from aiayn.convert.bert import DECODER_WEIGHT, HF_PREFIX, HF_TO_AIAYN
from aiayn.convert.hf_export import (
    copy_tokenizer_files,
    encoder_fields_to_hf,
    label_maps,
    prefixed,
    tensors_to_hf,
    write_json,
)
from aiayn.convert.hf_folder import TOKENIZER_CONFIG, write_hf_folder
from aiayn.data.bert_tokenizer import MANIFEST, BertTokenizer
from aiayn.models.bert import BERT, BertConfig

ARCHITECTURE = {
    "none": "BertModel",
    "mlm": "BertForMaskedLM",
    "classification": "BertForSequenceClassification",
}
"""aiayn's head -> the transformers class."""

HEADS = ("cls.", "classifier.")
"""The task models' tensors outside the ``bert.`` body."""


def bert_config_to_hf(config: BertConfig) -> dict[str, Any]:
    """The ``config.json`` (a dict) of the transformers class of ``config``'s head."""
    c = config
    hf: dict[str, Any] = {
        "architectures": [ARCHITECTURE[c.head]],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        **encoder_fields_to_hf(c),
        "classifier_dropout": c.classifier_dropout,
        "max_position_embeddings": c.max_len,
        "type_vocab_size": c.type_vocab_size,
        "layer_norm_eps": c.layer_norm_eps,
        "pad_token_id": c.pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }
    if c.head == "classification":
        hf.update(label_maps(c.id2label, c.num_labels))
    return hf


def bert_state_to_hf(model: BERT) -> dict[str, Tensor]:
    """The model's tensors under the names its transformers class saves."""
    state = {k: v for k, v in model.state_dict().items() if k != DECODER_WEIGHT}  # tied
    tensors = tensors_to_hf(state, HF_TO_AIAYN)
    if model.config.head == "none":
        return tensors
    return prefixed(tensors, HF_PREFIX, HEADS)


def bert_to_hf(
    model: BERT,
    out_dir: str | Path,
    tokenizer: BertTokenizer | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a transformers folder: ``config.json``, ``model.safetensors`` and the
    tokenizer. ``state`` (the checkpoint's) holds nothing BERT needs."""
    out = write_hf_folder(Path(out_dir), bert_config_to_hf(model.config), bert_state_to_hf(model))
    if isinstance(tokenizer, BertTokenizer):
        write_bert_tokenizer(tokenizer, out)
    return out


def write_bert_tokenizer(tokenizer: BertTokenizer, out: Path) -> None:
    """``tokenizer.json`` and a ``tokenizer_config.json`` with its special tokens and settings
    (what ``transformers.BertTokenizer`` reads)."""
    manifest = copy_tokenizer_files(tokenizer, out, MANIFEST)
    keys = ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token")
    settings = ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length")
    config: dict[str, Any] = {"tokenizer_class": "BertTokenizer"}
    config.update({k: manifest[k] for k in (*keys, *settings) if manifest.get(k) is not None})
    if manifest.get("additional_special_tokens"):
        config["additional_special_tokens"] = manifest["additional_special_tokens"]
    config["clean_up_tokenization_spaces"] = bool(manifest["clean_up_tokenization_spaces"])
    write_json(out, TOKENIZER_CONFIG, config)
