"""The image-classification task: a Vision Transformer (family ``vit``) learns scikit-learn's 8×8
handwritten digits from scratch with the same trainer as translation and language modelling.

* data: ``sklearn.datasets.load_digits()`` split by ``data.split_seed`` into train / validation
  / test with every digit in its share (:mod:`aiayn.data.digits`); pixels × 1/16, normalised by
  the training pixels' mean and standard deviation, which the checkpoints record as their
  ``preprocessor_config.json`` (so ``aiayn classify-image`` reads images as training did);
  batches of ``train.max_tokens`` images (one target each), optionally shifted by up to
  ``data.shift`` pixels;
* objective: cross-entropy of the classifier's logits (``train.label_smoothing``, 0 by
  default) (:class:`ImageClassificationObjective`);
* validation: loss and accuracy (in percent) over the validation images; the best checkpoint
  has the highest accuracy; at the end, the test images' accuracy.

Shape legend:  B images in a batch   C channels   H, W height and width   K labels
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data.digits import (
    DIGITS_CHANNELS,
    DIGITS_IMAGE_SIZE,
    DIGITS_LABELS,
    ImageBatch,
    ImageBatchSampler,
    ImageSet,
    digits_preprocessor,
    load_digit_images,
    split_digits,
    to_pixels,
)
from aiayn.data.images import ImagePreprocessor
from aiayn.errors import ConfigError, UserError
from aiayn.evaluation.perplexity import EvalTally
from aiayn.layers.loss import LossSums, label_smoothed_nll
from aiayn.models.vit import ViT, ViTConfig
from aiayn.training.config import ImageDataConfig, RunConfig
from aiayn.training.task import AccuracyTask, Log, TaskData, data_as, print_main


@dataclass
class ImageData:
    """The preprocessing and the three splits.

    ``tokenizer_file`` is what the trainer saves beside each checkpoint's weights: here the
    image preprocessing (``preprocessor_config.json``), not a tokenizer.
    """

    preprocessor: ImagePreprocessor
    train: ImageSet
    valid: ImageSet
    test: ImageSet | None = None

    @property
    def tokenizer_file(self) -> ImagePreprocessor:
        """The checkpoints' input processing (see the class docstring)."""
        return self.preprocessor


class ImageClassificationObjective(nn.Module):
    """Σ (label-smoothed) cross-entropy of the classifier's logits over a batch of images.

    Args:
        model: the ViT being trained (its parameters are this module's); it needs a head.
        label_smoothing: ε_ls of the loss (0 by default for image classification).
    """

    def __init__(self, model: ViT, label_smoothing: float = 0.0):
        super().__init__()
        if model.classifier is None:
            raise ValueError("the ViT has no classification head (num_labels = 0)")
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, pixels: Tensor, labels: Tensor) -> LossSums:
        """Args:
        pixels: (B, C, H, W) model inputs.
        labels: (B,) gold classes.
        """
        logits = self.model(pixels).logits  # (B, K)
        assert logits is not None
        log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, K), fp32 under autocast too
        # one "position" per image: (B, K) -> (1, B, K); no padding
        return label_smoothed_nll(log_probs[None], labels[None], self.label_smoothing, pad_id=-1)


def check_image_run(run: RunConfig) -> None:
    """The model fits the digits (the one image data set): 8×8 pixels, 1 channel, 10 labels."""
    assert isinstance(run.model, ViTConfig)
    wanted = {
        "image_size": DIGITS_IMAGE_SIZE,
        "num_channels": DIGITS_CHANNELS,
        "num_labels": len(DIGITS_LABELS),
    }
    for name, value in wanted.items():
        if getattr(run.model, name) != value:
            raise ConfigError(
                f"model.{name}={getattr(run.model, name)} does not fit the digits data set "
                f"({DIGITS_IMAGE_SIZE}x{DIGITS_IMAGE_SIZE} pixels, {DIGITS_CHANNELS} channel, "
                f"{len(DIGITS_LABELS)} labels): set model.{name}={value}"
            )


def image_metrics(
    model: ViT, images: ImageSet, max_tokens: int, label_smoothing: float = 0.0
) -> dict[str, float]:
    """Loss, NLL per image, perplexity and accuracy (%) of ``model`` (eval mode) over
    ``images`` (unshifted), in batches of ``max_tokens`` images."""
    device = model.embedder.projection.weight.device
    sampler = ImageBatchSampler(len(images), max_tokens, seed=0, shuffle=False)
    tally = EvalTally()
    with torch.no_grad():
        for ids in sampler.batches(0):
            batch = _unshifted(images, ids).to(device)
            logits = model(batch.pixels).logits  # (B, K)
            assert logits is not None
            log_probs = F.log_softmax(logits.float(), dim=-1)
            sums = label_smoothed_nll(log_probs[None], batch.labels[None], label_smoothing, -1)
            tally.add(sums, (logits.argmax(dim=-1) == batch.labels).sum())
    return tally.metrics(len(images), "images", accuracy=True)


def _unshifted(images: ImageSet, ids: Sequence[int]) -> ImageBatch:
    index = torch.as_tensor(list(ids), dtype=torch.int64)
    return ImageBatch(images.pixels.index_select(0, index), images.labels.index_select(0, index))


class ImageClassificationTask(AccuracyTask):
    """Image classification with a Vision Transformer (see :mod:`aiayn.training.task`).

    Args:
        run: the run config (family ``vit``, an :class:`ImageDataConfig` data section).
        log: prints the data reports and the final results.
    """

    model_class = ViT
    data_class = ImageData
    unit = "images"
    split_metrics = staticmethod(image_metrics)

    def __init__(self, run: RunConfig, log: Log = print_main):
        assert isinstance(run.model, ViTConfig) and isinstance(run.data, ImageDataConfig)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UserError(
                "family vit trains in one process (the digits fit one): run it without torchrun"
            )
        self.run, self.model_cfg, self.data_cfg, self.log = run, run.model, run.data, log
        self.label_smoothing = run.train.label_smoothing or 0.0

    # -- data ------------------------------------------------------------------------------------
    def prepare_data(self, run_dir: Path, *, reuse_tokenizer: bool) -> ImageData:
        """Load the digits, split them, fit the normalisation on the training split.

        Everything follows from the data and ``data.split_seed``, so a resumed run
        (``reuse_tokenizer``) recomputes the same preprocessing."""
        d = self.data_cfg
        images, labels = load_digit_images()
        splits = split_digits(labels, d.valid_size, d.test_size, d.split_seed)
        preprocessor = digits_preprocessor(images[splits.train])
        pixels, targets = to_pixels(images, preprocessor), torch.from_numpy(labels)
        background = float(to_pixels(np.zeros((1, 1, 1), np.uint8), preprocessor).item())

        def subset(ids: np.ndarray, shift: int = 0) -> ImageSet:
            index = torch.from_numpy(ids)
            return ImageSet(pixels[index], targets[index], shift=shift, background=background)

        test = subset(splits.test) if len(splits.test) else None
        self.log(
            f"data: scikit-learn digits, {len(images)} 8x8 images of 10 classes: "
            f"{len(splits.train)} train, {len(splits.valid)} validation, {len(splits.test)} test "
            f"(split seed {d.split_seed}); pixels x 1/16, mean {preprocessor.image_mean[0]:.4f} "
            f"std {preprocessor.image_std[0]:.4f}"
            + (f"; training shifts up to {d.shift} px" if d.shift else "")
        )
        return ImageData(preprocessor, subset(splits.train, d.shift), subset(splits.valid), test)

    # -- model and steps -------------------------------------------------------------------------
    def model_config(self, data: TaskData) -> ViTConfig:
        """The run's ViT; the digits' label names when the config names none."""
        if self.model_cfg.id2label:
            return self.model_cfg
        return self.model_cfg.replace(id2label=DIGITS_LABELS)

    def new_model(self, config: ModelConfig) -> ViT:
        """A freshly initialised ViT."""
        assert isinstance(config, ViTConfig)
        return ViT(config)

    def objective(self, model: nn.Module) -> ImageClassificationObjective:
        """Cross-entropy of the logits."""
        assert isinstance(model, ViT)
        return ImageClassificationObjective(model, self.label_smoothing)

    def sampler(self, data: TaskData, max_tokens: int, seed: int) -> ImageBatchSampler:
        """Shuffled training images, ``max_tokens`` a batch."""
        return ImageBatchSampler(len(data_as(data, ImageData).train), max_tokens, seed=seed)

    def step_inputs(self, batch: ImageBatch) -> tuple[Tensor, Tensor]:
        """(pixels, labels) for :class:`ImageClassificationObjective`."""
        return batch.pixels, batch.labels

    def padding(self, batches: Sequence[ImageBatch]) -> float:
        """0: images are never padded."""
        return 0.0


# The built-in image-classification demo (`aiayn train --demo vit`, configs/vit_digits.yaml): the
# `vit-tiny-digits` ViT (patch 2, d_model 64, 4 layers, 0.1M parameters) learns scikit-learn's
# 8x8 digits from scratch. The 1,437 training images are seen hundreds of times: shifts of up to
# one pixel, label smoothing and weight decay keep it from memorising them
# (docs/results/train_vit_digits.md). Keep configs/vit_digits.yaml identical (a test checks).
VIT_DEMO_CONFIG: dict[str, Any] = {
    "run_dir": "runs/vit_digits",
    "model": {"family": "vit", "preset": "vit-tiny-digits"},
    "data": {"dataset": "digits", "valid_size": 180, "test_size": 180, "split_seed": 0, "shift": 1},
    "train": {
        "max_tokens": 128,
        "warmup_steps": 200,
        "lr_scale": 0.3,
        "weight_decay": 0.05,
        "label_smoothing": 0.1,
        "max_minutes": 5.0,
        "eval_every": 250,
        "save_every": 250,
        "log_every": 50,
        "keep_last": 3,
        "average_last": 3,
    },
}
