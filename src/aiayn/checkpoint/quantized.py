"""The int8 tensors of a quantised checkpoint (``aiayn quantize``), checked before they are loaded.

Each int8 layer (:class:`~aiayn.layers.quantized.QuantizedLinear`, D_in inputs, D_out outputs)
is stored as ``NAME.weight``, int8 of shape (D_out, D_in), and ``NAME.scales``, float32 of shape
(D_out,), every scale finite and > 0 (what :func:`~aiayn.layers.quantized.absmax_scales`
writes: max|W[o]| / 127, or 1 for a row of zeros). Anything else is refused, naming the tensor:
``load_state_dict`` would convert another dtype silently (int32 scales, float weights truncated
to int8), and a scale of 0, a negative one, inf or NaN gives wrong outputs without an error —
a NaN does not even reach the logits: the next int8 layer quantises a row of its input holding
a NaN with scale 1 (``absmax_scales``: a NaN peak is not > 0) and the NaN itself to 0, so the
output is finite and wrong.
The SHA-256 check cannot tell: ``SHA256SUMS`` may have been recomputed after an edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from aiayn.checkpoint.files import CheckpointError
from aiayn.layers.quantized import QuantizedLinear


def int8_layer_shapes(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Each int8 layer of ``model``, under every qualified name it has (a shared layer is saved
    under one of them), -> its weight's shape (D_out, D_in)."""
    return {
        name: (module.out_features, module.in_features)
        for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, QuantizedLinear)
    }


def int8_problem(
    layers: Mapping[str, tuple[int, int]], tensors: Mapping[str, Tensor]
) -> str | None:
    """The first tensor of ``tensors`` (name -> tensor, as read from ``model.safetensors``)
    that does not fit the int8 layers ``layers`` (:func:`int8_layer_shapes`), as
    ``"NAME: what is wrong"``; None when all fit. A tensor missing from ``tensors`` is not
    this check's concern (loading names it).

    E.g. ``{"proj": (2, 3)}`` and ``{"proj.weight": int8 (2, 3), "proj.scales": [0.5, nan]}``
    -> ``"proj.scales: 1 of 2 scales are not finite and > 0 (row 1: nan)"``.
    """
    for prefix, (rows, columns) in layers.items():
        weight, scales = tensors.get(f"{prefix}.weight"), tensors.get(f"{prefix}.scales")
        if weight is not None:
            problem = _form_problem(weight, torch.int8, (rows, columns), "weight is")
            if problem is not None:
                return f"{prefix}.weight: {problem}"
        if scales is not None:
            problem = _form_problem(scales, torch.float32, (rows,), "scales are")
            problem = problem or _values_problem(scales)
            if problem is not None:
                return f"{prefix}.scales: {problem}"
    return None


def check_int8_tensors(model: nn.Module, tensors: Mapping[str, Tensor], file: Path) -> None:
    """Refuse ``tensors`` (read from ``file``) unless every int8 layer of ``model`` finds its
    tensors as :func:`int8_problem` requires (nothing to check in a model without int8
    layers).

    Raises:
        CheckpointError: ``"FILE: NAME: what is wrong; ..."``, one line.
    """
    problem = int8_problem(int8_layer_shapes(model), tensors)
    if problem is not None:
        raise CheckpointError(
            f"{file}: {problem}; quantise the fp32 checkpoint again (aiayn quantize)"
        )


def _form_problem(
    tensor: Tensor, dtype: torch.dtype, shape: tuple[int, ...], what: str
) -> str | None:
    """What is wrong with the dtype or shape of an int8 layer's weight or scales (one per row
    of its weight), or None; ``what``: ``weight is`` or ``scales are``."""
    if tensor.dtype != dtype:
        return f"dtype {_dtype(tensor.dtype)} where an int8 layer's {what} {_dtype(dtype)}"
    if tuple(tensor.shape) != shape:
        return f"shape {tuple(tensor.shape)} where the int8 layer needs {shape}"
    return None


def _values_problem(scales: Tensor) -> str | None:
    """How many of an int8 layer's ``scales`` are not finite and > 0, with the first such row
    and its value, or None."""
    bad = ~(torch.isfinite(scales) & (scales > 0))  # NaN > 0 is False
    count = int(bad.sum())
    if count == 0:
        return None
    first = int(bad.nonzero()[0, 0])
    return (
        f"{count} of {scales.numel()} scales are not finite and > 0 "
        f"(row {first}: {scales[first].item()})"
    )


def _dtype(dtype: torch.dtype) -> str:
    """``torch.int32`` -> ``int32``."""
    return str(dtype).removeprefix("torch.")
