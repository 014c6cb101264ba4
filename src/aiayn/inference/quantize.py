"""Int8 quantisation of a model for CPU inference: one swap of its linear layers, for every
family (:mod:`aiayn.layers.quantized` holds the layer and the scheme; each family's registry
entry says which layers stay in fp32, :class:`~aiayn.models.families.QuantizePolicy`).

The quantised model runs through the same paths as the fp32 one: its modules' ``forward``, the
encoder on its real tokens (:mod:`aiayn.inference.encoder`) and the decoding step with its
key/value cache (:mod:`aiayn.decoding.fast_step`), whose kernels take the int8 layers as they
take the fp32 ones (:func:`~aiayn.inference.kernels.linear_kernel`). Measurements and accuracy:
docs/quantization.md.
"""

from __future__ import annotations

from typing import TypeVar

from torch import nn

from aiayn.errors import UserError
from aiayn.layers.quantized import QUANTIZE_MODES, is_quantized, quantize_linears
from aiayn.models.families import FAMILIES, QuantizePolicy

M = TypeVar("M", bound=nn.Module)


def quantize_model(model: M, mode: str = "int8") -> M:
    """``model`` with its linear layers quantised, in place, and returned (in eval mode, its
    parameters frozen: inference only).

    ``mode``: ``int8`` (weights int8 with per-output-channel scales, activations quantised per
    row) or ``none`` (the model, unchanged). A model of a registered family keeps in fp32 the
    layers its family's policy names; any other module has every ``nn.Linear`` quantised. A
    model already quantised is returned as it is.

    Raises:
        UserError: an unknown ``mode``, naming it.
    """
    check_quantize_mode(mode)
    if mode == "none" or is_quantized(model):
        return model
    model.eval().requires_grad_(False)
    quantize_linears(model, policy_of(model).keeps)
    return model


def check_quantize_mode(mode: str) -> None:
    """Refuse a mode other than those of ``--quantize``, naming it."""
    if mode not in QUANTIZE_MODES:
        raise UserError(f"--quantize must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")


def policy_of(model: nn.Module) -> QuantizePolicy:
    """The quantisation policy of ``model``'s family, or quantise-everything for a module of no
    registered family."""
    for family in FAMILIES.values():
        if type(model) is family.model:
            return family.quantize
    return QuantizePolicy()
