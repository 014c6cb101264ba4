"""Linear layers packed once for fast CPU inference (oneDNN), and the model transform using them.

On CPU, PyTorch's fp32 ``F.linear`` calls MKL's GEMM. On this project's AMD machine MKL runs
its AVX2 code although the CPU has AVX-512, and re-packs the weight at every call, which costs
the most at the few rows of a decoding step. oneDNN (shipped inside PyTorch, used by its
compiler for the same purpose) reorders each weight once into its blocked layout and runs its
own AVX-512 kernels, with the same fp32 arithmetic up to summation order. How much faster per
call, at which row counts and weight sizes: ``benchmarks/cpu_kernels.py``,
docs/results/cpu_kernels.md.

Small products are the exception: oneDNN's call has a fixed cost however small the product,
and MKL's is cheap for a few rows. The rule: while a decoding step's weights stay in cache (at
most half the last-level cache), products of up to 2^18 multiply–adds (rows × D_in × D_out:
one row of a 512 × 512 weight, four of a 256 × 256 one) keep PyTorch's kernel; when the step's
weights do not stay there, every product uses oneDNN, which reads a weight on all threads where
MKL's one-row product uses one. The end-to-end effect of the rule is measured by
``benchmarks/decode_vs_hf.py`` (docs/benchmarks.md).

:func:`pack_for_inference` returns a copy of a model whose ``nn.Linear`` layers are
:class:`PackedLinear`: CPU, fp32, inference only (no gradients; the packed weights cannot be
saved or trained; the copy's other parameters do not require grad, so it runs in any grad
mode). The model passed in is not changed.

Shape legend:  N any leading dimensions   D_in input size   D_out output size
"""

from __future__ import annotations

import copy
import os
from typing import NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import CrossAttention, MultiHeadAttention, SelfAttention
from aiayn.layers import RMSNorm

M = TypeVar("M", bound=nn.Module)
_SMALL = 1 << 18  # products of up to this many multiply–adds may keep PyTorch's kernel
_DEFAULT_CACHE = 32 << 20  # bytes, when the last-level cache's size cannot be read


def packing_available() -> bool:
    """Whether this PyTorch build has the oneDNN linear kernels."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _pack(weight: Tensor) -> Tensor:
    """(D_out, D_in) dense weight -> the same weight in oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


class LinearKernel(NamedTuple):
    """y = x Wᵀ + b for one weight (or one block of its rows), on the kernel chosen for it, with
    the epilogues a decoding step fuses into the product (ReLU, a residual addition).

    ``packed`` set: oneDNN, with small products on PyTorch's kernel when ``dense`` is kept too
    (see :func:`small_product`); ``packed`` None: PyTorch's ``F.linear`` on ``dense``.
    """

    packed: Tensor | None  # (D_out, D_in) in oneDNN's blocked layout
    bias: Tensor | None  # (D_out,)
    dense: Tensor | None  # (D_out, D_in) as is

    @staticmethod
    def of_dense(weight: Tensor, bias: Tensor | None) -> LinearKernel:
        """PyTorch's kernel on a (D_out, D_in) weight (any device and dtype)."""
        return LinearKernel(None, bias, weight)

    def _pytorch_weight(self, x: Tensor) -> Tensor | None:
        """The dense weight when the product with ``x`` runs on PyTorch's kernel, else None."""
        if self.packed is None or (self.dense is not None and small_product(x, self.dense.size(0))):
            return self.dense
        return None

    def __call__(self, x: Tensor) -> Tensor:
        """(N, D_in) -> (N, D_out)."""
        dense = self._pytorch_weight(x)
        if dense is not None:
            return F.linear(x, dense, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def relu(self, x: Tensor) -> Tensor:
        """max(0, x Wᵀ + b): (N, D_in) -> (N, D_out), the ReLU fused into oneDNN's product."""
        dense = self._pytorch_weight(x)
        if dense is not None:
            return F.linear(x, dense, self.bias).relu_()
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "relu", [], "")

    def add(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + x Wᵀ + b: (N, D_in), (N, D_out) -> (N, D_out), the addition fused into
        oneDNN's product."""
        dense = self._pytorch_weight(x)
        if dense is not None:
            return F.linear(x, dense, self.bias).add_(residual)
        linear_add = torch.ops.mkldnn._linear_pointwise.binary
        return linear_add(x, residual, self.packed, self.bias, "add")


class NormKernel:
    """LayerNorm(x) or RMSNorm(x) with a module's weight, bias and eps, applied without a module
    call (RMSNorm's statistics in fp32, as :class:`~aiayn.layers.norm.RMSNorm`): the norms of
    the flattened inference paths, beside their :class:`LinearKernel`\\ s."""

    __slots__ = ("bias", "eps", "rms", "shape", "weight")

    def __init__(self, norm: nn.Module):
        assert isinstance(norm, (nn.LayerNorm, RMSNorm))  # checked by the callers
        self.rms = isinstance(norm, RMSNorm)
        self.shape = tuple(norm.weight.shape)
        self.weight = norm.weight.detach()
        bias = getattr(norm, "bias", None)
        self.bias = None if bias is None else bias.detach()
        self.eps = norm.eps

    def __call__(self, x: Tensor) -> Tensor:
        if self.rms:
            normed = F.rms_norm(x.float(), self.shape, None, self.eps)  # (B, D), fp32 statistics
            return self.weight * normed.to(self.weight.dtype)
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class PackedLinear(nn.Module):
    """y = x Wᵀ + b with W packed once; also applies a block of W's rows (multi-head attention
    projects queries, or keys and values, with blocks of its stacked W^Q; W^K; W^V).

    Args:
        linear: the layer to copy (fp32, on CPU).
        row_blocks: row blocks of W that :meth:`forward` will be asked for, packed up front.
        dense_small: keep PyTorch's kernel for products of up to 2^18 multiply–adds: faster
            while W stays in the cache between calls (see the module docstring).
    """

    def __init__(
        self, linear: nn.Linear, row_blocks: tuple[slice, ...] = (), *, dense_small: bool = True
    ):
        super().__init__()
        weight = linear.weight.detach()
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            raise ValueError(
                f"PackedLinear needs an fp32 CPU layer, got {weight.dtype} on {weight.device}"
            )
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().clone()
        # the dense weight too, if some product with it can be small enough for PyTorch's kernel
        self.has_dense = dense_small and weight.numel() <= _SMALL
        dense = weight.clone() if self.has_dense else None
        self._blocks: dict[tuple[int, int] | None, LinearKernel] = {}
        for rows in (None, *row_blocks):
            part = slice(None) if rows is None else rows
            self._blocks[_key(rows)] = LinearKernel(
                _pack(weight[part]),
                None if bias is None else bias[part],
                None if dense is None else dense[part],
            )

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        """(N, D_in) -> (N, D_out), or (N, len(rows)) for a packed block of rows."""
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("PackedLinear is for inference: its input must not require grad")
        return self.kernel(rows)(x)

    def kernel(self, rows: slice | None = None) -> LinearKernel:
        """The kernel of W, or of a packed block of its rows."""
        block = self._blocks.get(_key(rows))
        if block is None:
            raise KeyError(f"rows {rows} were not packed; packed: {list(self._blocks)}")
        return block

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def linear_kernel(layer: nn.Module, rows: slice | None = None) -> LinearKernel:
    """The kernel of an ``nn.Linear`` (PyTorch's, its weight detached) or a :class:`PackedLinear`
    (its packed one), for all of W's rows or a block of them."""
    if isinstance(layer, PackedLinear):
        return layer.kernel(rows)
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"expected nn.Linear or PackedLinear, got {type(layer).__name__}")
    part = slice(None) if rows is None else rows
    bias = None if layer.bias is None else layer.bias.detach()[part]
    return LinearKernel.of_dense(layer.weight.detach()[part], bias)


def small_product(x: Tensor, d_out: int) -> bool:
    """Whether (N, D_in) ``x`` times a (D_out, D_in) weight takes at most 2^18 multiply–adds,
    small enough for PyTorch's kernel to beat oneDNN's fixed cost (weights in cache)."""
    return x.numel() * d_out <= _SMALL  # (N · D_in) · D_out


def _key(rows: slice | None) -> tuple[int, int] | None:
    return None if rows is None else (rows.start, rows.stop)


def pack_for_inference(model: M, *, dense_small: bool | None = None) -> M:
    """A copy of ``model`` (fp32, on CPU) with every ``nn.Linear`` packed for inference.

    Multi-head attention layers also get the row blocks of W^Q; W^K; W^V that they project with
    (cross-attention: queries, and keys/values; self-attention: none). Returns ``model`` itself,
    unchanged, where packing is unavailable (a build without oneDNN) or the model is not fp32 on
    CPU.

    Args:
        model: the model to copy.
        dense_small: whether products of up to 2^18 multiply–adds keep PyTorch's kernel (see
            :class:`PackedLinear`). None (default): :func:`step_weights_stay_in_cache`.
    """
    first = next(model.parameters(), None)
    if not packing_available() or first is None or first.device.type != "cpu":
        return model
    if first.dtype != torch.float32:
        return model
    if dense_small is None:
        dense_small = step_weights_stay_in_cache(model)
    packed = copy.deepcopy(model).eval().requires_grad_(False)  # usable without torch.no_grad
    for module in list(packed.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                rows = _row_blocks(module) if name == "in_proj" else ()
                setattr(module, name, PackedLinear(child, rows, dense_small=dense_small))
    return packed


def step_weights_stay_in_cache(model: nn.Module) -> bool:
    """The default of ``dense_small``: a decoding step's weights take at most half the
    last-level cache."""
    return 2 * step_weight_bytes(model) <= last_level_cache_bytes()


def step_weight_bytes(model: nn.Module) -> int:
    """Bytes of the linear-layer weights on the decoding side: every ``nn.Linear`` outside a
    child module named ``encoder`` (which runs once per source), shared weights counted once. An
    upper bound on what one step reads (cross-attention reads its key/value rows once per
    source)."""
    seen: dict[int, int] = {}
    for name, module in model.named_modules():
        if type(module) is nn.Linear and "encoder" not in name.split("."):
            w = module.weight
            seen[id(w)] = w.numel() * w.element_size()
    return sum(seen.values())


def last_level_cache_bytes() -> int:
    """Size of the CPU's last-level cache (L3, else L2) as the OS reports it, else 32 MiB."""
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):  # not a name this OS knows
            continue
        if size > 0:
            return size
    return _DEFAULT_CACHE


def _row_blocks(module: nn.Module) -> tuple[slice, ...]:
    """The blocks of the stacked rows [W^Q; W^K; W^V] that ``module`` projects with alone."""
    if isinstance(module, SelfAttention) or not isinstance(module, MultiHeadAttention):
        return ()  # Q, K and V in one matmul
    d = module.inner_dim  # I = H·d_k
    query, key_value = slice(0, d), slice(d, 3 * d)
    if isinstance(module, CrossAttention):
        return (query, key_value)
    return (query, key_value, slice(d, 2 * d), slice(2 * d, 3 * d))  # key is not value
