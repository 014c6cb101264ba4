"""The ViT digits row of quantize_accuracy.py: it scores the test split the checkpoint's training
held out (its run config's sizes and split seed, its preprocessing), fp32 and int8, with the
figures a direct computation gives, and refuses a checkpoint that cannot say which split that was.
A tiny untrained ViT whose labels vary from image to image."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.data.digits import digits_preprocessor, load_digit_images, split_digits, to_pixels
from aiayn.data.images import ImagePreprocessor
from aiayn.errors import UserError
from aiayn.inference.quantize import quantize_model
from aiayn.models.vit import ViT, ViTConfig
from aiayn.training.config import RunConfig, run_config_from_dict
from quantize_accuracy import digits_test_split, vit_row


def tiny_run(split_seed: int) -> RunConfig:
    """A 2-layer d_model=32 ViT on the digits, 60 test images, batches of 32 (two in the test)."""
    return run_config_from_dict(
        {
            "model": {"family": "vit", "preset": "vit-tiny-digits", "d_model": 32,
                      "num_heads": 2, "num_layers": 2, "d_ff": 64},
            "data": {"valid_size": 50, "test_size": 60, "split_seed": split_seed},
            "train": {"max_tokens": 32},
        }
    )  # fmt: skip


def random_vit(run: RunConfig) -> ViT:
    """Weights drawn at random (std fan_in^-1/2), biases, class token and positions zero, norms
    the identity: the class token's first query is zero, so it takes the mean of the patches'
    values, and the labels follow the images."""
    assert isinstance(run.model, ViTConfig)
    torch.manual_seed(0)
    model = ViT(run.model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.ndim == 1 or name in ("embedder.class_token", "embedder.positions"):
                p.zero_()
            else:
                p.normal_(0.0, p[0].numel() ** -0.5)
    return model.eval()


def save_vit(path: Path, model: ViT, state: dict[str, Any], preprocessor: ImagePreprocessor) -> str:
    return str(save_checkpoint(path, model, state, preprocessor))


def test_the_row_scores_the_training_test_split_in_both_modes(tmp_path: Path) -> None:
    run = tiny_run(split_seed=3)
    images, labels = load_digit_images()
    splits = split_digits(labels, 50, 60, 3)
    preprocessor = digits_preprocessor(images[splits.train])
    model = random_vit(run)
    folder = save_vit(tmp_path / "vit", model, {"run_config": run.to_dict()}, preprocessor)

    data, max_tokens = digits_test_split(folder)
    assert data.test is not None and max_tokens == 32
    pixels = to_pixels(images[splits.test], preprocessor)  # (60, 1, 8, 8)
    assert torch.equal(data.test.pixels, pixels)
    assert torch.equal(data.test.labels, torch.from_numpy(labels[splits.test]))

    with torch.no_grad():
        fp32 = model(pixels).logits.argmax(dim=-1)  # (60,)
        int8 = quantize_model(copy.deepcopy(model), "int8")(pixels).logits.argmax(dim=-1)
    gold = data.test.labels
    assert len(set(fp32.tolist())) >= 3  # the labels vary: the split matters
    row = vit_row(folder)
    assert row["images"] == 60
    assert row["fp32"] == pytest.approx(100 * (fp32 == gold).float().mean().item())
    assert row["int8"] == pytest.approx(100 * (int8 == gold).float().mean().item())
    assert row["same label"] == pytest.approx((fp32 == int8).float().mean().item())
    assert row["met"] == (abs(row["int8"] - row["fp32"]) <= 0.5)


def test_a_checkpoint_that_cannot_name_its_test_split_is_refused(tmp_path: Path) -> None:
    run = tiny_run(split_seed=3)
    images, labels = load_digit_images()
    preprocessor = digits_preprocessor(images[split_digits(labels, 50, 60, 3).train])
    model = random_vit(run)
    bare = save_vit(tmp_path / "bare", model, {}, preprocessor)
    with pytest.raises(UserError, match="records no run_config"):
        digits_test_split(bare)
    other = tiny_run(split_seed=4).to_dict()  # another split: other training pixels
    moved = save_vit(tmp_path / "moved", model, {"run_config": other}, preprocessor)
    with pytest.raises(UserError, match="preprocessing is not that of its run's training split"):
        digits_test_split(moved)
    no_test = {**run.to_dict(), "data": {**run.to_dict()["data"], "test_size": 0}}
    none = save_vit(tmp_path / "none", model, {"run_config": no_test}, preprocessor)
    with pytest.raises(UserError, match="without a test split"):
        digits_test_split(none)
