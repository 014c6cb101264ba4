"""The evaluation sums every task shares (aiayn.evaluation.perplexity): hand-checked values."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.evaluation.perplexity import PPL_LOG_CAP, EvalTally, perplexity
from aiayn.layers.loss import LossSums


def _sums(loss: float, nll: float, tokens: int) -> LossSums:
    return LossSums(torch.tensor(loss), torch.tensor(nll), torch.tensor(tokens))


def test_perplexity_is_exp_of_the_mean_nll() -> None:
    assert perplexity(math.log(4.0)) == pytest.approx(4.0)
    assert perplexity(0.0) == 1.0


def test_perplexity_of_a_diverged_model_is_capped_not_an_overflow() -> None:
    with pytest.raises(OverflowError):
        math.exp(1e4)
    assert perplexity(1e4) == math.exp(PPL_LOG_CAP)
    assert math.isfinite(perplexity(1e4))


def test_tally_sums_batches_and_divides_by_the_count() -> None:
    tally = EvalTally()
    tally.add(_sums(6.0, 4.0, 2), correct=1)
    tally.add(_sums(6.0, 4.0, 2), correct=torch.tensor(2))
    metrics = tally.metrics(4, "images", accuracy=True)
    assert metrics == pytest.approx(
        {"loss": 3.0, "nll": 2.0, "ppl": math.exp(2.0), "accuracy": 75.0, "correct": 3, "images": 4}
    )
    assert list(metrics) == ["loss", "nll", "ppl", "accuracy", "correct", "images"]


def test_tally_without_accuracy_and_with_nothing_counted() -> None:
    tally = EvalTally()
    tally.add(_sums(3.0, 2.0, 1))
    assert tally.metrics(1, "tokens") == pytest.approx(
        {"loss": 3.0, "nll": 2.0, "ppl": math.exp(2.0), "tokens": 1}
    )
    assert EvalTally().metrics(0, "tokens") == {"loss": 0.0, "nll": 0.0, "ppl": 1.0, "tokens": 0}
