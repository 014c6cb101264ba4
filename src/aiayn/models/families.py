"""The model families a checkpoint may hold: each is a config class and a model class built from
it (its builder), registered under the name a checkpoint records.

Checkpoints record ``family`` and ``format_version`` in their ``state.json``. Format 1 (before
families existed) held only the paper's model, with each stack's embedding and positional
encoding directly under the stack; :func:`upgrade_state_dict` moves them under the stack's
embedder (format 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from aiayn.config import ModelConfig, TransformerConfig
from aiayn.errors import UserError
from aiayn.models.bert import BERT, BertConfig
from aiayn.models.gpt2 import GPT2, GPT2Config
from aiayn.models.t5 import T5, T5Config
from aiayn.models.transformer import Transformer
from aiayn.models.vit import ViT, ViTConfig

FORMAT_VERSION = 2
"""The checkpoint format this version of aiayn writes (and the newest it reads)."""


@dataclass(frozen=True)
class Family:
    """A model family: its name in checkpoints, its config class and its model class."""

    name: str
    config: type[ModelConfig]
    model: type[nn.Module]


FAMILIES: dict[str, Family] = {
    "transformer": Family("transformer", TransformerConfig, Transformer),
    "gpt2": Family("gpt2", GPT2Config, GPT2),
    "t5": Family("t5", T5Config, T5),
    "vit": Family("vit", ViTConfig, ViT),
    "bert": Family("bert", BertConfig, BERT),
}


def family_of(model: nn.Module) -> Family:
    """The registered family of ``model`` (by its exact class)."""
    for family in FAMILIES.values():
        if type(model) is family.model:
            return family
    raise TypeError(f"{type(model).__name__} is not a registered model family")


def family_named(name: str) -> Family:
    """The family called ``name``; an unknown one is a :class:`UserError` naming it."""
    if name not in FAMILIES:
        raise UserError(f"unknown model family {name!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[name]


RETIRED_CONFIG_KEYS: dict[str, tuple[str, ...]] = {"transformer": ("label_smoothing",)}
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
