"""Images -> the pixel tensors a Vision Transformer reads, as a Hugging Face folder's
``preprocessor_config.json`` says (transformers' ``ViTImageProcessor``), with Pillow.

    file ─ open (EXIF orientation applied) ─ to RGB (transparency over white) ─ resize (PIL filter)
         ─ × rescale_factor ─ (x − mean) / std per channel ─ (C, H, W) float32

Each step is the one transformers' PIL backend takes, in the same arithmetic (the rescale in
float64 then float32, the normalisation in float32), so the tensors equal its ``pixel_values``.
Options aiayn's preprocessing does not compute (centre crop, padding, sizes by shortest edge,
other processors) are refused by name.

Shape legend:  B images   C channels   H, W height and width (pixels)
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from aiayn import limits
from aiayn.data.json_files import read_json_object
from aiayn.errors import ConfigError, UserError

PREPROCESSOR_CONFIG = "preprocessor_config.json"

RESAMPLE: dict[int, str] = {
    0: "nearest",
    1: "lanczos",
    2: "bilinear",
    3: "bicubic",
    4: "box",
    5: "hamming",
}
"""Pillow's resampling filters by the codes the config stores (``PIL.Image.Resampling``)."""

SUPPORTED_PROCESSORS = (
    "ViTImageProcessor",
    "ViTImageProcessorFast",
    "ViTImageProcessorPil",
    "ViTFeatureExtractor",
)

HF_DEFAULTS: dict[str, Any] = {
    "do_resize": True,
    "size": {"height": 224, "width": 224},
    "resample": 2,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": None,
}
"""transformers' ``ViTImageProcessor`` defaults: what a config leaving a key out means."""

REFUSED: dict[str, object] = {"do_center_crop": True, "do_pad": True}
"""Options, with the value aiayn's preprocessing does not compute, refused by name."""


@dataclass(frozen=True)
class ImagePreprocessor:
    """The preprocessing of a ViT folder (transformers' names).

    Attributes:
        do_resize: resize every image to ``size``.
        size: (height, width) after resizing.
        resample: Pillow's filter code (:data:`RESAMPLE`; 2 = bilinear).
        do_rescale: multiply by ``rescale_factor`` (1/255: bytes -> [0, 1]).
        rescale_factor: the factor.
        do_normalize: (x − mean) / std per channel.
        image_mean, image_std: one value per channel C.
        do_convert_rgb: True = convert to RGB, transparency composited over white (transformers'
            ``convert_to_rgb``); False = keep the stored channels (an RGBA image has four);
            None (ViT's default) = an RGB image for three means, an L image for one, is kept as
            stored (as transformers does); any other is converted to that mode the same way,
            where transformers would refuse it (channels ≠ means) or misread it (palette
            indices).
    """

    do_resize: bool = True
    size: tuple[int, int] = (224, 224)
    resample: int = 2
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    do_convert_rgb: bool | None = None

    def __post_init__(self) -> None:
        if len(self.size) != 2 or min(self.size) < 1:
            raise ConfigError(f"size must be (height, width) >= 1, got {self.size}")
        if self.resample not in RESAMPLE:
            raise ConfigError(f"resample must be one of {sorted(RESAMPLE)}, got {self.resample!r}")
        if len(self.image_mean) != len(self.image_std) or not self.image_mean:
            raise ConfigError(
                f"image_mean {self.image_mean} and image_std {self.image_std} must give one "
                "value per channel"
            )
        if self.do_normalize and min(self.image_std) <= 0:
            raise ConfigError(f"image_std must be positive, got {self.image_std}")

    @property
    def channels(self) -> int:
        """C, the channels the normalisation (and the model) expects."""
        return len(self.image_mean)

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> ImagePreprocessor:
        """From a ``preprocessor_config.json`` dict; unsupported options are refused by name."""
        _check_supported(config)
        hf = {**HF_DEFAULTS, **{k: v for k, v in config.items() if k in HF_DEFAULTS}}
        convert = hf["do_convert_rgb"]
        return cls(
            do_resize=bool(hf["do_resize"]),
            size=_size(hf["size"]),
            resample=int(hf["resample"]),
            do_rescale=bool(hf["do_rescale"]),
            rescale_factor=float(hf["rescale_factor"]),
            do_normalize=bool(hf["do_normalize"]),
            image_mean=_per_channel(hf, "image_mean"),
            image_std=_per_channel(hf, "image_std"),
            do_convert_rgb=None if convert is None else bool(convert),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ImagePreprocessor:
        """From ``folder``'s ``preprocessor_config.json``."""
        file = Path(folder) / PREPROCESSOR_CONFIG
        config = read_json_object(file, "the image preprocessing")
        try:
            return cls.from_hf(config)
        except UserError as exc:
            raise type(exc)(f"{file}: {exc}") from None

    def to_hf(self) -> dict[str, Any]:
        """The ``preprocessor_config.json`` dict that :meth:`from_hf` reads back to ``self``."""
        height, width = self.size
        config: dict[str, Any] = {
            "image_processor_type": "ViTImageProcessor",
            "do_resize": self.do_resize,
            "size": {"height": height, "width": width},
            "resample": self.resample,
            "do_rescale": self.do_rescale,
            "rescale_factor": self.rescale_factor,
            "do_normalize": self.do_normalize,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
        }
        if self.do_convert_rgb is not None:
            config["do_convert_rgb"] = self.do_convert_rgb
        return config

    def save(self, folder: str | Path) -> None:
        """Write ``folder``/``preprocessor_config.json`` (transformers reads it too)."""
        text = json.dumps(self.to_hf(), indent=2) + "\n"
        (Path(folder) / PREPROCESSOR_CONFIG).write_text(text, encoding="utf-8")

    def convert(self, image: Image.Image) -> Image.Image:
        """The image in the mode the model reads (see ``do_convert_rgb``)."""
        if self.do_convert_rgb is False:
            return image
        mode = "RGB"
        if self.do_convert_rgb is None:
            if self.channels not in (1, 3):
                return image
            mode = "RGB" if self.channels == 3 else "L"
            if image.mode == mode:
                return image  # as stored, as transformers reads it
        return _flatten_to(image, mode)

    def preprocess(self, image: Image.Image) -> Tensor:
        """A PIL image -> (C, H, W) float32: converted, resized, rescaled, normalised."""
        image = self.convert(image)
        if self.do_resize:
            height, width = self.size
            image = image.resize((width, height), resample=Image.Resampling(self.resample))
        pixels = np.asarray(image)
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels  # (H, W) -> (H, W, 1)
        if self.do_normalize and pixels.shape[-1] != self.channels:
            raise UserError(
                f"the image has {pixels.shape[-1]} channels (mode {image.mode}), but image_mean "
                f"has {self.channels}"
            )
        values = pixels.astype(np.float32)  # (H, W, C)
        if self.do_rescale:
            values = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            mean = np.asarray(self.image_mean, dtype=np.float32)  # (C,)
            std = np.asarray(self.image_std, dtype=np.float32)  # (C,)
            values = (values - mean) / std  # (H, W, C) - (C,), in float32
        chw = np.ascontiguousarray(values.transpose(2, 0, 1))  # (H, W, C) -> (C, H, W)
        return torch.from_numpy(chw)

    def load(self, path: str | Path) -> Tensor:
        """The image file at ``path`` -> (C, H, W) float32.

        Raises:
            UserError: naming the file when it cannot be read as an image or preprocessed.
        """
        image = open_image(path)
        try:
            return self.preprocess(image)
        except (OSError, ValueError) as exc:  # UserError is a ValueError
            raise UserError(f"{path}: cannot preprocess the image ({exc})") from None

    def preprocess_batch(self, paths: Iterable[str | Path]) -> Tensor:
        """Image files -> (B, C, H, W) float32 (of one size: resized, or stored so)."""
        images = [(path, self.load(path)) for path in paths]
        if not images:
            raise UserError("no images to preprocess")
        first = images[0][1].shape
        for path, pixels in images:
            if pixels.shape != first:
                raise UserError(
                    f"{path}: {tuple(pixels.shape)} pixels, unlike the batch's first image "
                    f"{tuple(first)} (a batch needs one size: resize them)"
                )
        return torch.stack([pixels for _, pixels in images])  # B × (C, H, W) -> (B, C, H, W)


def open_image(path: str | Path) -> Image.Image:
    """The image file at ``path``, decoded, turned upright by its EXIF orientation (as
    transformers' ``load_image``).

    Raises:
        UserError: naming the file when it is missing, unreadable or not an image.
    """
    try:
        with warnings.catch_warnings():  # the size is checked below, in aiayn's words
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                check_pixels(path, image.width, image.height)  # from the header: nothing decoded
                image.load()
                return ImageOps.exif_transpose(image)
    except Image.DecompressionBombError:  # beyond twice Pillow's limit, refused on opening
        bound = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise UserError(_too_large(path, f"more than {bound:,} pixels")) from None
    except (OSError, ValueError) as exc:  # UserError is a ValueError
        if isinstance(exc, UserError):
            raise
        raise UserError(f"{path}: cannot read the image ({exc})") from None


def check_pixels(path: str | Path, width: int, height: int) -> None:
    """Refuse an image of more than :data:`aiayn.limits.MAX_IMAGE_PIXELS` pixels, or with a side
    longer than :data:`aiayn.limits.MAX_IMAGE_SIDE` (what its resize costs grows with).

    Raises:
        UserError: naming the file, its size and the limit.
    """
    if width * height > limits.MAX_IMAGE_PIXELS:
        raise UserError(_too_large(path, f"{width} × {height} = {width * height:,} pixels"))
    side = max(width, height)
    if side > limits.MAX_IMAGE_SIDE:
        raise UserError(
            f"{path}: the image is too large to decode ({width} × {height} pixels: a side of "
            f"{side:,} pixels, beyond the limit of {limits.MAX_IMAGE_SIDE:,}): make it smaller "
            "first"
        )


def _too_large(path: str | Path, size: str) -> str:
    return (
        f"{path}: the image is too large to decode ({size}; the limit is "
        f"{limits.MAX_IMAGE_PIXELS:,} pixels): make it smaller first"
    )


def _flatten_to(image: Image.Image, mode: str) -> Image.Image:
    """``image`` in ``mode``, any transparency composited over white first (transformers'
    ``convert_to_rgb``)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image.convert("RGBA"))
    return image.convert(mode)


def _check_supported(config: Mapping[str, Any]) -> None:
    kind = config.get("image_processor_type") or config.get("feature_extractor_type")
    if kind is not None and kind not in SUPPORTED_PROCESSORS:
        raise UserError(
            f"image processor {kind!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_PROCESSORS)})"
        )
    for option, refused in REFUSED.items():
        if config.get(option) == refused:
            raise UserError(f"{option}={refused} is not supported by aiayn's image preprocessing")


def _size(value: object) -> tuple[int, int]:
    """``224`` or ``{"height": 224, "width": 224}`` -> (224, 224)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, Mapping) and set(value) == {"height", "width"}:
        height, width = value["height"], value["width"]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (height, width)):
            return height, width
    raise UserError(f"size {value!r} is not supported (an int, or height and width in pixels)")


def _per_channel(hf: Mapping[str, Any], key: str) -> tuple[float, ...]:
    """``image_mean`` / ``image_std``: a list of numbers (one per channel) or one number for
    three channels."""
    value = hf[key]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * 3
    if isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        return tuple(float(v) for v in value)
    raise UserError(f"{key} {value!r} is not a list of numbers")
