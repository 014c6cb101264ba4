"""Hugging Face BERT checkpoints (``BertModel``, ``BertForMaskedLM``,
``BertForSequenceClassification``; ``BertForPreTraining`` as a masked LM) -> aiayn's
:class:`~aiayn.models.bert.BERT`, exactly.

:data:`HF_TO_AIAYN` is the whole name map, one row per tensor (a layer index written ``{}``),
named as in a ``BertModel`` folder: the task models keep the body under ``bert.``, which is
stripped, and their heads under ``cls.predictions.`` and ``classifier.``. Hugging Face keeps
W^Q, W^K and W^V of each attention (and their biases) as three ``nn.Linear``; aiayn's attention
holds them as the rows of one ``in_proj`` ([W^Q; W^K; W^V]), so the three are concatenated (the
``part`` column). Folders converted from the original TensorFlow release name LayerNorm's weight
and bias ``gamma`` and ``beta`` (:data:`LEGACY_NAMES`).

The head comes from ``architectures`` (:data:`ARCHITECTURES`), or, without it, from the tensors:
``classifier.*`` is a classifier, ``cls.predictions.*`` a masked LM, neither the bare encoder.
The pooler is converted when its tensors are there (a classifier needs it).

Every tensor of the checkpoint is used, checked, or ignored by name:

* checked: ``cls.predictions.decoder.weight`` must equal the word embeddings (the MLM output
  layer is tied to them) and ``cls.predictions.decoder.bias`` must equal
  ``cls.predictions.bias`` (one bias, two names in Hugging Face);
* ignored (:data:`IGNORED`): the ``position_ids``/``token_type_ids`` buffers of older folders,
  and ``cls.seq_relationship.*``, the next-sentence-prediction layer of pre-training
  (BertForPreTraining, and the Hub's ``bert-base-uncased``, labelled BertForMaskedLM, carry it):
  aiayn's BERT has no NSP head, so that layer is dropped and the rest converted.

An unexpected, missing or mis-shaped tensor is a :class:`~aiayn.errors.UserError` naming it, and
so is an option aiayn's BERT does not compute (:data:`UNSUPPORTED`, an activation outside
:data:`HF_ACTIVATIONS`, another task's architecture).

Shape legend:  V vocabulary   P positions   T token types   D hidden size   F intermediate size
C labels
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from aiayn.convert.checks import (
    HF_ACTIVATIONS,
    Rule,
    check_field_types,
    encoder_fields_from_hf,
    label_names,
    load_exactly,
    rename,
)
from aiayn.errors import UserError
from aiayn.models.bert import BERT, BertConfig


def _linear(hf: str, ours: str, part: int | None = None) -> dict[str, Rule]:
    return {f"{hf}.{p}": Rule(f"{ours}.{p}", part) for p in ("weight", "bias")}


_LAYER, _OURS = "encoder.layer.{}", "encoder.layers.{}"

HF_TO_AIAYN: dict[str, Rule] = {
    # Hugging Face name (without "bert.")         aiayn name                           HF shape
    "embeddings.word_embeddings.weight": Rule("encoder.embedder.embedding.weight"),  # (V, D)
    "embeddings.position_embeddings.weight": Rule("encoder.embedder.positional.weight"),  # (P, D)
    "embeddings.token_type_embeddings.weight": Rule("encoder.embedder.token_types.weight"),  # (T,D)
    **_linear("embeddings.LayerNorm", "encoder.embedder.norm"),  # (D,)
    **_linear(f"{_LAYER}.attention.self.query", f"{_OURS}.self_attn.in_proj", 0),  # (D, D), (D,)
    **_linear(f"{_LAYER}.attention.self.key", f"{_OURS}.self_attn.in_proj", 1),  # (D, D), (D,)
    **_linear(f"{_LAYER}.attention.self.value", f"{_OURS}.self_attn.in_proj", 2),  # (D, D), (D,)
    **_linear(f"{_LAYER}.attention.output.dense", f"{_OURS}.self_attn.out_proj"),  # (D, D), (D,)
    **_linear(f"{_LAYER}.attention.output.LayerNorm", f"{_OURS}.attn_sublayer.norm"),  # (D,)
    **_linear(f"{_LAYER}.intermediate.dense", f"{_OURS}.feed_forward.linear1"),  # (F, D), (F,)
    **_linear(f"{_LAYER}.output.dense", f"{_OURS}.feed_forward.linear2"),  # (D, F), (D,)
    **_linear(f"{_LAYER}.output.LayerNorm", f"{_OURS}.ff_sublayer.norm"),  # (D,)
    **_linear("pooler.dense", "pooler.dense"),  # (D, D), (D,)
    **_linear("cls.predictions.transform.dense", "mlm_head.transform"),  # (D, D), (D,)
    **_linear("cls.predictions.transform.LayerNorm", "mlm_head.norm"),  # (D,)
    "cls.predictions.bias": Rule("mlm_head.decoder.bias"),  # (V,)
    **_linear("classifier", "classifier.linear"),  # (C, D), (C,)
}
"""Hugging Face BERT tensor names -> aiayn's: the one place the two namings meet."""

HF_PREFIX = "bert."
"""The task models' prefix of the body's tensors (a BertModel folder has none)."""

EMBEDDING = "encoder.embedder.embedding.weight"
DECODER_WEIGHT = "mlm_head.decoder.weight"  # the word embeddings (tied)

COPIES: dict[str, str] = {
    "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",  # (V, D), tied
    "cls.predictions.decoder.bias": "cls.predictions.bias",  # (V,), the same parameter
}
"""Tensors a folder may store that must equal another one (Hugging Face's tied names)."""

IGNORED: frozenset[str] = frozenset(
    {
        "embeddings.position_ids",  # buffer: 0 .. P - 1
        "embeddings.token_type_ids",  # buffer: zeros
        "cls.seq_relationship.weight",  # (2, D), next-sentence prediction: no NSP head here
        "cls.seq_relationship.bias",  # (2,)
    }
)
"""Tensors dropped by name: index buffers, and the NSP layer of pre-training."""

LEGACY_NAMES: dict[str, str] = {
    "LayerNorm.gamma": "LayerNorm.weight",
    "LayerNorm.beta": "LayerNorm.bias",
}
"""The TensorFlow release's LayerNorm names (as Hugging Face's loader renames them)."""

ARCHITECTURES: dict[str, str] = {
    "BertModel": "none",
    "BertForMaskedLM": "mlm",
    "BertForPreTraining": "mlm",  # its NSP layer is dropped (IGNORED)
    "BertForSequenceClassification": "classification",
}
"""Hugging Face ``architectures`` -> the head of aiayn's BERT; any other is refused by name."""

UNSUPPORTED: dict[str, object] = {
    "is_decoder": True,  # causal self-attention (BertLMHeadModel)
    "add_cross_attention": True,  # an encoder–decoder BERT
}
"""Hugging Face options, with the value aiayn cannot compute, refused by name."""


HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "classifier_dropout": None,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "tie_word_embeddings": True,
}
"""transformers' ``BertConfig`` defaults: what a config.json leaving a key out means."""


def bert_config_from_hf(
    hf_config: Mapping[str, Any], tensor_names: Collection[str] | None = None
) -> BertConfig:
    """aiayn's config of a Hugging Face BERT ``config.json`` (a dict); options aiayn does not
    compute are refused by name.

    ``tensor_names`` (the checkpoint's) decide the head when ``architectures`` is absent, and
    whether there is a pooler; without them a masked LM has none and the other heads have one.
    """
    check_field_types(hf_config, HF_DEFAULTS)
    _check_supported(hf_config)
    hf = {**HF_DEFAULTS, **{k: v for k, v in hf_config.items() if k in HF_DEFAULTS}}
    names = None if tensor_names is None else {_body_name(n) for n in tensor_names}
    head = _head(hf_config, names)
    if head == "mlm" and hf["tie_word_embeddings"] is False:
        raise UserError(
            "tie_word_embeddings=False (an MLM decoder apart from the embeddings) is not supported"
        )
    pooled = head != "mlm" if names is None else "pooler.dense.weight" in names
    classifier_dropout = hf["classifier_dropout"]
    num_labels, id2label = _labels(hf_config)
    return BertConfig(
        vocab_size=hf["vocab_size"],
        max_len=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"],
        **encoder_fields_from_hf(hf),
        classifier_dropout=None if classifier_dropout is None else float(classifier_dropout),
        pad_id=0 if hf["pad_token_id"] is None else hf["pad_token_id"],  # None: [PAD], id 0
        head=head,
        num_labels=num_labels,
        id2label=id2label if head == "classification" else (),
        pooler=pooled or head == "classification",  # a classifier's missing pooler: named below
    )


def _check_supported(hf_config: Mapping[str, Any]) -> None:
    model_type = hf_config.get("model_type")
    if model_type != "bert":
        raise UserError(f"model_type {model_type!r} is not BERT ('bert')")
    for option, refused in UNSUPPORTED.items():
        if hf_config.get(option) == refused:
            raise UserError(f"{option}={refused} is not supported by aiayn's BERT")
    positions = hf_config.get("position_embedding_type", "absolute")
    if positions != "absolute":
        raise UserError(
            f"position_embedding_type {positions!r} is not supported (aiayn's BERT has "
            "'absolute' learned positions only)"
        )
    activation = hf_config.get("hidden_act", HF_DEFAULTS["hidden_act"])
    if not isinstance(activation, str) or activation not in HF_ACTIVATIONS:
        raise UserError(
            f"hidden_act {activation!r} is not supported (choose from {', '.join(HF_ACTIVATIONS)})"
        )


def _head(hf_config: Mapping[str, Any], names: set[str] | None) -> str:
    """The head ``architectures`` names, else the one the tensors hold."""
    architectures = hf_config.get("architectures") or []
    for architecture in architectures:
        if architecture not in ARCHITECTURES:
            raise UserError(
                f"architecture {architecture!r} is not supported (supported: "
                f"{', '.join(ARCHITECTURES)})"
            )
    heads = {ARCHITECTURES[a] for a in architectures}
    if len(heads) > 1:
        raise UserError(f"architectures {list(architectures)} ask for different heads")
    if heads:
        return heads.pop()
    if names is not None and any(n.startswith("classifier.") for n in names):
        return "classification"
    if names is not None and any(n.startswith("cls.predictions.") for n in names):
        return "mlm"
    return "none"


def _labels(hf_config: Mapping[str, Any]) -> tuple[int, tuple[str, ...]]:
    """C and the labels' names: ``id2label`` (what transformers writes), else ``num_labels``
    unnamed labels (class indices), else 2."""
    if hf_config.get("id2label"):
        names = label_names(hf_config)
        return len(names), names
    value = hf_config.get("num_labels", 2)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"num_labels={value!r} is not a number of labels")
    return value, ()


def _body_name(hf_name: str) -> str:
    """A checkpoint name as in :data:`HF_TO_AIAYN`: without ``bert.``, gamma/beta renamed."""
    name = hf_name.removeprefix(HF_PREFIX)
    for old, new in LEGACY_NAMES.items():
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def _rename(name: str) -> Rule | None:
    """``name``'s rule in :data:`HF_TO_AIAYN` with its layer index filled in, or None."""
    return rename(name, HF_TO_AIAYN)


class Named(NamedTuple):
    """A checkpoint tensor and its name in the checkpoint (for messages)."""

    hf_name: str
    tensor: Tensor


def _by_body_name(hf_tensors: Mapping[str, Tensor]) -> dict[str, Named]:
    """The checkpoint's tensors under their :data:`HF_TO_AIAYN` names, ignored ones dropped."""
    body: dict[str, Named] = {}
    for hf_name, tensor in hf_tensors.items():
        name = _body_name(hf_name)
        if name in IGNORED:
            continue
        if name in body:
            raise UserError(
                f"tensor {hf_name!r} is in the checkpoint twice (as {body[name].hf_name!r})"
            )
        body[name] = Named(hf_name, tensor)
    return body


def _fold_copies(body: dict[str, Named]) -> dict[str, Named]:
    """Drop the tied names of :data:`COPIES`, each checked equal to its original (or standing
    in for it when the original is not stored)."""
    body = dict(body)
    for copy, original in COPIES.items():
        stored = body.pop(copy, None)
        if stored is None:
            continue
        kept = body.get(original)
        if kept is None:
            body[original] = stored
        elif not _equal(stored.tensor, kept.tensor):
            raise UserError(
                f"{stored.hf_name} differs from {kept.hf_name}: aiayn's BERT ties them (one tensor)"
            )
    return body


def _equal(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


QKV = ("query", "key", "value")


def _fuse(name: str, blocks: dict[int, Named]) -> Tensor:
    """W^Q, W^K, W^V (or their biases) -> the rows of ``in_proj``: 3 × (D, D) -> (3D, D)."""
    some = next(iter(blocks.values())).hf_name
    for part in range(3):
        if part not in blocks:
            missing = re.sub(r"\.(query|key|value)\.", f".{QKV[part]}.", some)
            raise UserError(f"missing tensor {missing!r} (of the attention that goes to {name!r})")
    query = blocks[0]
    for other in (blocks[1], blocks[2]):
        if other.tensor.shape != query.tensor.shape:
            raise UserError(
                f"tensor {other.hf_name!r} has shape {tuple(other.tensor.shape)}; "
                f"{query.hf_name!r} has {tuple(query.tensor.shape)}"
            )
    return torch.cat([blocks[0].tensor, blocks[1].tensor, blocks[2].tensor])  # (3D, D) | (3D,)


def bert_state_dict_from_hf(hf_tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face BERT tensors -> aiayn's names, q/k/v fused (tied copies checked and
    dropped, :data:`IGNORED` ones dropped).

    Raises:
        UserError: naming a tensor that is not part of a BERT model, a tied copy that differs,
            or a missing or mis-shaped part of a q/k/v triple.
    """
    state: dict[str, Tensor] = {}
    parts: dict[str, dict[int, Named]] = {}
    for name, named in _fold_copies(_by_body_name(hf_tensors)).items():
        rule = _rename(name)
        if rule is None:
            raise UserError(f"unexpected tensor {named.hf_name!r}: not part of a BERT model")
        if rule.part is None:
            state[rule.name] = named.tensor
        else:
            parts.setdefault(rule.name, {})[rule.part] = named
    for name, blocks in parts.items():
        state[name] = _fuse(name, blocks)
    return state


def _hf_name(name: str) -> str:
    """aiayn's ``name`` -> the Hugging Face name(s) it comes from (q/k/v written
    ``{query,key,value}``), for messages."""
    pattern = re.sub(r"\.\d+\.", ".{}.", name, count=1)
    index = re.search(r"\.(\d+)\.", name)
    sources = sorted(
        (rule.part or 0, hf) for hf, rule in HF_TO_AIAYN.items() if rule.name == pattern
    )
    if not sources:
        return name
    hf = sources[0][1]
    if len(sources) == 3:
        hf = hf.replace(".query.", ".{query,key,value}.")
    return hf if index is None else hf.replace("{}", index.group(1), 1)


def _hf_shape(name: str, shape: torch.Size) -> tuple[int, ...]:
    """A fused in_proj's shape as each of its three Hugging Face tensors has it."""
    if ".in_proj." in name:
        return (shape[0] // 3, *shape[1:])
    return tuple(shape)


def load_bert_state(model: BERT, state: dict[str, Tensor]) -> None:
    """Load converted tensors into ``model``: every parameter from the checkpoint, nothing left
    over, shapes as the config says; the MLM output layer re-tied to the word embeddings.

    Raises:
        UserError: naming (in Hugging Face's terms) a missing, extra or mis-shaped tensor.
    """
    if model.mlm_head is not None and EMBEDDING in state:
        state = {**state, DECODER_WEIGHT: state[EMBEDDING]}
    c = model.config
    load_exactly(
        model,
        state,
        name=lambda key: repr(_hf_name(key)),
        shape=_hf_shape,
        extra_hint=f"the config (num_hidden_layers={c.num_layers}, head {c.head!r}, pooler "
        f"{c.pooler}) has no place for it",
    )
    if model.mlm_head is not None:  # assigned one by one, the two names hold two Parameters
        model.mlm_head.decoder.weight = model.encoder.embedder.embedding.weight


def bert_from_hf_tensors(
    hf_config: Mapping[str, Any], hf_tensors: Mapping[str, Tensor]
) -> tuple[BERT, int]:
    """A BERT (eval mode, fp32) from a config dict and its tensors; also the number of
    (aiayn) tensors mapped. The head and the pooler follow the folder (module docstring)."""
    config = bert_config_from_hf(hf_config, hf_tensors.keys())
    with torch.device("meta"):  # no random draws or memory for weights the checkpoint gives
        model = BERT(config)
    state = {k: t.float().contiguous() for k, t in bert_state_dict_from_hf(hf_tensors).items()}
    load_bert_state(model, state)
    return model.eval(), len(state)
