"""Hugging Face ViT checkpoints (``ViTModel``, ``ViTForImageClassification``) -> aiayn's
:class:`~aiayn.models.vit.ViT`, exactly.

:data:`HF_TO_AIAYN` is the whole name map, one row per tensor (a layer index written ``{}``), under
the names the folders store (the Hub's, which transformers 5 still writes: it renames them only
in memory). A ``ViTForImageClassification`` folder keeps the body under ``vit.`` and the head as
``classifier.*``; a ``ViTModel`` folder has no prefix and, unless it was saved without one, the
pooler. Hugging Face keeps W^Q, W^K and W^V as three matrices ``query``, ``key``, ``value``;
aiayn's attention holds them as the rows of one ``in_proj`` ([W^Q; W^K; W^V]), so the three are
concatenated (the ``part`` column).

Every tensor of the checkpoint is used or ignored by name (:data:`IGNORED`: the mask token of
masked-image-modelling folders, which classification never reads): an unexpected, missing or
mis-shaped tensor is a :class:`~aiayn.errors.UserError` naming it, and so is an option aiayn's
ViT does not compute. ``encoder_stride`` (the masked-image-modelling decoder's) and the
training-only keys are ignored.

Shape legend:  C channels   P patch size   N patches   D d_model   F d_ff   K labels
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.convert.checks import (
    HF_ACTIVATIONS,
    Rule,
    check_field_types,
    encoder_fields_from_hf,
    fuse_parts,
    label_names,
    load_exactly,
    place_all,
)
from aiayn.data.images import PREPROCESSOR_CONFIG, ImagePreprocessor
from aiayn.errors import UserError
from aiayn.models.vit import ViT, ViTConfig


def _query_key_value(hf: str, ours: str) -> dict[str, Rule]:
    rules = {}
    for part, name in enumerate(("query", "key", "value")):
        rules[f"{hf}.{name}.weight"] = Rule(f"{ours}.in_proj.weight", part)  # (D, D)
        rules[f"{hf}.{name}.bias"] = Rule(f"{ours}.in_proj.bias", part)  # (D,)
    return rules


def _linear(hf: str, ours: str) -> dict[str, Rule]:
    return {f"{hf}.weight": Rule(f"{ours}.weight"), f"{hf}.bias": Rule(f"{ours}.bias")}


HF_TO_AIAYN: dict[str, Rule] = {
    # Hugging Face name (without "vit.")                  aiayn name                  HF shape
    "embeddings.cls_token": Rule("embedder.class_token"),  # (1, 1, D)
    "embeddings.position_embeddings": Rule("embedder.positions"),  # (1, 1 + N, D)
    **_linear("embeddings.patch_embeddings.projection", "embedder.projection"),  # (D, C, P, P)
    **_linear("encoder.layer.{}.layernorm_before", "layers.{}.attn_sublayer.norm"),  # (D,)
    **_query_key_value("encoder.layer.{}.attention.attention", "layers.{}.self_attn"),
    **_linear("encoder.layer.{}.attention.output.dense", "layers.{}.self_attn.out_proj"),  # (D, D)
    **_linear("encoder.layer.{}.layernorm_after", "layers.{}.ff_sublayer.norm"),  # (D,)
    **_linear("encoder.layer.{}.intermediate.dense", "layers.{}.feed_forward.linear1"),  # (F, D)
    **_linear("encoder.layer.{}.output.dense", "layers.{}.feed_forward.linear2"),  # (D, F)
    **_linear("layernorm", "final_norm"),  # (D,)
    **_linear("pooler.dense", "pooler"),  # (D, D)
    **_linear("classifier", "classifier"),  # (K, D); ViTForImageClassification, unprefixed
}
"""Hugging Face ViT tensor names -> aiayn's: the one place the two namings meet."""

HF_PREFIX = "vit."
"""ViTForImageClassification's prefix of the body's tensors (a ViTModel folder has none)."""

IGNORED = frozenset({"embeddings.mask_token"})
"""The mask token of masked image modelling (``use_mask_token``): never used to classify."""

SUPPORTED_ARCHITECTURES = ("ViTModel", "ViTForImageClassification")


HF_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "layer_norm_eps": 1e-12,
    "image_size": 224,
    "patch_size": 16,
    "num_channels": 3,
    "qkv_bias": True,
    "pooler_output_size": None,
    "pooler_act": "tanh",
}
"""transformers' ``ViTConfig`` defaults: what a config.json leaving a key out means."""


def vit_config_from_hf(hf_config: Mapping[str, Any]) -> ViTConfig:
    """aiayn's config of a Hugging Face ViT ``config.json`` (a dict); options aiayn does not
    compute are refused by name.

    Whether there is a pooler and a head is read from ``architectures`` here (a ViTModel has a
    pooler, a ViTForImageClassification a head of ``len(id2label)`` labels);
    :func:`vit_from_hf_tensors` then follows the tensors, as transformers does.
    """
    check_field_types(hf_config, HF_DEFAULTS, skip=("image_size", "patch_size"))  # int or pair
    _check_supported(hf_config)
    hf = {**HF_DEFAULTS, **{k: v for k, v in hf_config.items() if k in HF_DEFAULTS}}
    classifier = "ViTForImageClassification" in hf_config.get("architectures", [])
    labels = label_names(hf_config) if classifier else ()
    return ViTConfig(
        image_size=_side(hf, "image_size"),
        patch_size=_side(hf, "patch_size"),
        num_channels=hf["num_channels"],
        **encoder_fields_from_hf(hf),
        qkv_bias=bool(hf["qkv_bias"]),
        pooler=not classifier,
        num_labels=len(labels),
        id2label=labels,
    )


def _check_supported(hf_config: Mapping[str, Any]) -> None:
    if hf_config.get("model_type") != "vit":
        raise UserError(f"model_type {hf_config.get('model_type')!r} is not ViT ('vit')")
    for architecture in hf_config.get("architectures") or []:
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UserError(
                f"architecture {architecture!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)})"
            )
    activation = hf_config.get("hidden_act", HF_DEFAULTS["hidden_act"])
    if activation not in HF_ACTIVATIONS:
        raise UserError(
            f"hidden_act {activation!r} is not supported (choose from {', '.join(HF_ACTIVATIONS)})"
        )
    if hf_config.get("pooler_act", "tanh") != "tanh":
        raise UserError(f"pooler_act {hf_config['pooler_act']!r} is not supported (only 'tanh')")
    width = hf_config.get("hidden_size", HF_DEFAULTS["hidden_size"])
    pooler_size = hf_config.get("pooler_output_size")
    if pooler_size not in (None, width):
        raise UserError(f"pooler_output_size={pooler_size} is not supported (only hidden_size)")
    heads = hf_config.get("num_attention_heads", HF_DEFAULTS["num_attention_heads"])
    head_dim = hf_config.get("head_dim")
    if head_dim is not None and head_dim * heads != width:
        raise UserError(f"head_dim={head_dim} is not supported (only hidden_size / heads)")


def _side(hf: Mapping[str, Any], key: str) -> int:
    """A square size: ``224`` or ``[224, 224]``; a rectangle is refused by name."""
    value = hf[key]
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise UserError(f"{key}={list(value)} is not supported (only square sizes)")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"{key}={value!r} is not a size in pixels")
    return value


def _unprefixed(hf_tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The tensors without ViTForImageClassification's ``vit.`` prefix (a name present both
    with and without it is refused)."""
    tensors: dict[str, Tensor] = {}
    for hf_name, tensor in hf_tensors.items():
        name = hf_name.removeprefix(HF_PREFIX)
        if name.startswith("classifier.") and name != hf_name:
            name = hf_name  # "vit.classifier.*" is no head: refused below by its own name
        if name in tensors:
            raise UserError(f"tensor {name!r} is stored twice (with and without {HF_PREFIX!r})")
        tensors[name] = tensor
    return tensors


def vit_state_dict_from_hf(hf_tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face ViT tensors -> aiayn's names, q/k/v fused, ignored ones dropped.

    Raises:
        UserError: naming a tensor that is not part of a ViT model, or a q/k/v part missing.
    """
    tensors = _unprefixed(hf_tensors)
    kept = ((name, tensor) for name, tensor in tensors.items() if name not in IGNORED)
    state, parts = place_all(kept, HF_TO_AIAYN, "a ViT model")
    state.update(fuse_parts(parts, ("query", "key", "value")))
    return state


def load_vit_state(model: ViT, state: Mapping[str, Tensor]) -> None:
    """Load converted tensors into ``model``: every parameter from the checkpoint, nothing left
    over, shapes as the config says.

    Raises:
        UserError: naming a missing, extra or mis-shaped tensor (in aiayn's terms).
    """
    load_exactly(model, state, name=lambda key: f"for {key!r}")


def _follow_tensors(
    config: ViTConfig, hf_config: Mapping[str, Any], state: Mapping[str, Tensor]
) -> ViTConfig:
    """The config with the pooler and the head the tensors hold (transformers builds them from
    the class, not the config): ``classifier.weight``'s rows are the labels, named by
    ``id2label``, which must then name as many."""
    head = state.get("classifier.weight")
    num_labels = 0 if head is None else int(head.shape[0])
    labels = label_names(hf_config) if num_labels and "id2label" in hf_config else ()
    if labels and len(labels) != num_labels:
        raise UserError(
            f"id2label names {len(labels)} labels, but classifier.weight has {num_labels} rows"
        )
    return config.replace(pooler="pooler.weight" in state, num_labels=num_labels, id2label=labels)


def vit_from_hf_tensors(
    hf_config: Mapping[str, Any], hf_tensors: Mapping[str, Tensor]
) -> tuple[ViT, int]:
    """A ViT (eval mode, fp32) from a ``ViTModel`` or ``ViTForImageClassification`` config dict
    and its tensors; also the number of aiayn tensors filled (q/k/v fused into one)."""
    state = {k: t.float().contiguous() for k, t in vit_state_dict_from_hf(hf_tensors).items()}
    config = _follow_tensors(vit_config_from_hf(hf_config), hf_config, state)
    with torch.device("meta"):  # no random draws or memory for weights the checkpoint gives
        model = ViT(config)
    load_vit_state(model, state)
    return model.eval(), len(state)


def vit_preprocessor_from_hf(folder: Path) -> ImagePreprocessor | None:
    """The image preprocessing of a Hugging Face ViT folder (``preprocessor_config.json``), or
    None when it has none."""
    has = (folder / PREPROCESSOR_CONFIG).is_file()
    return ImagePreprocessor.from_folder(folder) if has else None
