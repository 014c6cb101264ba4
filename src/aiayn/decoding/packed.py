"""Linear layers packed once for fast CPU inference (oneDNN), and the model transform using them.

On CPU, PyTorch's fp32 ``F.linear`` calls MKL's GEMM. On this project's AMD machine MKL runs
its AVX2 code although the CPU has AVX-512, and re-packs the weight at every call, which costs
the most at the few rows of a decoding step. oneDNN (shipped inside PyTorch, used by its
compiler for the same purpose) reorders each weight once into its blocked layout and runs its
own AVX-512 kernels: 1.8–8× faster per call at 4–128 rows on the decoder weights of ``small``
and ``base``, same fp32 arithmetic up to summation order (the smallest, 256 × 256, gains only
at 32 rows and more). At a single row its fixed cost (~15 µs) loses to MKL on weights of up to
2^19 entries, so those keep PyTorch's kernel for one-row inputs. Measured by
``benchmarks/cpu_kernels.py`` (docs/benchmarks.md).

:func:`pack_for_inference` returns a copy of a model whose ``nn.Linear`` layers are
:class:`PackedLinear`: CPU, fp32, inference only (no gradients; the packed weights cannot be
saved or trained). The model passed in is not changed.

Shape legend:  N any leading dimensions   D_in input size   D_out output size
"""

from __future__ import annotations

import copy
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import CrossAttention, MultiHeadAttention, SelfAttention

M = TypeVar("M", bound=nn.Module)
_SMALL = 1 << 19  # weights of up to this many entries keep MKL for one-row inputs


def packing_available() -> bool:
    """Whether this PyTorch build has the oneDNN linear kernels."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _pack(weight: Tensor) -> Tensor:
    """(D_out, D_in) dense weight -> the same weight in oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


class PackedLinear(nn.Module):
    """y = x Wᵀ + b with W packed once; also applies a block of W's rows (multi-head attention
    projects queries, or keys and values, with blocks of its stacked W^Q; W^K; W^V).

    Args:
        linear: the layer to copy (fp32, on CPU).
        row_blocks: row blocks of W that :meth:`forward` will be asked for, packed up front.
    """

    def __init__(self, linear: nn.Linear, row_blocks: tuple[slice, ...] = ()):
        super().__init__()
        weight = linear.weight.detach()
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            raise ValueError(
                f"PackedLinear needs an fp32 CPU layer, got {weight.dtype} on {weight.device}"
            )
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self._bias = bias
        # small weights at one row: MKL's GEMV is faster (benchmarks/cpu_kernels.py)
        self._dense = weight.clone() if weight.numel() <= _SMALL else None
        self._packed = {_key(None): _pack(weight)}
        for rows in row_blocks:
            self._packed[_key(rows)] = _pack(weight[rows])

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        """(N, D_in) -> (N, D_out), or (N, len(rows)) for a packed block of rows."""
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("PackedLinear is for inference: its input must not require grad")
        packed = self._packed.get(_key(rows))
        if packed is None:
            raise KeyError(f"rows {rows} were not packed; packed: {list(self._packed)}")
        bias = self._bias if self._bias is None or rows is None else self._bias[rows]
        if self._dense is not None and x.numel() == self.in_features:  # one row
            return F.linear(x, self._dense if rows is None else self._dense[rows], bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def _key(rows: slice | None) -> tuple[int, int] | None:
    return None if rows is None else (rows.start, rows.stop)


def pack_for_inference(model: M) -> M:
    """A copy of ``model`` (fp32, on CPU) with every ``nn.Linear`` packed for inference.

    Multi-head attention layers also get the row blocks of W^Q; W^K; W^V that they project with
    (cross-attention: queries, and keys/values; self-attention: none). Returns
    ``model`` itself, unchanged, where packing is unavailable (a build without oneDNN) or the
    model is not fp32 on CPU.
    """
    first = next(model.parameters(), None)
    if not packing_available() or first is None or first.device.type != "cpu":
        return model
    if first.dtype != torch.float32:
        return model
    packed = copy.deepcopy(model).eval()
    for module in list(packed.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                rows = _row_blocks(module) if name == "in_proj" else ()
                setattr(module, name, PackedLinear(child, rows))
    return packed


def _row_blocks(module: nn.Module) -> tuple[slice, ...]:
    """The blocks of the stacked rows [W^Q; W^K; W^V] that ``module`` projects with alone."""
    if isinstance(module, SelfAttention) or not isinstance(module, MultiHeadAttention):
        return ()  # Q, K and V in one matmul
    d = module.d_model
    query, key_value = slice(0, d), slice(d, 3 * d)
    if isinstance(module, CrossAttention):
        return (query, key_value)
    return (query, key_value, slice(d, 2 * d), slice(2 * d, 3 * d))  # key is not value
