"""The paper's sinusoids <-> Marian's, by a change of basis of the residual stream.

§3.5 interleaves the sinusoids: PE(pos, 2i) = sin, PE(pos, 2i+1) = cos. Marian (and Pegasus)
keep the same frequencies in halves: every sine first, then every cosine. The two tables differ
by one fixed permutation π of the model dimension (:func:`halves_permutation`):
``halves[:, j] = interleaved[:, π[j]]``, π = (0, 2, 4, …, 1, 3, 5, …).

Every part of the model reads or writes the residual stream linearly, or (LayerNorm) with the
same statistics in any order of its dimensions. Permuting the dimension of every tensor that
touches the stream (:data:`RESIDUAL_AXES`: embeddings, the projections' inputs and outputs,
LayerNorm gains and biases, the feed-forward's input and output, the output layer) therefore
gives a model with Marian's table that computes the same function, with the hidden states
permuted: an exact change of basis (floating-point sums in another order aside). Applying the
inverse permutation gives back the very tensors.

Shape legend:  D d_model   V vocabulary   F d_ff   I = 3D (a fused [W^Q; W^K; W^V])
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import UserError

POSITIONAL_KEY = "aiayn_positional"
"""A transformers config.json key aiayn writes (``"sinusoidal"``) when it permuted the paper's
model into Marian's basis: converting the folder back undoes the permutation."""

OUTPUT_BIAS_KEY = "aiayn_output_bias"
"""A transformers config.json key aiayn writes (false) when its model has no output bias (the
paper's): Marian's ``final_logits_bias`` is then zero, and converting back leaves it out."""

RESIDUAL_AXES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("embedder.embedding.weight", (1,)),  # (V, D): writes the stream
    ("output_proj.weight", (1,)),  # (V, D): reads it
    ("output_proj.bias", ()),  # (V,)
    ("in_proj.weight", (1,)),  # (I, D): reads it (queries; keys and values of the memory)
    ("in_proj.bias", ()),  # (I,)
    ("out_proj.weight", (0,)),  # (D, D): writes it
    ("out_proj.bias", (0,)),  # (D,)
    ("linear1.weight", (1,)),  # (F, D): reads it
    ("linear1.bias", ()),  # (F,)
    ("linear2.weight", (0,)),  # (D, F): writes it
    ("linear2.bias", (0,)),  # (D,)
    ("norm.weight", (0,)),  # (D,): LayerNorm gain (sub-layer and final norms)
    ("norm.bias", (0,)),  # (D,)
)
"""The end of an encoder–decoder tensor's name -> its axes of size D (the residual stream)."""


def halves_permutation(d_model: int) -> Tensor:
    """π of the module docstring: the even dimensions, then the odd ones ((D,) int64).

    >>> halves_permutation(6).tolist()
    [0, 2, 4, 1, 3, 5]
    """
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def residual_axes(name: str) -> tuple[int, ...]:
    """The axes of size D of the tensor ``name`` (:data:`RESIDUAL_AXES`).

    Raises:
        KeyError: a tensor the table does not know (no guess: a new part needs its row).
    """
    for suffix, axes in RESIDUAL_AXES:
        if name.endswith(suffix):
            return axes
    raise KeyError(f"{name}: no residual-stream axes known")


def permute_residual(state: Mapping[str, Tensor], permutation: Tensor) -> dict[str, Tensor]:
    """Every tensor with its residual axes permuted: ``t`` -> ``t[π]`` along each (new tensors;
    a tied pair stays equal, each permuted alike)."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        for axis in residual_axes(name):
            tensor = tensor.index_select(axis, permutation)
        out[name] = tensor
    return out


def to_halves(state: Mapping[str, Tensor], d_model: int) -> dict[str, Tensor]:
    """The paper's (interleaved) model's tensors in Marian's basis."""
    return permute_residual(state, halves_permutation(d_model))


def from_halves(state: Mapping[str, Tensor], d_model: int) -> dict[str, Tensor]:
    """:func:`to_halves` undone: Marian's basis back to the paper's (π⁻¹ = argsort π)."""
    return permute_residual(state, torch.argsort(halves_permutation(d_model)))


def positional_from_hf(hf_config: Mapping[str, Any]) -> str:
    """The layout of a folder's weights: ``"sinusoidal-halves"`` (Marian's), or
    ``"sinusoidal"`` when aiayn wrote them from the paper's basis (:data:`POSITIONAL_KEY`).

    Raises:
        UserError: naming another value of the key.
    """
    value = hf_config.get(POSITIONAL_KEY, "sinusoidal-halves")
    if value not in ("sinusoidal", "sinusoidal-halves"):
        raise UserError(f"{POSITIONAL_KEY}={json.dumps(value)} is not 'sinusoidal'")
    return str(value)
