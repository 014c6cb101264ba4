"""The image-classification task (family vit) through the one trainer: a tiny ViT learns
scikit-learn's 8×8 digits, its checkpoints hold the ViT and the image preprocessing that
`aiayn classify-image` reads, it resumes exactly (with shifts and dropout), the split and the
pixels are what the module says, and its config is validated key by key."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.cli.main import main
from aiayn.data.digits import (
    DIGITS_COUNT,
    ImageBatchSampler,
    load_digit_images,
    random_shift,
    save_digit_png,
    split_digits,
    to_pixels,
)
from aiayn.data.images import ImagePreprocessor
from aiayn.errors import ConfigError
from aiayn.models.vit import ViT, vit_preset
from aiayn.training.config import (
    RunConfig,
    load_run_config,
    run_config_from_dict,
)
from aiayn.training.images import VIT_DEMO_CONFIG, ImageClassificationObjective, ImageData
from aiayn.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def vit_config(run_dir: Path, **train: Any) -> dict[str, Any]:
    """A 2-layer d_model=32 ViT on the digits, batches of 64 images, no progress bar."""
    return {
        "run_dir": str(run_dir),
        "model": {
            "family": "vit",
            "preset": "vit-tiny-digits",
            "d_model": 32,
            "num_heads": 2,
            "num_layers": 2,
            "d_ff": 64,
        },
        "data": {"valid_size": 180, "test_size": 180},
        "train": {
            "max_tokens": 64,
            "warmup_steps": 50,
            "lr_scale": 0.5,  # peak lr 0.5 · (32 · 50)^-0.5 = 1.25e-2
            "eval_every": 0,
            "save_every": 0,
            "log_every": 10,
            "progress": False,
            "threads": 2,
            "seed": 3,
            **train,
        },
    }


def vit_run(run_dir: Path, data: dict[str, Any] | None = None, **train: Any) -> RunConfig:
    values = vit_config(run_dir, **train)
    values["data"].update(data or {})
    return run_config_from_dict(values)


def test_the_vit_learns_and_its_checkpoints_classify_images(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """800 steps (seconds): loss falls, validation accuracy far above chance (10%); the
    checkpoints hold family vit and the preprocessing, and classify-image reads a PNG of a test
    digit into the very pixels training used and gives the trainer's predictions."""
    run = vit_run(tmp_path / "r", max_steps=800, eval_every=200, keep_last=2)
    trainer = Trainer(run)
    before = trainer.evaluate()
    result = trainer.fit()
    after = result.valid
    assert before["accuracy"] < 30.0 and after["accuracy"] >= 80.0, (before, after)
    assert after["loss"] < 0.5 * before["loss"], (before, after)
    assert after["loss"] == after["nll"]  # no label smoothing by default
    assert result.test is not None and result.test["accuracy"] >= 80.0, result.test
    assert result.test["images"] == 180 and after["images"] == 180
    assert trainer.task.criterion.metric == "accuracy"

    # checkpoints: family vit, the model config with the digits' labels, the preprocessing
    ckpts = list_checkpoints(tmp_path / "r")
    assert [p.name for p in ckpts] == ["step_00000600", "step_00000800"]
    state = json.loads((ckpts[-1] / "state.json").read_text())
    assert state["family"] == "vit" and state["run_config"]["model"]["family"] == "vit"
    ckpt = load_checkpoint(ckpts[-1], expect=ViT)
    assert ckpt.config.id2label == tuple("0123456789") and ckpt.config.d_model == 32
    preprocessor = ImagePreprocessor.from_folder(ckpts[-1])
    assert isinstance(trainer.data, ImageData) and preprocessor == trainer.data.preprocessor
    assert preprocessor.size == (8, 8) and preprocessor.channels == 1
    assert preprocessor.rescale_factor == 1 / 16 and 0.2 < preprocessor.image_mean[0] < 0.4
    # best = highest validation accuracy, with its preprocessing
    metrics = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    accuracy = [e["accuracy"] for e in metrics if e["kind"] == "valid"]
    best = tmp_path / "r" / "checkpoints" / "best"
    best_state = json.loads((best / "state.json").read_text())
    assert best_state["best_accuracy"] == max(accuracy) == best_state["metrics"]["accuracy"]
    assert (best / "preprocessor_config.json").is_file()
    assert [e["kind"] for e in metrics].count("test") == 1

    # classify-image: a PNG of a test digit's raw values -> the training pixels -> same label
    images, labels = load_digit_images()
    test_ids = split_digits(labels, 180, 180, seed=0).test[:4]
    pngs = [save_digit_png(images[i], tmp_path / f"digit_{i}.png") for i in test_ids]
    pixels = to_pixels(images[test_ids], preprocessor)
    assert torch.equal(preprocessor.preprocess_batch(pngs), pixels)
    with torch.no_grad():
        logits = ckpt.model(pixels).logits
    assert logits is not None
    capsys.readouterr()
    args = ["classify-image", "--checkpoint", str(ckpts[-1]), "--top-k", "1"]
    assert main([*args, *map(str, pngs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[1] for line in lines[1::2]] == [
        str(k) for k in logits.argmax(-1).tolist()
    ]


def test_resume_continues_exactly(tmp_path: Path, resume_check: Callable[..., Trainer]) -> None:
    """n steps straight == k steps, stop, resume to n, bit for bit (dropout and shifts on)."""

    def run(folder: Path, steps: int, save_every: int) -> RunConfig:
        return vit_run(
            folder,
            {"valid_size": 100, "shift": 1},
            max_tokens=256,  # 1517 training images: 6 batches an epoch
            max_steps=steps,
            save_every=save_every,
        )

    straight = resume_check(run, tmp_path)
    assert straight.epoch >= 1  # the runs crossed an epoch boundary after the resume
    assert straight.model.config.dropout == 0.1


def test_the_objective_is_the_cross_entropy_of_the_logits() -> None:
    model = ViT(vit_preset("vit-tiny-digits", dropout=0.0)).eval()
    pixels, labels = torch.randn(5, 1, 8, 8), torch.tensor([0, 3, 9, 3, 1])
    sums = ImageClassificationObjective(model, 0.1)(pixels, labels)
    logits = model(pixels).logits
    assert logits is not None
    want = F.cross_entropy(logits, labels, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(sums.loss, want)
    torch.testing.assert_close(sums.nll, F.cross_entropy(logits, labels, reduction="sum"))
    assert int(sums.tokens) == 5


def test_the_split_is_seeded_disjoint_and_stratified() -> None:
    _, labels = load_digit_images()
    assert len(labels) == DIGITS_COUNT
    splits = split_digits(labels, 180, 180, seed=0)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (1437, 180, 180)
    together = np.concatenate(splits)
    assert np.array_equal(np.sort(together), np.arange(DIGITS_COUNT))
    for part in (splits.valid, splits.test):
        assert np.bincount(labels[part], minlength=10).min() >= 17  # ~18 of each digit
        assert np.bincount(labels[part], minlength=10).max() <= 19
    again, other = split_digits(labels, 180, 180, seed=0), split_digits(labels, 180, 180, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(splits, again, strict=True))
    assert not np.array_equal(splits.test, other.test)


def test_shifts_move_whole_images_and_batches_are_seeded() -> None:
    torch.manual_seed(0)
    pixels = torch.randn(32, 1, 8, 8)
    moved = random_shift(pixels, 1, background=-5.0)
    for original, image in zip(pixels, moved, strict=True):
        matches = []
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                want = torch.full_like(original, -5.0)
                ys, xs = slice(max(dy, 0), 8 + min(dy, 0)), slice(max(dx, 0), 8 + min(dx, 0))
                yo, xo = slice(max(-dy, 0), 8 + min(-dy, 0)), slice(max(-dx, 0), 8 + min(-dx, 0))
                want[:, ys, xs] = original[:, yo, xo]
                matches.append(torch.equal(image, want))
        assert sum(matches) == 1
    sampler = ImageBatchSampler(10, 4, seed=2)
    assert len(sampler) == 3 and [len(b) for b in sampler.batches(0)] == [4, 4, 2]
    assert sampler.batches(1) == ImageBatchSampler(10, 4, seed=2).batches(1)
    assert sorted(i for batch in sampler.batches(1) for i in batch) == list(range(10))


def test_vit_digits_yaml_equals_builtin_and_loads() -> None:
    assert yaml.safe_load((ROOT / "configs" / "vit_digits.yaml").read_text()) == VIT_DEMO_CONFIG
    run = load_run_config(ROOT / "configs" / "vit_digits.yaml")
    assert (run.family, run.model.d_model, run.model_preset) == ("vit", 64, "vit-tiny-digits")
    assert run.train.label_smoothing == 0.1 and run.data.shift == 1
    assert run_config_from_dict(run.to_dict()) == run
    assert load_run_config(None, demo="vit") == run  # `aiayn train --demo vit`


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"block_size": 64}}, r"data\.block_size is a language model key"),
        ({"data": {"train_src": "x.tsv"}}, r"data\.train_src is a translation key"),
        ({"data": {"images": 5}}, r"unknown data config key\(s\): images"),
        ({"data": {"dataset": "mnist"}}, r"data\.dataset must be one of 'digits', got 'mnist'"),
        ({"data": {"valid_size": 0}}, r"data\.valid_size must be >= 1"),
        ({"data": {"shift": -1}}, r"data\.shift must be >= 0"),
        ({"data": {"test_size": 1700}}, r"data\.valid_size=180 and data\.test_size=1700 leave"),
        ({"model": {"image_size": 16}}, r"model\.image_size=16 does not fit the digits"),
        ({"model": {"num_channels": 3}}, r"model\.num_channels=3 does not fit the digits"),
        ({"model": {"num_labels": 5, "id2label": []}}, r"model\.num_labels=5 does not fit"),
        ({"model": {"vocab_size": 100}}, r"unknown model config key\(s\): vocab_size"),
        ({"model": {"preset": "small"}}, r"unknown ViT preset 'small'"),
        ({"model": {"init_from": "x"}}, r"init_from must be a checkpoint folder of family trans"),
        ({"train": {"label_smoothing": 1.5}}, r"train\.label_smoothing must be in \[0, 1\)"),
    ],
)
def test_vit_config_errors_name_the_key(
    tmp_path: Path, change: dict[str, dict[str, Any]], message: str
) -> None:
    values = vit_config(tmp_path)
    for section, entries in change.items():
        values[section] = {**values[section], **entries}
    with pytest.raises(ConfigError, match=message):
        run_config_from_dict(values)


def test_other_families_refuse_image_keys() -> None:
    with pytest.raises(ConfigError, match=r"data\.shift is an image classification key"):
        load_run_config(None, ["data.shift=1"])
    with pytest.raises(ConfigError, match=r"data\.split_seed is an image classification key"):
        load_run_config(None, ["data.split_seed=1"], demo="lm")


def test_train_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "vit.yaml"
    file.write_text(yaml.safe_dump(vit_config(tmp_path / "run", max_steps=3)))
    assert main(["train", "--config", str(file), "--set", "train.average_last=0"]) == 0
    out = capsys.readouterr().out
    assert "trained 3 steps" in out and "validation: accuracy" in out, out
    assert "best checkpoint: accuracy" in out and "test: accuracy" in out, out
    args = ["train", "--demo", "vit", "--run-dir", str(tmp_path / "demo")]
    assert main([*args, "--set", "train.max_steps=2", "--set", "train.average_last=0"]) == 0
    assert "trained 2 steps" in capsys.readouterr().out
