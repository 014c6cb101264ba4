"""The classifiers' log lines (aiayn.training.task): hand-checked values."""

from __future__ import annotations

from aiayn.training.task import accuracy_line, accuracy_on_test


def test_accuracy_lines() -> None:
    metrics = {"loss": 0.25, "accuracy": 75.0, "correct": 3, "images": 4}
    assert accuracy_line(metrics, "images") == "loss 0.250 accuracy 75.00% (4 images)"
    assert accuracy_on_test(metrics, "images") == "test: accuracy 75.00% (3/4 images)"
