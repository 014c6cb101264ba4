"""What every converter shares around its name table: the activation names Hugging Face configs
use (and the encoder fields BERT-style configs name alike), the renaming of a checkpoint's
tensors with q/k/v thirds fused, and the exact load (every parameter given, nothing left over,
every shape as the config says).

Shape legend:  (any tensor shapes; the model's state dict is the reference)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from aiayn.errors import UserError

HF_ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
"""Hugging Face activation names (``hidden_act``, ``activation_function``, the last part of T5's
``feed_forward_proj``) -> aiayn's activation computing the same function."""


def encoder_fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a BERT-style Hugging Face ``config.json`` (BERT's, ViT's) that aiayn's
    BERT and ViT configs share: the encoder's sizes, activation, dropouts and ε."""
    return {
        "d_model": hf["hidden_size"],
        "num_heads": hf["num_attention_heads"],
        "num_layers": hf["num_hidden_layers"],
        "d_ff": hf["intermediate_size"],
        "activation": HF_ACTIVATIONS[hf["hidden_act"]],
        "dropout": float(hf["hidden_dropout_prob"]),
        "attention_dropout": float(hf["attention_probs_dropout_prob"]),
        "layer_norm_eps": float(hf["layer_norm_eps"]),
    }


class Rule(NamedTuple):
    """Where a Hugging Face tensor goes: an aiayn name (a layer index written ``{}``) and, for a
    projection Hugging Face stores in three, its block of rows of aiayn's fused ``in_proj``."""

    name: str
    part: int | None = None  # 0, 1, 2: the W^Q, W^K, W^V rows of a fused in_proj


def rename(name: str, table: Mapping[str, Rule]) -> Rule | None:
    """``name``'s rule in a name ``table`` (keys and names with the layer index written
    ``{}``), its index filled in; None when the table has no such name."""
    if name in table:
        return table[name]
    match = re.search(r"\.(\d+)\.", name)
    if match is None:
        return None
    rule = table.get(f"{name[: match.start()]}.{{}}.{name[match.end() :]}")
    return None if rule is None else Rule(rule.name.format(match.group(1)), rule.part)


def place_all(
    tensors: Iterable[tuple[str, Tensor]], table: Mapping[str, Rule], model: str
) -> tuple[dict[str, Tensor], dict[str, dict[int, Tensor]]]:
    """Each ``(name, tensor)`` renamed by ``table``: the whole tensors by aiayn name, and apart
    the thirds of fused projections by aiayn name and :attr:`Rule.part` (for :func:`fuse_parts`).

    Raises:
        UserError: naming a tensor the table has no rule for (not part of ``model``, e.g.
            "a T5 model").
    """
    state: dict[str, Tensor] = {}
    parts: dict[str, dict[int, Tensor]] = {}
    for name, tensor in tensors:
        rule = rename(name, table)
        if rule is None:
            raise UserError(f"unexpected tensor {name!r}: not part of {model}")
        if rule.part is None:
            state[rule.name] = tensor
        else:
            parts.setdefault(rule.name, {})[rule.part] = tensor
    return state, parts


def fuse_parts(
    parts: Mapping[str, Mapping[int, Tensor]], labels: tuple[str, str, str]
) -> dict[str, Tensor]:
    """The projections Hugging Face stores in three (W^Q, W^K, W^V or their biases, by
    :attr:`Rule.part`) as the rows of aiayn's fused ``in_proj``: 3 × (I, …) -> (3I, …).

    Raises:
        UserError: naming (by ``labels``, e.g. ``("q", "k", "v")``) a missing third.
    """
    fused = {}
    for name, blocks in parts.items():
        if sorted(blocks) != [0, 1, 2]:
            missing = labels[min(set(range(3)) - set(blocks))]
            raise UserError(f"missing tensor {missing!r} of the attention that goes to {name!r}")
        fused[name] = torch.cat([blocks[0], blocks[1], blocks[2]])  # 3 × (I, …) -> (3I, …)
    return fused


def load_exactly(
    model: nn.Module,
    state: Mapping[str, Tensor],
    *,
    name: Callable[[str], str] = repr,
    shape: Callable[[str, torch.Size], tuple[int, ...]] = lambda key, size: tuple(size),
    extra_hint: str = "the config has no place for it",
) -> None:
    """Load ``state`` into ``model`` in place (``assign``: the checkpoint's own tensors) after
    checking it is exactly the model's parameters: a :class:`UserError` names the first
    unexpected, missing or mis-shaped tensor (``name`` renders an aiayn name and ``shape`` an
    aiayn name's shape, e.g. back in Hugging Face's terms). Tied parameters must be re-tied by
    the caller afterwards."""
    expected = model.state_dict()
    extra, missing = sorted(state.keys() - expected.keys()), sorted(expected.keys() - state.keys())
    if extra:
        raise UserError(f"unexpected tensor {name(extra[0])}: {extra_hint}")
    if missing:
        raise UserError(f"missing tensor {name(missing[0])} in the checkpoint")
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise UserError(
                f"tensor {name(key)} has shape {shape(key, tensor.shape)}; the config says "
                f"{shape(key, expected[key].shape)}"
            )
    model.load_state_dict(dict(state), strict=True, assign=True)


def check_field_types(
    hf_config: Mapping[str, Any], defaults: Mapping[str, Any], *, skip: Collection[str] = ()
) -> None:
    """Every field of ``hf_config`` that ``defaults`` (transformers' defaults of the family's
    config class) lists has the type of its default: an integer, a number (an integer or a
    float), a bool or a string; a field whose default is None takes None or a number. ``skip``:
    fields the converter checks itself (a ViT's ``image_size``, an int or a pair).

    Raises:
        UserError: naming the first field of the wrong type, its value and what it must be.
    """
    for key, default in defaults.items():
        if key not in hf_config or key in skip:
            continue
        value = hf_config[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(default, bool):
            ok, expected = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok, expected = number and isinstance(value, int), "an integer"
        elif isinstance(default, float):
            ok, expected = number, "a number"
        elif isinstance(default, str):
            ok, expected = isinstance(value, str), "a string"
        else:
            ok, expected = value is None or number, "a number or null"
        if not ok:
            wrong = f"{key}={value!r} has the wrong type (expected {expected})"
            raise UserError(f"config.json: {wrong}")


def label_names(hf_config: Mapping[str, Any]) -> tuple[str, ...]:
    """``id2label`` ({"0": "cat", …}) as names in index order; transformers' two placeholder
    labels when the config has none."""
    id2label = hf_config.get("id2label") or {"0": "LABEL_0", "1": "LABEL_1"}
    try:
        by_index = {int(k): str(v) for k, v in id2label.items()}
    except (AttributeError, TypeError, ValueError):
        raise UserError(f"id2label {id2label!r} does not map label ids to names") from None
    if sorted(by_index) != list(range(len(by_index))):
        raise UserError(f"id2label ids {sorted(by_index)} are not 0 .. {len(by_index) - 1}")
    return tuple(by_index[i] for i in range(len(by_index)))
