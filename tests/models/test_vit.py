"""aiayn's ViT: the published parameter counts (and Hugging Face's for odd shapes), config
validation, the patch embedder's interpolation, and the behaviour later commands rely on
(attention weights, training)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import ViTConfig as HFViTConfig
from transformers import ViTForImageClassification, ViTModel

from aiayn.errors import ConfigError
from aiayn.models.params import count_parameters
from aiayn.models.vit import (
    VIT_PRESETS,
    PatchEmbedder,
    ViT,
    ViTConfig,
    expected_vit_parameters,
    vit_preset,
)

PUBLISHED = {  # transformers' counts of google/vit-base-patch16-224(-in21k) on the meta device
    "ViTModel": 86_389_248,  # with the pooler
    "ViTForImageClassification": 86_567_656,  # 1000 ImageNet labels, no pooler
}


def test_published_parameter_counts() -> None:
    base = vit_preset("vit-base-patch16-224")
    classifier = base.replace(pooler=False, num_labels=1000)
    for config, published in ((base, "ViTModel"), (classifier, "ViTForImageClassification")):
        assert expected_vit_parameters(config) == PUBLISHED[published]
        with torch.device("meta"):
            assert count_parameters(ViT(config)) == PUBLISHED[published]


@pytest.mark.parametrize("name", list(VIT_PRESETS))
def test_preset_counts_match_closed_form(name: str) -> None:
    config = vit_preset(name)
    with torch.device("meta"):
        assert count_parameters(ViT(config)) == expected_vit_parameters(config)


@pytest.mark.parametrize("pooler", [True, False])
def test_count_matches_hugging_face_for_odd_shapes(pooler: bool) -> None:
    """One channel, no q/k/v biases, 36×36 images in 6×6 patches, a 3-label head or a pooler."""
    hf_config = HFViTConfig(
        image_size=36, patch_size=6, num_channels=1, hidden_size=24, num_hidden_layers=3,
        num_attention_heads=3, intermediate_size=40, qkv_bias=False, num_labels=3,
    )  # fmt: skip
    hf = ViTModel(hf_config) if pooler else ViTForImageClassification(hf_config)
    config = ViTConfig(
        image_size=36, patch_size=6, num_channels=1, d_model=24, num_layers=3, num_heads=3,
        d_ff=40, qkv_bias=False, pooler=pooler, num_labels=0 if pooler else 3,
    )  # fmt: skip
    assert count_parameters(ViT(config)) == expected_vit_parameters(config)
    assert expected_vit_parameters(config) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize(
    "change, message",
    [
        ({"patch_size": 64}, "patch_size=64 is larger than image_size=32"),
        ({"d_model": 30}, "divisible by num_heads"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps must be finite and > 0"),
        ({"num_labels": -1}, "num_labels must be >= 0"),
        ({"id2label": ("a", "b")}, "id2label names 2 labels, but num_labels=5"),
        ({"id2label": (1, 2, 3, 4, 5)}, r"id2label\[0\] has the wrong type: 1 \(expected a str"),
        ({"qkv_bias": "yes"}, "qkv_bias has the wrong type"),
        ({"hidden_size": 8}, "unknown model config key.*hidden_size"),
    ],
)
def test_bad_values_refused_by_name(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        vit_preset("vit-tiny", **change)
    with pytest.raises(ConfigError, match="unknown ViT preset 'vit-huge'"):
        vit_preset("vit-huge")


def test_config_round_trip_through_json() -> None:
    """A checkpoint records the config as JSON: id2label comes back a list and is a tuple again."""
    config = vit_preset("vit-tiny-digits")
    again = ViTConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.id2label == tuple("0123456789")


def test_position_embeddings_kept_or_interpolated() -> None:
    embedder = PatchEmbedder(3, 8, patch_size=4, grid=3, dropout=0.0)
    with torch.no_grad():
        embedder.positions.copy_(torch.randn(1, 10, 8))
        embedder.positions[:, 1:] = 2.5  # a constant grid stays constant under bicubic resizing
    assert embedder.position_embeddings(3, 3) is embedder.positions
    resized = embedder.position_embeddings(5, 2)
    assert resized.shape == (1, 11, 8)
    assert torch.equal(resized[:, :1], embedder.positions[:, :1])  # the class position kept apart
    assert torch.allclose(resized[:, 1:], torch.full((1, 10, 8), 2.5), atol=1e-5)


def _model(**changes: object) -> ViT:
    torch.manual_seed(0)
    return ViT(vit_preset("vit-tiny", **changes)).eval()


@torch.no_grad()
def test_outputs_and_attention_weights() -> None:
    model = _model()
    pixels = torch.randn(2, 3, 32, 32)
    out = model(pixels, need_weights=True)
    assert (
        out.hidden.shape == (2, 17, 32) and out.pooled is not None and out.pooled.shape == (2, 32)
    )
    assert out.logits is not None and out.logits.shape == (2, 5)
    assert out.weights is not None and len(out.weights) == 2
    for weights in out.weights:
        assert weights.shape == (2, 4, 17, 17)
        assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 17), atol=1e-5)
    fast = model(pixels)
    assert fast.weights is None and torch.allclose(fast.hidden, out.hidden, atol=1e-5)
    assert model(torch.randn(1, 3, 48, 40)).hidden.shape == (1, 1 + 6 * 5, 32)


@torch.no_grad()
def test_border_smaller_than_a_patch_is_not_seen() -> None:
    model = _model()
    pixels = torch.randn(1, 3, 35, 37)
    assert torch.equal(model(pixels).hidden, model(pixels[..., :32, :32]).hidden)


def test_wrong_channel_count_refused() -> None:
    with pytest.raises(ValueError, match="images have 1 channels, the model takes 3"):
        _model()(torch.randn(1, 1, 32, 32))


def test_trains_every_parameter() -> None:
    """In training mode (dropout on) the loss reaches every parameter, and a few steps of the
    tiny digits preset fit a batch."""
    torch.manual_seed(0)
    model = ViT(vit_preset("vit-tiny-digits")).train()
    pixels, labels = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        logits = model(pixels).logits
        assert logits is not None
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        if not losses:
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
