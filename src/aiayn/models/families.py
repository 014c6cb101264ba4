"""The model families a checkpoint may hold: each is a config class and a model class built from
it (its builder), registered under the name a checkpoint records (its format versions:
:mod:`aiayn.checkpoint.upgrade`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from aiayn.config import ModelConfig, TransformerConfig
from aiayn.errors import UserError
from aiayn.models.bert import BERT, BertConfig
from aiayn.models.gpt2 import GPT2, GPT2Config
from aiayn.models.t5 import T5, T5Config
from aiayn.models.transformer import Transformer
from aiayn.models.vit import ViT, ViTConfig


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
