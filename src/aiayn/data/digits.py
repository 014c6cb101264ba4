"""scikit-learn's 8×8 handwritten digits as a Vision Transformer's training data.

``sklearn.datasets.load_digits()`` ships with scikit-learn (no download): 1,797 grayscale 8×8
images of the digits 0–9, each pixel a count 0–16 (the ink in a 4×4 block of a 32×32 bitmap),
about 180 per digit. Here they are

* split deterministically (a seed of its own, so that training seeds share one test set) into
  train / validation / test, every split holding the ten digits in nearly equal shares
  (:func:`split_digits`);
* made into pixels as an :class:`~aiayn.data.images.ImagePreprocessor` of the checkpoint reads
  an image file: × 1/16 (rescale), then (x − mean) / std with the training pixels' mean and
  standard deviation, in the same arithmetic (:func:`digits_preprocessor`, :func:`to_pixels`),
  so that ``aiayn classify-image`` on a PNG holding a digit's raw values 0–16 sees the very
  pixels training saw (:func:`save_digit_png`);
* batched as a fixed number of images, one target ("token") each (:class:`ImageSet`,
  :class:`ImageBatchSampler`), optionally moved by a random shift of up to ``shift`` pixels
  (augmentation, training only).

Shape legend:  N images   B images in a batch   C channels (1)   H, W height and width (8)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from aiayn.data.batching import TensorBatch
from aiayn.data.images import ImagePreprocessor
from aiayn.errors import UserError

DIGITS_IMAGE_SIZE = 8
"""The side of a digit image in pixels."""

DIGITS_CHANNELS = 1
"""Grayscale."""

DIGITS_LABELS = tuple(str(digit) for digit in range(10))
"""The ten classes' names, in label order."""

DIGITS_MAX_VALUE = 16
"""The largest pixel value (the rescale factor is its inverse)."""

DIGITS_COUNT = 1797
"""Images in the data set."""


def load_digit_images() -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    """(N, 8, 8) pixel values 0–16 and (N,) labels 0–9 of ``sklearn.datasets.load_digits``.

    Raises:
        UserError: when scikit-learn is not installed.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - a dependency of aiayn
        raise UserError(
            "the digits data set needs scikit-learn: pip install scikit-learn"
        ) from None
    digits = load_digits()
    images = np.asarray(digits.images)
    if images.shape[1:] != (DIGITS_IMAGE_SIZE, DIGITS_IMAGE_SIZE) or images.max() > 16:
        raise UserError(f"unexpected digits data: {images.shape} pixels up to {images.max()}")
    return images.astype(np.uint8), np.asarray(digits.target, dtype=np.int64)


class Splits(NamedTuple):
    """Image indices of the three splits, each ascending."""

    train: NDArray[np.int64]
    valid: NDArray[np.int64]
    test: NDArray[np.int64]


def split_digits(labels: NDArray[np.int64], valid_size: int, test_size: int, seed: int) -> Splits:
    """A seeded split with each class spread evenly over the three (stratified).

    The images are shuffled, then each class's images get evenly spaced positions in [0, 1)
    (the class's i-th of n at (i + u) / n, u random per class) and all are ordered by position:
    any prefix of that order holds the classes in their overall shares (within one image). The
    first ``valid_size`` images are the validation split, the next ``test_size`` the test
    split, the rest the training split.

    Raises:
        UserError: when the held-out images leave fewer than one per class for training.
    """
    n = len(labels)
    classes = np.unique(labels)
    if valid_size < 1 or test_size < 0 or n - valid_size - test_size < len(classes):
        raise UserError(
            f"data.valid_size={valid_size} and data.test_size={test_size} leave "
            f"{n - valid_size - test_size} of {n} images for training"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, n]))
    order = rng.permutation(n)
    shuffled = labels[order]
    position = np.empty(n)
    for c in classes:
        members = np.flatnonzero(shuffled == c)
        position[members] = (np.arange(len(members)) + rng.random()) / len(members)
    spread = order[np.argsort(position, kind="stable")]
    valid, test = spread[:valid_size], spread[valid_size : valid_size + test_size]
    train = spread[valid_size + test_size :]
    return Splits(np.sort(train), np.sort(valid), np.sort(test))


def digits_preprocessor(train_images: NDArray[np.uint8]) -> ImagePreprocessor:
    """The preprocessing of a digits model: 8×8, one channel, × 1/16, then normalised by the
    mean and standard deviation of the rescaled training pixels (``train_images``: (N, 8, 8))."""
    rescaled = _rescale(train_images, 1 / DIGITS_MAX_VALUE)
    return ImagePreprocessor(
        do_resize=True,
        size=(DIGITS_IMAGE_SIZE, DIGITS_IMAGE_SIZE),
        resample=2,
        do_rescale=True,
        rescale_factor=1 / DIGITS_MAX_VALUE,
        do_normalize=True,
        image_mean=(round(float(rescaled.mean(dtype=np.float64)), 6),),
        image_std=(round(float(rescaled.std(dtype=np.float64)), 6),),
        do_convert_rgb=None,
    )


def to_pixels(images: NDArray[np.uint8], preprocessor: ImagePreprocessor) -> Tensor:
    """(N, H, W) grayscale values -> (N, 1, H, W) float32 model inputs, in the arithmetic of
    :meth:`ImagePreprocessor.preprocess` (rescale in float64 then float32, normalise in
    float32), so a PNG of the same values preprocessed for ``aiayn classify-image`` is equal."""
    p = preprocessor
    values = _rescale(images, p.rescale_factor) if p.do_rescale else images.astype(np.float32)
    if p.do_normalize:
        mean = np.float32(p.image_mean[0])
        std = np.float32(p.image_std[0])
        values = (values - mean) / std  # (N, H, W), in float32
    return torch.from_numpy(np.ascontiguousarray(values[:, None]))  # -> (N, 1, H, W)


def _rescale(images: NDArray[np.uint8], factor: float) -> NDArray[np.float32]:
    return (images.astype(np.float64) * factor).astype(np.float32)


def save_digit_png(image: NDArray[np.uint8], path: str | Path) -> Path:
    """One (8, 8) digit as an 8-bit grayscale PNG of its raw values 0–16 (what the checkpoint's
    preprocessing, rescale 1/16, reads back as the training pixels)."""
    from PIL import Image

    path = Path(path)
    Image.fromarray(np.asarray(image, dtype=np.uint8), mode="L").save(path)
    return path


@dataclass(frozen=True)
class ImageBatch(TensorBatch):
    """Images and their labels, stacked.

    Attributes:
        pixels: (B, C, H, W) float32 model inputs.
        labels: (B,) int64 classes.
    """

    pixels: Tensor
    labels: Tensor

    @property
    def num_tgt_tokens(self) -> int:
        """B: one target per image."""
        return int(self.labels.numel())


class ImageSet:
    """Preprocessed images and labels, collated by index.

    Args:
        pixels: (N, C, H, W) float32 model inputs.
        labels: (N,) int64 classes.
        shift: augmentation: each collated image is moved by a random whole number of pixels
            in [−shift, shift] along each axis, the uncovered border filled with ``background``
            (the torch random stream draws the moves, so a resumed run repeats them).
        background: the model input of a blank pixel.
    """

    def __init__(self, pixels: Tensor, labels: Tensor, *, shift: int = 0, background: float = 0.0):
        if pixels.ndim != 4 or labels.shape != pixels.shape[:1]:
            raise ValueError(f"pixels {tuple(pixels.shape)} and labels {tuple(labels.shape)}")
        if shift < 0:
            raise ValueError(f"shift must be >= 0, got {shift}")
        self.pixels, self.labels = pixels, labels
        self.shift, self.background = shift, background

    def __len__(self) -> int:
        return int(self.labels.numel())

    def collate(self, indices: Iterable[int]) -> ImageBatch:
        """The batch of images ``indices`` (shifted when ``shift`` > 0)."""
        ids = torch.as_tensor(list(indices), dtype=torch.int64)
        pixels = self.pixels.index_select(0, ids)  # (B, C, H, W)
        if self.shift:
            pixels = random_shift(pixels, self.shift, self.background)
        return ImageBatch(pixels, self.labels.index_select(0, ids))

    def target_tokens(self, indices: Sequence[int] | NDArray[np.int64]) -> int:
        """One target per image."""
        return len(indices)


def random_shift(pixels: Tensor, shift: int, background: float) -> Tensor:
    """(B, C, H, W) images each moved by (dy, dx) drawn uniformly from [−shift, shift]², the
    border they leave filled with ``background``: a crop of the padded image."""
    b, _, h, w = pixels.shape
    s = shift
    padded = torch.nn.functional.pad(pixels, (s, s, s, s), value=background)  # (B, C, H+2s, W+2s)
    offsets = torch.randint(0, 2 * s + 1, (2, b))  # top-left corner of each crop
    rows = offsets[0][:, None] + torch.arange(h)  # (B, H)
    cols = offsets[1][:, None] + torch.arange(w)  # (B, W)
    batch = torch.arange(b)[:, None, None]
    # (B, C, H+2s, W+2s) -> (B, H, W, C) by advanced indexing -> (B, C, H, W)
    cropped = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]
    return cropped.permute(0, 3, 1, 2).contiguous()


class ImageBatchSampler:
    """Batches of ``max(1, max_tokens)`` images (one target each), deterministic in
    ``(seed, epoch)``: each epoch a new random order (``shuffle=False``: index order), the last
    batch holding what is left. Nothing is padded."""

    def __init__(self, num_images: int, max_tokens: int, *, seed: int, shuffle: bool = True):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.num_images, self.per_batch = num_images, max_tokens
        self.seed, self.shuffle = seed, shuffle

    def __len__(self) -> int:
        return -(-self.num_images // self.per_batch)

    def batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` (image indices), in training order."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
        n, k = self.num_images, self.per_batch
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        return [order[a : a + k].tolist() for a in range(0, n, k)]

    def padding_fraction(self, epoch: int = 0) -> float:
        """0.0: images of one size need no padding."""
        return 0.0
