"""Image preprocessing from a folder's ``preprocessor_config.json``: equal to transformers'
``ViTImageProcessor`` (its PIL backend) on generated images of odd sizes and several modes, for
the default and for other settings; unreadable files and unsupported options refused by name."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.image_utils import load_image
from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

from aiayn.data.images import PREPROCESSOR_CONFIG, ImagePreprocessor, open_image
from aiayn.errors import UserError

TOLERANCE = 1e-5
SIZES = [(37, 23), (5, 61), (301, 17)]  # (width, height)
MODES = ["RGB", "L", "RGBA", "LA", "P"]


def make_image(mode: str, size: tuple[int, int], seed: int = 0) -> Image.Image:
    """Random pixels in ``mode`` (RGBA and LA with varying transparency; P a palette image)."""
    rng = np.random.default_rng(seed)
    rgba = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8), "RGBA")
    if mode == "P":
        return rgba.convert("RGB").quantize(colors=16)
    return rgba.convert(mode)


def save_images(folder: Path, modes: list[str]) -> list[Path]:
    paths = []
    for i, mode in enumerate(modes):
        for j, size in enumerate(SIZES):
            path = folder / f"{mode}-{j}.png"
            make_image(mode, size, seed=10 * i + j).save(path)
            paths.append(path)
    return paths


def folder_with(tmp_path: Path, **settings: Any) -> tuple[ImagePreprocessor, ViTImageProcessorPil]:
    """Both preprocessors read from one folder that transformers' processor wrote."""
    folder = tmp_path / "processor"
    ViTImageProcessorPil(**settings).save_pretrained(folder)
    return ImagePreprocessor.from_folder(folder), ViTImageProcessorPil.from_pretrained(folder)


def hf_pixels(processor: ViTImageProcessorPil, path: Path, **options: Any) -> torch.Tensor:
    with Image.open(path) as image:
        return processor(images=[image], return_tensors="pt", **options).pixel_values[0]


def test_default_settings_equal_transformers_on_rgb(tmp_path: Path) -> None:
    ours, theirs = folder_with(tmp_path)
    assert ours == ImagePreprocessor()  # transformers' ViT defaults
    for path in save_images(tmp_path, ["RGB"]):
        pixels = ours.load(path)
        assert pixels.shape == (3, 224, 224) and pixels.dtype == torch.float32
        assert (pixels - hf_pixels(theirs, path)).abs().max() < TOLERANCE


@pytest.mark.parametrize("resample", [0, 1, 2, 3, 4, 5])
def test_every_mode_and_filter_equals_transformers(tmp_path: Path, resample: int) -> None:
    """RGB conversion (transparency over white), each resampling filter, a rectangular size,
    ImageNet statistics."""
    ours, theirs = folder_with(
        tmp_path,
        size={"height": 20, "width": 28},
        resample=resample,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
        do_convert_rgb=True,
    )
    assert ours.do_convert_rgb is True and ours.resample == resample
    for path in save_images(tmp_path, MODES):
        pixels = ours.load(path)
        assert pixels.shape == (3, 20, 28)
        assert (pixels - hf_pixels(theirs, path)).abs().max() < TOLERANCE, path.name


def test_unset_conversion_converts_what_transformers_cannot_read(tmp_path: Path) -> None:
    """ViT's default leaves ``do_convert_rgb`` unset: transformers then refuses an L or RGBA
    image (channels ≠ means); aiayn converts it as transformers would when asked to."""
    ours, theirs = folder_with(tmp_path, size={"height": 16, "width": 16})
    assert ours.do_convert_rgb is None
    for path in save_images(tmp_path, ["L", "RGBA"]):
        with pytest.raises(ValueError, match="mean must have"):
            hf_pixels(theirs, path)
        expected = hf_pixels(theirs, path, do_convert_rgb=True)
        assert (ours.load(path) - expected).abs().max() < TOLERANCE


def test_without_resize_rescale_or_normalisation(tmp_path: Path) -> None:
    ours, theirs = folder_with(tmp_path, do_resize=False, do_rescale=False, do_normalize=False)
    path = save_images(tmp_path, ["RGB"])[0]
    pixels = ours.load(path)
    assert pixels.shape == (3, 23, 37)
    assert torch.equal(pixels, hf_pixels(theirs, path).float())
    one_channel = ImagePreprocessor(do_resize=False, image_mean=(0.5,), image_std=(0.25,))
    grey = one_channel.load(save_images(tmp_path, ["L"])[0])
    assert grey.shape == (1, 23, 37) and grey.min() >= -2.0 and grey.max() <= 2.0


def test_batch_equals_transformers(tmp_path: Path) -> None:
    ours, theirs = folder_with(tmp_path, size={"height": 24, "width": 24})
    paths = save_images(tmp_path, ["RGB"])
    batch = ours.preprocess_batch(paths)
    images = [Image.open(path) for path in paths]
    expected = theirs(images=images, return_tensors="pt").pixel_values
    assert batch.shape == (3, 3, 24, 24)
    assert (batch - expected).abs().max() < TOLERANCE
    unresized = ImagePreprocessor(do_resize=False)
    with pytest.raises(UserError, match=r"RGB-1\.png: \(3, 61, 5\) pixels, unlike"):
        unresized.preprocess_batch(paths)


def test_exif_orientation_applied_as_transformers_load_image(tmp_path: Path) -> None:
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    make_image("RGB", (40, 20)).save(path, exif=exif, quality=95)
    assert open_image(path).size == (20, 40)
    ours, theirs = folder_with(tmp_path, size={"height": 16, "width": 12})
    expected = theirs(images=load_image(str(path)), return_tensors="pt").pixel_values[0]
    assert (ours.load(path) - expected).abs().max() < TOLERANCE


def test_unreadable_files_refused_by_name(tmp_path: Path) -> None:
    preprocessor = ImagePreprocessor()
    with pytest.raises(UserError, match=r"missing\.png: cannot read the image"):
        preprocessor.load(tmp_path / "missing.png")
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(UserError, match=r"notes\.png: cannot read the image"):
        preprocessor.load(text)
    whole = tmp_path / "whole.png"
    make_image("RGB", (64, 64)).save(whole)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(whole.read_bytes()[:200])
    with pytest.raises(UserError, match=r"truncated\.png: cannot read the image"):
        preprocessor.preprocess_batch([whole, truncated])
    four = ImagePreprocessor(do_convert_rgb=False)
    rgba = tmp_path / "rgba.png"
    make_image("RGBA", (8, 8)).save(rgba)
    with pytest.raises(UserError, match=r"rgba\.png: .*4 channels \(mode RGBA\)"):
        four.load(rgba)


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    folder = tmp_path / "cfg"
    folder.mkdir(exist_ok=True)
    (folder / PREPROCESSOR_CONFIG).write_text(json.dumps(config))
    return folder


def test_old_feature_extractor_config_read(tmp_path: Path) -> None:
    """The Hub's ViT folders: ``ViTFeatureExtractor`` with an int size and no rescale keys."""
    old = {"feature_extractor_type": "ViTFeatureExtractor", "size": 224, "resample": 2}
    assert ImagePreprocessor.from_folder(_write(tmp_path, old)) == ImagePreprocessor()


@pytest.mark.parametrize(
    "config, message",
    [
        ({"image_processor_type": "CLIPImageProcessor"}, "'CLIPImageProcessor' is not supported"),
        ({"do_center_crop": True}, "do_center_crop=True is not supported"),
        ({"do_pad": True}, "do_pad=True is not supported"),
        ({"size": {"shortest_edge": 224}}, "size {'shortest_edge': 224} is not supported"),
        ({"resample": 7}, "resample must be one of"),
        ({"image_mean": [0.5, 0.5]}, "one value per channel"),
        ({"image_std": "wide"}, "image_std 'wide' is not a list"),
    ],
)
def test_unsupported_settings_refused_by_name(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(UserError, match=message):
        ImagePreprocessor.from_folder(_write(tmp_path, config))


def test_missing_config_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"preprocessor_config\.json: cannot read"):
        ImagePreprocessor.from_folder(tmp_path)


def _png_header(path: Path, width: int, height: int) -> Path:
    """A PNG of a few dozen bytes whose header claims ``width`` × ``height`` 1-bit pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


def test_the_pixel_limit_is_checked_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiayn import limits

    monkeypatch.setattr(limits, "MAX_IMAGE_PIXELS", 400)
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "at.png")  # 400: read
    assert open_image(tmp_path / "at.png").size == (20, 20)
    Image.fromarray(np.zeros((20, 21, 3), np.uint8)).save(tmp_path / "over.png")
    with pytest.raises(UserError, match=r"over\.png: the image is too large to decode \(21 × 20"):
        open_image(tmp_path / "over.png")
    monkeypatch.undo()  # the real limit, on files that claim huge sizes in a few bytes
    for side in (12000, 20000):  # below, then beyond, twice Pillow's own limit
        huge = _png_header(tmp_path / f"huge{side}.png", side, side)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(UserError, match=r"too large to decode .*the limit is 64,000,000"):
                open_image(huge)
        assert caught == []  # Pillow's DecompressionBombWarning is not printed
