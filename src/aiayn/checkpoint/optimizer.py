"""``optimizer.safetensors``: the optimizer's per-parameter state (Adam's moments) of a
resumable checkpoint, keyed ``"<parameter index>.<name>"``; its layout (the parameter groups and
their hyper-parameters) is in ``state.json`` under ``"optimizer"``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint.checksums import read_checksums, verify_files
from aiayn.checkpoint.files import (
    OPTIMIZER_FILE,
    CheckpointError,
    read_safetensors,
    save_safetensors,
)


def write_optimizer(folder: Path, optimizer_state: dict[str, Any]) -> None:
    """The moments of ``optimizer_state`` (an ``optimizer.state_dict()``) as safetensors; their
    layout goes into ``state.json`` (written by the caller)."""
    save_safetensors(_optimizer_to_flat(optimizer_state), folder / OPTIMIZER_FILE)


def _optimizer_to_flat(sd: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``sd``'s per-parameter tensors keyed ``"<parameter index>.<name>"``, on the CPU."""
    return {
        f"{index}.{name}": value.detach().contiguous().cpu()
        for index, per_param in sd["state"].items()
        for name, value in per_param.items()
        if isinstance(value, torch.Tensor)
    }


def read_optimizer_state(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The ``optimizer.state_dict()`` saved with checkpoint ``path`` (parameter indices),
    checked against ``SHA256SUMS``; ``state``: the checkpoint's ``state.json``.

    Raises:
        CheckpointError: the file is missing, corrupt or malformed, or ``state`` has no
            optimizer layout, naming the file.
    """
    file = path / OPTIMIZER_FILE
    verify_files(path, read_checksums(path), [OPTIMIZER_FILE])
    flat = read_safetensors(file, "optimizer state")
    try:
        groups = state["optimizer"]["param_groups"]
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, tensor in flat.items():
            index, name = key.split(".", 1)
            per_param.setdefault(int(index), {})[name] = tensor
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{file}: not an optimizer state aiayn wrote ({error})") from None
    return {"state": per_param, "param_groups": groups}


def load_optimizer(path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore the optimizer saved with checkpoint ``path`` into ``optimizer``.

    Raises:
        CheckpointError: the saved state is missing, corrupt or does not fit ``optimizer``'s
            parameters, naming the file.
    """
    load_optimizer_state(path, optimizer, read_optimizer_state(path, state))


def load_optimizer_state(
    path: Path, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """Load ``saved`` (:func:`read_optimizer_state` of checkpoint ``path``) into ``optimizer``
    after checking each moment's shape against its parameter's."""
    file = path / OPTIMIZER_FILE
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, per_param in saved["state"].items():
        if not 0 <= index < len(params):
            raise CheckpointError(
                f"{file}: state of parameter {index}, but there are {len(params)}"
            )
        for name, tensor in per_param.items():
            if tensor.dim() > 0 and tensor.shape != params[index].shape:
                raise CheckpointError(
                    f"{file}: {index}.{name} has shape {list(tensor.shape)}, its parameter "
                    f"{list(params[index].shape)} (written for another model?)"
                )
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{file}: does not fit the optimizer ({error})") from None
