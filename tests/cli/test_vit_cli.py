"""``aiayn convert`` and ``classify-image`` on a Hugging Face ViT folder, offline: the checkpoint
holds the image preprocessing, and the top labels and probabilities equal transformers' own
(its image processor and ``ViTForImageClassification``) on files of odd sizes and modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from aiayn.cli.main import main

LABELS = {0: "cat", 1: "dog", 2: "fox", 3: "owl"}


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("vit")
    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=4, id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    )  # fmt: skip
    torch.manual_seed(0)
    hf = ViTForImageClassification(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "layernorm" in name and name.endswith("weight") else 0.0, 0.3)
    processor = ViTImageProcessor(size={"height": 32, "width": 32})
    hf.save_pretrained(root / "hf")
    processor.save_pretrained(root / "hf")
    assert main(["convert", "--from-hf", str(root / "hf"), "--to", str(root / "ckpt")]) == 0
    rng = np.random.default_rng(0)
    images = []
    for i, (size, mode) in enumerate((((40, 30), "RGB"), ((17, 50), "RGB"), ((32, 32), "RGB"))):
        path = root / f"img{i}.png"
        array = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(array).convert(mode).save(path)
        images.append(path)
    return {"hf": hf, "processor": processor, "ckpt": root / "ckpt", "images": images}


@torch.no_grad()
def test_top_labels_equal_transformers(
    vit: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    args = ["classify-image", "--checkpoint", str(vit["ckpt"]), "--top-k", "3", "--batch-size", "2"]
    assert main([*args, *map(str, vit["images"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 * len(vit["images"])
    pixels = vit["processor"]([Image.open(p) for p in vit["images"]], return_tensors="pt")
    probs = torch.softmax(vit["hf"](**pixels).logits, dim=-1)
    top = probs.topk(3, dim=-1)
    for i, path in enumerate(vit["images"]):
        block = lines[4 * i : 4 * i + 4]
        assert block[0] == str(path)
        for r in range(3):
            p, label = block[1 + r].split("\t")
            assert abs(float(p) - top.values[i, r].item()) < 1e-4
            assert label == LABELS[int(top.indices[i, r])]
    assert (
        len({line for i in range(3) for line in lines[4 * i + 1 : 4 * i + 2]}) > 1
    )  # not constant


def test_refusals(vit: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    capsys.readouterr()
    assert main(["classify-image", "--checkpoint", str(vit["ckpt"]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.png" in err and "\n" not in err.strip()
    assert main(["classify-image", "--checkpoint", str(vit["ckpt"]), "--top-k", "9", str(bad)]) == 2
    assert "--top-k must be in 1..4" in capsys.readouterr().err
    assert main(["translate", "--checkpoint", str(vit["ckpt"])]) == 2
    assert "holds a vit model" in capsys.readouterr().err


@torch.no_grad()
def test_written_back_preprocessing_and_model_equal_the_original(
    vit: dict[str, Any], tmp_path: Path
) -> None:
    """``aiayn convert --checkpoint --to-hf``: transformers' image processor of the written
    folder gives the original's pixels, its classifier the original's logits and labels."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    out = tmp_path / "back"
    assert main(["convert", "--checkpoint", str(vit["ckpt"]), "--to-hf", str(out)]) == 0
    images = [Image.open(p) for p in vit["images"]]
    pixels = AutoImageProcessor.from_pretrained(out)(images, return_tensors="pt").pixel_values
    assert torch.equal(pixels, vit["processor"](images, return_tensors="pt").pixel_values)
    again = AutoModelForImageClassification.from_pretrained(out).eval()
    assert (
        again(pixel_values=pixels).logits - vit["hf"](pixel_values=pixels).logits
    ).abs().max() < 1e-5
    assert again.config.id2label == vit["hf"].config.id2label
