"""Fixtures for training tests: tiny corpora written to disk and tiny run configs; the tiny
builders of Hugging Face T5 and Marian tokenizers of
``tests/data/conftest.py`` (loaded from its path, as ``tests/cli/conftest.py`` does)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from aiayn.training.config import RunConfig, run_config_from_dict
from data_builders import data_conftest

if TYPE_CHECKING:
    from aiayn.training.trainer import Trainer

LETTERS = "abcdefghij"


_data = data_conftest()
make_hf_t5_tokenizer = _data.make_hf_t5_tokenizer
make_marian_vocab = _data.make_marian_vocab


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


def resume_matches_straight_run(run: Callable[[Path, int, int], RunConfig], root: Path) -> Trainer:
    """Train 12 steps straight, and 7 steps then resumed to 12 (``run(folder, max_steps,
    save_every)`` builds the config); assert the two end bit for bit equal, at the same data
    position; return the straight trainer."""
    from aiayn.training.trainer import Trainer

    straight = Trainer(run(root / "a", 12, 5))
    straight.fit()
    Trainer(run(root / "b", 7, 7)).fit()
    resumed = Trainer(run(root / "b", 12, 5), resume=True)
    assert resumed.step == 7 and resumed.optimizer.state_dict()["state"]
    resumed.fit()
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert (straight.epoch, straight.batch_index) == (resumed.epoch, resumed.batch_index)
    return straight


@pytest.fixture
def resume_check() -> Callable[..., Trainer]:
    """The :func:`resume_matches_straight_run` helper, as a fixture."""
    return resume_matches_straight_run
