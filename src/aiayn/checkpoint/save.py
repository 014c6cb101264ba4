"""Saving a checkpoint folder: weights, optimizer moments, ``state.json``, the tokenizer and
``SHA256SUMS`` (last) into ``NAME.tmp``, renamed into place (:mod:`aiayn.checkpoint.files`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_model
from torch import nn

from aiayn.checkpoint.checksums import write_checksums
from aiayn.checkpoint.files import (
    CHECKSUM_FILE,
    MODEL_FILE,
    STATE_FILE,
    TMP,
    beside,
    commit,
    reason,
    recover,
    umask_mode,
)
from aiayn.checkpoint.optimizer import write_optimizer
from aiayn.checkpoint.tokenizers import TokenizerSource, write_tokenizer
from aiayn.checkpoint.upgrade import FORMAT_VERSION
from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.layers.quantized import is_quantized
from aiayn.models.families import family_of


def save_checkpoint(
    path: Path,
    model: nn.Module,
    state: dict[str, Any],
    tokenizer_file: TokenizerSource,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint folder atomically, replacing ``path`` if it exists (a crash at any
    point leaves a complete checkpoint at ``path`` or ``path.old``).

    ``optimizer_state`` (an ``optimizer.state_dict()``, e.g. gathered from FSDP shards) is saved
    instead of ``optimizer``'s own state when given.

    Raises:
        UserError: the folder cannot be written (disk full, read-only, …), naming it; earlier
            checkpoints are intact and no temporary folder is left behind.
    """
    if optimizer_state is None and optimizer is not None:
        optimizer_state = optimizer.state_dict()
    full_state = _full_state(model, state, optimizer_state)
    tmp = beside(path, TMP)
    try:
        recover(path)
        tmp.mkdir(parents=True)
        _write_model(tmp, model)
        if optimizer_state is not None:
            write_optimizer(tmp, optimizer_state)
        write_tokenizer(tmp, tokenizer_file)
        _write_state(tmp, full_state)
        write_checksums(tmp)
        commit(tmp, path)
    except (OSError, SafetensorError) as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"cannot write the checkpoint {path}: {reason(error)} (nothing was replaced)"
        ) from None
    return path


def _full_state(
    model: nn.Module, state: dict[str, Any], optimizer_state: dict[str, Any] | None
) -> dict[str, Any]:
    """``state`` plus the family, format, model config, optimizer layout, checksum file and how
    the weights are stored (``"quantization": "int8"`` for a quantised model)."""
    config = model.config
    assert isinstance(config, ModelConfig)
    full = {
        **state,
        "family": family_of(model).name,
        "format_version": FORMAT_VERSION,
        "model_config": config.to_dict(),
        "checksums": CHECKSUM_FILE,
    }
    if optimizer_state is not None:
        full["optimizer"] = {"param_groups": optimizer_state["param_groups"]}
    full.pop("quantization", None)
    if is_quantized(model):  # int8 layers (aiayn.layers.quantized): loaded as they are
        full["quantization"] = "int8"
    return full


def _write_model(folder: Path, model: nn.Module) -> None:
    save_model(model, str(folder / MODEL_FILE))
    os.chmod(folder / MODEL_FILE, umask_mode())  # safetensors writes 0600: see save_safetensors


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    """``state.json``, with the manifest of the checkpoint's files (``"files"``: those already
    written and itself; ``SHA256SUMS`` must list exactly these)."""
    files = sorted({p.name for p in folder.iterdir()} | {STATE_FILE})
    text = json.dumps({**state, "files": files}, indent=1)
    (folder / STATE_FILE).write_text(text, encoding="utf-8")
