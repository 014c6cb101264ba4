"""Fixtures for training tests: tiny corpora written to disk and tiny run configs."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from aiayn.training.config import RunConfig, run_config_from_dict

LETTERS = "abcdefghij"


def write_reverse_task(folder: Path, n: int, seed: int, *, reverse: bool = True) -> Path:
    """A TSV of "x1 x2 … xk<TAB>xk … x1" with k in 3..7 letters from a 10-letter alphabet."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(LETTERS) for _ in range(rng.randint(3, 7))]
        target = words[::-1] if reverse else words
        lines.append(f"{' '.join(words)}\t{' '.join(target)}")
    path = folder / f"reverse_{seed}.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tiny_run(
    run_dir: Path,
    train: Path,
    valid: Path | None = None,
    model: dict[str, object] | None = None,
    **train_cfg: object,
) -> RunConfig:
    """A 2+2-layer d_model=64 model on a toy corpus, no progress bar."""
    data: dict[str, object] = {
        "train_src": str(train),
        "vocab_size": 300,
        "min_frequency": 1,
        "bleu_sentences": 100,
    }
    if valid is not None:
        data["valid_src"] = str(valid)
    else:
        data["valid_size"] = 20
    return run_config_from_dict(
        {
            "run_dir": str(run_dir),
            "model": {
                "preset": "tiny",
                "d_model": 64,
                "d_ff": 128,
                "num_heads": 4,
                "dropout": 0.1,
                **(model or {}),
            },
            "data": data,
            "train": {
                "max_tokens": 600,
                "warmup_steps": 50,
                "lr_scale": 0.2,  # peak lr 0.2 · (64 · 50)^-0.5 = 3.5e-3
                "eval_every": 0,
                "save_every": 0,
                "log_every": 10,
                "progress": False,
                "seed": 3,
                **train_cfg,
            },
        }
    )


@pytest.fixture
def reverse_task() -> Callable[..., Path]:
    """The :func:`write_reverse_task` helper, as a fixture."""
    return write_reverse_task


@pytest.fixture
def make_run() -> Callable[..., RunConfig]:
    """The :func:`tiny_run` helper, as a fixture."""
    return tiny_run


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aiayn.training.trainer.log", lambda message: None)
