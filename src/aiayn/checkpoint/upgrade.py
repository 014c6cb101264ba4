"""Checkpoint format versions: the version this aiayn writes, and what older versions wrote
brought up to date on load.

Checkpoints record ``family`` and ``format_version`` in their ``state.json``. Format 1 (before
families existed) held only the paper's model, with each stack's embedding and positional
encoding directly under the stack; :func:`upgrade_state_dict` moves them under the stack's
embedder (format 2).
"""

from __future__ import annotations

from torch import Tensor

from aiayn.errors import UserError
from aiayn.models.families import DEFAULT_FAMILY

FORMAT_VERSION = 2
"""The checkpoint format this version of aiayn writes (and the newest it reads)."""

RETIRED_CONFIG_KEYS: dict[str, tuple[str, ...]] = {DEFAULT_FAMILY: ("label_smoothing",)}
"""Keys older checkpoints recorded in a family's model config that are no longer part of it
(label smoothing is a training setting: ``train.label_smoothing``)."""


def upgrade_config(family: str, values: dict[str, object]) -> dict[str, object]:
    """A recorded model config without the keys its family retired."""
    retired = RETIRED_CONFIG_KEYS.get(family, ())
    return {k: v for k, v in values.items() if k not in retired}


_FORMAT_1_MOVES = {
    f"{stack}.{part}.": f"{stack}.embedder.{part}."
    for stack in ("encoder", "decoder")
    for part in ("embedding", "positional")
}


def upgrade_state_dict(tensors: dict[str, Tensor], format_version: int) -> dict[str, Tensor]:
    """Tensor names of a checkpoint written in ``format_version`` -> the current names."""
    if format_version > FORMAT_VERSION:
        raise UserError(
            f"checkpoint format {format_version} is newer than this aiayn reads "
            f"({FORMAT_VERSION}): upgrade aiayn"
        )
    if format_version >= 2:
        return tensors
    upgraded = {}
    for name, tensor in tensors.items():
        for old, new in _FORMAT_1_MOVES.items():
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        upgraded[name] = tensor
    return upgraded
