"""Checkpoint averaging (§6.1): "For the base models, we used a single model obtained by
averaging the last 5 checkpoints" — the element-wise mean of their weights, saved as a new
checkpoint."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from aiayn.checkpoint.load import load_checkpoint
from aiayn.checkpoint.save import save_checkpoint
from aiayn.checkpoint.tokenizers import checkpoint_tokenizer
from aiayn.errors import UserError


def average_checkpoints(paths: list[Path], out: Path) -> Path:
    """Average the parameters of ``paths`` into a new checkpoint at ``out`` (§6.1).

    Tied weights stay tied: the averaged tensors are loaded into a freshly built (tied) model.
    The state, tokenizer and config are taken from the newest checkpoint.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    newest = load_checkpoint(paths[-1], expect=nn.Module, fp32_for="averaging")
    total = {name: t.double() for name, t in newest.model.state_dict().items()}
    for path in paths[:-1]:
        other = load_checkpoint(path, expect=nn.Module, fp32_for="averaging")
        if other.config != newest.config:
            raise UserError(f"{path} has a different model config from {paths[-1]}")
        for name, tensor in other.model.state_dict().items():
            total[name] += tensor.double()
    averaged = {name: (t / len(paths)).float() for name, t in total.items()}
    model = newest.model
    model.load_state_dict(averaged)
    state = {**newest.state, "averaged_from": [str(p) for p in paths]}
    state.pop("optimizer", None)
    return save_checkpoint(out, model, state, checkpoint_tokenizer(newest.path))
