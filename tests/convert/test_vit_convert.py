"""Hugging Face ViT -> aiayn's ViT: equal final states, pooler outputs, logits and attention
weights for ViTModel and ViTForImageClassification with every parameter drawn at random, at the
trained image size and at interpolated ones; every tensor accounted for; unsupported options
refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import PreTrainedModel, ViTForImageClassification, ViTModel
from transformers import ViTConfig as HFViTConfig

from aiayn.convert.hf_folder import read_hf_config, read_hf_weights
from aiayn.convert.vit import vit_config_from_hf, vit_from_hf_tensors
from aiayn.errors import UserError
from aiayn.models.vit import ViT

TOLERANCE = 1e-4
TINY: dict[str, Any] = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "num_labels": 5,
}
SIZES = [(32, 32), (48, 48), (40, 24)]  # trained, interpolated, interpolated to a rectangle
KINDS = ["model", "model-no-pooler", "classifier", "classifier-no-qkv-bias"]


def random_hf_vit(kind: str, seed: int = 0) -> PreTrainedModel:
    """A tiny HF ViT of ``kind`` (eager attention) with norm gains ~ N(1, 0.2) and every other
    tensor ~ N(0, 0.3): Hugging Face's init (unit gains, zero biases) would hide a norm or bias
    mapped to the wrong place."""
    torch.manual_seed(seed)
    extra = {"qkv_bias": False} if kind.endswith("no-qkv-bias") else {}
    config = HFViTConfig(**TINY, **extra, attn_implementation="eager")
    if kind.startswith("classifier"):
        model: PreTrainedModel = ViTForImageClassification(config)
    else:
        model = ViTModel(config, add_pooling_layer=kind == "model")
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                norm_gain = isinstance(module, nn.LayerNorm) and name == "weight"
                p.normal_(1.0, 0.2) if norm_gain else p.normal_(0.0, 0.3)
    return model.eval()


def save_and_convert(hf: PreTrainedModel, folder: Path) -> ViT:
    hf.save_pretrained(folder)
    model, _ = vit_from_hf_tensors(read_hf_config(folder), read_hf_weights(folder))
    return model


@pytest.fixture(scope="module", params=KINDS)
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, PreTrainedModel, ViT]:
    hf = random_hf_vit(request.param)
    return request.param, hf, save_and_convert(hf, tmp_path_factory.mktemp("hf"))


@pytest.mark.parametrize("size", SIZES, ids=["trained", "48x48", "40x24"])
@torch.no_grad()
def test_outputs_and_attention_equal_hugging_face(
    converted: tuple[str, PreTrainedModel, ViT], size: tuple[int, int]
) -> None:
    kind, hf, model = converted
    pixels = torch.randn(3, 3, *size, generator=torch.Generator().manual_seed(1))
    expected = hf(pixel_values=pixels, interpolate_pos_encoding=True, output_attentions=True)
    ours = model(pixels, need_weights=True)
    if kind.startswith("classifier"):
        assert ours.pooled is None
        assert (ours.logits - expected.logits).abs().max() < TOLERANCE
    else:
        assert ours.logits is None
        assert (ours.hidden - expected.last_hidden_state).abs().max() < TOLERANCE
        if kind == "model":
            assert (ours.pooled - expected.pooler_output).abs().max() < TOLERANCE
        else:
            assert ours.pooled is None and expected.pooler_output is None
    assert ours.weights is not None and len(ours.weights) == len(expected.attentions) == 2
    for theirs, mine in zip(expected.attentions, ours.weights, strict=True):
        assert mine.shape == theirs.shape  # (B, heads, 1 + N, 1 + N)
        assert (mine - theirs).abs().max() < TOLERANCE


def test_config_mapping(tmp_path: Path) -> None:
    hf = random_hf_vit("classifier")
    hf.config.id2label = dict(enumerate("abcde"))
    model = save_and_convert(hf, tmp_path / "hf")
    c = model.config
    assert (c.image_size, c.patch_size, c.d_model, c.num_heads, c.num_layers, c.d_ff) == (
        32,
        8,
        32,
        4,
        2,
        64,
    )
    assert (c.num_labels, c.id2label, c.pooler, c.qkv_bias) == (5, tuple("abcde"), False, True)
    assert (c.activation, c.layer_norm_eps) == ("gelu", 1e-12)
    assert not model.training and next(model.parameters()).dtype == torch.float32
    base = vit_config_from_hf({"model_type": "vit", "architectures": ["ViTModel"]})
    assert base.pooler and base.num_labels == 0 and base.image_size == 224


def _hf_config(**changes: Any) -> dict[str, Any]:
    return {"model_type": "vit", "architectures": ["ViTModel"], **TINY, **changes}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "deit"}, "model_type 'deit' is not ViT"),
        ({"architectures": ["ViTForMaskedImageModeling"]}, "'ViTForMaskedImageModeling'"),
        ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' is not supported"),
        ({"pooler_act": "relu"}, "pooler_act 'relu' is not supported"),
        ({"pooler_output_size": 16}, "pooler_output_size=16 is not supported"),
        ({"head_dim": 4}, "head_dim=4 is not supported"),
        ({"image_size": [32, 48]}, r"image_size=\[32, 48\] is not supported"),
        ({"patch_size": "8"}, "patch_size='8' is not a size"),
    ],
)
def test_unsupported_options_refused_by_name(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        vit_config_from_hf(_hf_config(**change))


def test_ignored_options_and_square_lists_accepted() -> None:
    config = vit_config_from_hf(
        _hf_config(image_size=[32, 32], encoder_stride=4, pooler_output_size=32, head_dim=8)
    )
    assert config.image_size == 32


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config and tensors of a saved ViTForImageClassification folder."""
    folder = tmp_path_factory.mktemp("hf")
    random_hf_vit("classifier").save_pretrained(folder)
    return read_hf_config(folder), read_hf_weights(folder)


def test_missing_extra_and_misshaped_tensors_refused(
    saved: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    config, tensors = saved
    layer = "vit.encoder.layer.1"
    without = {k: v for k, v in tensors.items() if k != f"{layer}.attention.attention.key.weight"}
    with pytest.raises(UserError, match="missing tensor 'key'"):
        vit_from_hf_tensors(config, without)
    without = {k: v for k, v in tensors.items() if k != "vit.layernorm.weight"}
    with pytest.raises(UserError, match=r"missing tensor for 'final_norm\.weight'"):
        vit_from_hf_tensors(config, without)
    extra = {**tensors, f"{layer}.attention.attention.gate.weight": torch.zeros(1)}
    with pytest.raises(UserError, match=r"unexpected tensor 'encoder\.layer\.1\.attention"):
        vit_from_hf_tensors(config, extra)
    deeper = {**tensors, "vit.encoder.layer.7.layernorm_after.weight": torch.zeros(32)}
    with pytest.raises(UserError, match="config has no place"):
        vit_from_hf_tensors(config, deeper)
    wrong = {**tensors, "vit.embeddings.position_embeddings": torch.zeros(1, 18, 32)}
    with pytest.raises(UserError, match=r"'embedder\.positions' has shape \(1, 18, 32\)"):
        vit_from_hf_tensors(config, wrong)
    twice = {**tensors, "layernorm.weight": tensors["vit.layernorm.weight"]}
    with pytest.raises(UserError, match=r"'layernorm\.weight' is stored twice"):
        vit_from_hf_tensors(config, twice)
    relabelled = {**config, "id2label": {"0": "a", "1": "b"}}
    with pytest.raises(UserError, match=r"id2label names 2 labels, but classifier\.weight has 5"):
        vit_from_hf_tensors(relabelled, tensors)


def test_mask_token_ignored_and_head_follows_tensors(
    saved: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """A mask token (masked-image-modelling folders) is ignored by name; without classifier
    tensors there is no head, with pooler tensors a pooler, whatever ``architectures`` says."""
    config, tensors = saved
    masked = {**tensors, "vit.embeddings.mask_token": torch.zeros(1, 1, 32)}
    model, mapped = vit_from_hf_tensors(config, masked)
    assert model.config.num_labels == 5 and mapped == len(tensors) - 2 * 2 * 2  # q/k/v fused
    body = {k: v for k, v in tensors.items() if not k.startswith("classifier.")}
    body["vit.pooler.dense.weight"] = torch.zeros(32, 32)
    body["vit.pooler.dense.bias"] = torch.zeros(32)
    model, _ = vit_from_hf_tensors(config, body)
    assert model.config.num_labels == 0 and model.config.id2label == ()
    assert model.config.pooler and model.classifier is None
