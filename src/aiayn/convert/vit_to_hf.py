"""aiayn's :class:`~aiayn.models.vit.ViT` -> a transformers folder, exactly: ``ViTModel`` (no
head) or ``ViTForImageClassification`` (its labels as ``id2label``), with the image
preprocessing as ``preprocessor_config.json``.

The name map of :mod:`aiayn.convert.vit` read backwards (:func:`~aiayn.convert.hf_export.
tensors_to_hf`): the fused [W^Q; W^K; W^V] split into ``query``, ``key``, ``value``, the body
under ``vit.`` in the classifier. A classifier with a pooler keeps it as ``vit.pooler.*``
(transformers' classifier ignores it; converting back restores it); a ViTModel without one is
read by transformers with a pooler drawn at random (its final states are exact).

Shape legend:  C channels   P patch size   D d_model   K labels
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from aiayn.convert.hf_export import encoder_fields_to_hf, label_maps, prefixed, tensors_to_hf
from aiayn.convert.hf_folder import write_hf_folder
from aiayn.convert.vit import HF_PREFIX, HF_TO_AIAYN
from aiayn.data.images import ImagePreprocessor
from aiayn.models.vit import ViT, ViTConfig


def vit_config_to_hf(config: ViTConfig) -> dict[str, Any]:
    """The ``config.json`` (a dict) of ViTModel or ViTForImageClassification for ``config``."""
    c = config
    hf: dict[str, Any] = {
        "architectures": ["ViTForImageClassification" if c.num_labels else "ViTModel"],
        "model_type": "vit",
        **encoder_fields_to_hf(c),
        "layer_norm_eps": c.layer_norm_eps,
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.num_channels,
        "qkv_bias": c.qkv_bias,
    }
    if c.num_labels:
        hf.update(label_maps(c.id2label, c.num_labels))
    return hf


def vit_state_to_hf(model: ViT) -> dict[str, Tensor]:
    """The model's tensors under the names its transformers class saves."""
    tensors = tensors_to_hf(model.state_dict(), HF_TO_AIAYN)
    if not model.config.num_labels:
        return tensors
    return prefixed(tensors, HF_PREFIX, ("classifier.",))


def vit_to_hf(
    model: ViT,
    out_dir: str | Path,
    preprocessor: ImagePreprocessor | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a transformers folder: ``config.json``, ``model.safetensors`` and
    ``preprocessor_config.json`` (when given). ``state`` holds nothing ViT needs."""
    out = write_hf_folder(Path(out_dir), vit_config_to_hf(model.config), vit_state_to_hf(model))
    if isinstance(preprocessor, ImagePreprocessor):
        preprocessor.save(out)
    return out
