"""Training and validation curves as a PNG (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_curves(
    history: Sequence[dict[str, Any]],
    path: Path,
    metric: str = "bleu",
    label: str = "BLEU",
    title: str = "validation BLEU (greedy)",
) -> None:
    """Plot training loss, validation loss and the validation ``metric`` (BLEU, perplexity…)
    against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [h for h in history if h["kind"] == "train"]
    valid = [h for h in history if h["kind"] == "valid"]
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(10, 4))
    if train:
        ax_loss.plot([h["step"] for h in train], [h["loss"] for h in train], label="train loss")
    if valid:
        ax_loss.plot(
            [h["step"] for h in valid], [h["loss"] for h in valid], "o-", label="valid loss"
        )
        ax_metric.plot([h["step"] for h in valid], [h[metric] for h in valid], "o-", color="C2")
    ax_loss.set(xlabel="step", ylabel="label-smoothed cross-entropy", title="loss")
    ax_loss.legend()
    ax_metric.set(xlabel="step", ylabel=label, title=title)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=80)
    plt.close(fig)
    tmp.replace(path)
