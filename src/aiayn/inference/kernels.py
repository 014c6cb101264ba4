"""The kernels of the flattened inference paths, shared by the encoder on its real tokens
(:mod:`aiayn.inference.encoder`) and the encoder–decoder's decoding step
(:mod:`aiayn.decoding.fast_step`): a linear layer on the kernel chosen for it, with the
epilogues fused into its product (the feed-forward activation, the residual addition); the
norms; the position-wise feed-forward sub-layer (§3.3) and the residual connection (§3.1); and
the checks that a model's parts are of the kinds these kernels compute.

On CPU, PyTorch's fp32 ``F.linear`` calls its BLAS GEMM (MKL on x86), which packs the weight at
every call, and may not use the widest vector instructions the CPU has: costly at the few rows
of a decoding step. oneDNN (shipped inside PyTorch, used by its compiler for the same purpose)
reorders each weight once into its blocked layout (:class:`PackedLinear`) and runs its own
kernels, with the same fp32 arithmetic up to summation order; its post-ops apply the activation
or the residual addition inside the product. Its call has a fixed cost however small the
product, so small products keep PyTorch's kernel while the weights stay in cache (see
:func:`small_product`). The measurements behind these choices are in docs/performance.md.

A part of a kind these kernels do not compute is refused with :class:`UnsupportedPart` naming
it (a subclass may compute something else): never computed differently.

Shape legend:  N rows (any leading dimensions flattened)   D_in input size   D_out output size
    D d_model   F d_ff
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.kernels.linear import fp32_blocks, native_fp32, padded_to_blocks
from aiayn.layers import ACTIVATIONS, FeedForward, GatedFeedForward, RMSNorm
from aiayn.layers.quantized import Int8Kernel, QuantizedLinear
from aiayn.settings import performance


class UnsupportedPart(TypeError):
    """A model part of a kind a flattened inference path does not compute: the path refuses it
    by name; its caller may run the module instead."""


POST_OPS: dict[str, tuple[str, str]] = {
    "relu": ("relu", ""),
    "gelu": ("gelu", "none"),  # exact (erf), as F.gelu
    "gelu_tanh": ("gelu", "tanh"),
    "silu": ("swish", ""),  # x·σ(x)
}
"""The feed-forward activations the flattened paths compute, by name (those of
:data:`aiayn.layers.ACTIVATIONS`) -> oneDNN's post-op (attribute, algorithm) computing it."""


def packing_available() -> bool:
    """Whether this PyTorch build has the oneDNN linear kernels."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _pack(weight: Tensor) -> Tensor:
    """(D_out, D_in) dense weight -> the same weight in oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def small_product(x: Tensor, d_out: int) -> bool:
    """Whether (N, D_in) ``x`` times a (D_out, D_in) weight is small enough for PyTorch's kernel
    to beat oneDNN's fixed cost (weights in cache): at most
    :attr:`~aiayn.settings.PerformanceSettings.small_product_max_macs` multiply–adds."""
    return x.numel() * d_out <= performance().small_product_max_macs  # (N · D_in) · D_out


class NativeFp32(NamedTuple):
    """A weight in the layout of aiayn's fp32 kernel for a few rows
    (:func:`~aiayn.kernels.linear.fp32_blocks`), its bias padded to whole blocks, and D_out."""

    blocks: Tensor  # (NB, D_in, 16)
    bias: Tensor | None  # (NB·16,)
    d_out: int

    @staticmethod
    def of(weight: Tensor, bias: Tensor | None) -> NativeFp32 | None:
        """The layout of a (D_out, D_in) fp32 CPU weight, or None where the kernel does not run
        here or is set never to run (``fp32_native_max_rows`` 0)."""
        if native_fp32() is None or performance().fp32_native_max_rows < 1:
            return None
        n = weight.size(0)
        padded = None if bias is None else padded_to_blocks(bias.detach(), n)
        return NativeFp32(fp32_blocks(weight), padded, n)

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """(..., D_in) -> (..., D_out): x Wᵀ + b (+ residual, added after the bias)."""
        rows = x.reshape(-1, x.size(-1)).contiguous()  # (N, D_in), leading dimensions flattened
        if residual is not None:
            residual = residual.reshape(rows.size(0), self.d_out).contiguous()  # (N, D_out)
        ops = native_fp32()
        assert ops is not None  # kept only where it runs
        y = ops(rows, self.blocks, self.bias, residual, self.d_out)  # (N, D_out)
        return y.view(*x.shape[:-1], self.d_out)


def _native_for(native: NativeFp32 | None, x: Tensor) -> NativeFp32 | None:
    """``native`` where ``x``'s product runs on aiayn's fp32 kernel (it is kept and x has at
    most :attr:`~aiayn.settings.PerformanceSettings.fp32_native_max_rows` fp32 rows), else None."""
    if native is None or x.dtype != torch.float32:
        return None
    rows_fit = x.numel() <= performance().fp32_native_max_rows * x.size(-1)  # rows · D_in
    return native if rows_fit else None


class LinearKernel(NamedTuple):
    """y = x Wᵀ + b for one weight (or one block of its rows), on the kernel chosen for it, with
    the epilogues a flattened path fuses into the product (an activation, a residual addition).

    ``packed`` set: oneDNN, with small products on PyTorch's kernel when ``dense`` is kept too
    (see :func:`small_product`), and products of a few rows on aiayn's fp32 kernel when
    ``native`` is kept (:class:`NativeFp32`: ``fp32_native_max_rows``); ``packed`` None:
    PyTorch's ``F.linear`` on ``dense``; ``int8`` set: the int8 layer's kernel
    (:class:`~aiayn.layers.quantized.Int8Kernel`, its bias inside), the activation and the
    residual addition after it in fp32.
    """

    packed: Tensor | None  # (D_out, D_in) in oneDNN's blocked layout
    bias: Tensor | None  # (D_out,)
    dense: Tensor | None  # (D_out, D_in) as is
    int8: Int8Kernel | None = None
    native: NativeFp32 | None = None

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
        if self.int8 is not None:
            return self.int8(x)
        native = _native_for(self.native, x)
        if native is not None:
            return native(x)
        dense = self._pytorch_weight(x)
        if dense is not None:
            return F.linear(x, dense, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def activated(self, x: Tensor, activation: str) -> Tensor:
        """act(x Wᵀ + b): (N, D_in) -> (N, D_out) for an activation of :data:`POST_OPS`, inside
        oneDNN's product, or after PyTorch's where that kernel runs."""
        if self.int8 is not None:
            return ACTIVATIONS[activation](self.int8(x))
        native = _native_for(self.native, x)
        if native is not None:
            return ACTIVATIONS[activation](native(x))
        dense = self._pytorch_weight(x)
        if dense is not None:
            return ACTIVATIONS[activation](F.linear(x, dense, self.bias))
        attr, algorithm = POST_OPS[activation]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, attr, [], algorithm)

    def add(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + x Wᵀ + b: (N, D_in), (N, D_out) -> (N, D_out), the addition inside the
        product's call (oneDNN's post-op; aiayn's fp32 and int8 kernels add it after the bias)."""
        if self.int8 is not None:
            return self.int8(x, residual)
        native = _native_for(self.native, x)
        if native is not None:
            return native(x, residual)
        dense = self._pytorch_weight(x)
        if dense is not None:
            return F.linear(x, dense, self.bias).add_(residual)
        linear_add = torch.ops.mkldnn._linear_pointwise.binary
        return linear_add(x, residual, self.packed, self.bias, "add")


class NormKernel:
    """LayerNorm(x) or RMSNorm(x) with a module's weight, bias and eps, applied without a module
    call (RMSNorm's statistics in fp32, as :class:`~aiayn.layers.norm.RMSNorm`)."""

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
            normed = F.rms_norm(x.float(), self.shape, None, self.eps)  # (N, D), fp32 statistics
            return self.weight * normed.to(self.weight.dtype)
        # torch.layer_norm: F.layer_norm without its Python wrapper, called per sub-layer per step
        return torch.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class PackedLinear(nn.Module):
    """y = x Wᵀ + b with W packed once; also applies a block of W's rows (multi-head attention
    projects queries, or keys and values, with blocks of its stacked W^Q; W^K; W^V).

    Where aiayn's fp32 kernel runs (:class:`NativeFp32`), each block is also kept in that
    kernel's layout, for products of a few rows: a second copy of the weight.

    Args:
        linear: the layer to copy (fp32, on CPU).
        row_blocks: row blocks of W that :meth:`forward` will be asked for, packed up front.
        dense_small: keep PyTorch's kernel for small products (:func:`small_product`):
            faster while W stays in the cache between calls.
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
        self.has_dense = dense_small and weight.numel() <= performance().small_product_max_macs
        dense = weight.clone() if self.has_dense else None
        self._blocks: dict[tuple[int, int] | None, LinearKernel] = {}
        for rows in (None, *row_blocks):
            part = slice(None) if rows is None else rows
            part_bias = None if bias is None else bias[part]
            self._blocks[_key(rows)] = LinearKernel(
                _pack(weight[part]),
                part_bias,
                None if dense is None else dense[part],
                native=NativeFp32.of(weight[part], part_bias),
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


def _key(rows: slice | None) -> tuple[int, int] | None:
    return None if rows is None else (rows.start, rows.stop)


def linear_kernel(layer: nn.Module, rows: slice | None = None) -> LinearKernel:
    """The kernel of an ``nn.Linear`` (PyTorch's, its weight detached), a :class:`PackedLinear`
    (its packed one) or a :class:`~aiayn.layers.quantized.QuantizedLinear` (its int8 one), for
    all of W's rows or a block of them."""
    if isinstance(layer, PackedLinear):
        return layer.kernel(rows)
    if type(layer) is QuantizedLinear:
        return LinearKernel(None, None, None, layer.kernel(rows))
    if not isinstance(layer, nn.Linear):
        raise UnsupportedPart(
            f"expected nn.Linear, PackedLinear or QuantizedLinear, got {type(layer).__name__}"
        )
    part = slice(None) if rows is None else rows
    bias = None if layer.bias is None else layer.bias.detach()[part]
    return LinearKernel.of_dense(layer.weight.detach()[part], bias)


def check_kind(part: object, kinds: tuple[type, ...], who: str, what: str) -> None:
    """Refuse ``part`` unless its type is one of ``kinds`` exactly (a subclass may compute
    something else): "{who} runs {what}, got {its type}"."""
    if type(part) not in kinds:
        raise UnsupportedPart(f"{who} runs {what}, got {type(part).__name__}")


def check_norm(norm: nn.Module, who: str, what: str = "LayerNorm or RMSNorm") -> None:
    """Refuse a norm other than LayerNorm or RMSNorm (what :class:`NormKernel` computes)."""
    check_kind(norm, (nn.LayerNorm, RMSNorm), who, what)


def check_feed_forward(ff: nn.Module, who: str) -> FeedForward | GatedFeedForward:
    """``ff``, refused unless a FeedForward or GatedFeedForward with an activation of
    :data:`POST_OPS` (what :class:`FeedForwardKernel` computes)."""
    known = type(ff) in (FeedForward, GatedFeedForward)
    if not known or getattr(ff, "activation_name", None) not in POST_OPS:
        raise UnsupportedPart(
            f"{who} runs a FeedForward or GatedFeedForward with activation "
            f"{' or '.join(POST_OPS)}, got {type(ff).__name__}"
            f"({getattr(ff, 'activation_name', '?')})"
        )
    assert isinstance(ff, (FeedForward, GatedFeedForward))
    return ff


def refuse_hooks(
    root: nn.Module,
    who: str,
    *,
    called: nn.Module | None = None,
    root_pre_hooks_run: bool = False,
    prefix: str = "",
) -> None:
    """Refuse forward hooks and pre-hooks on ``root`` and its parts, whose ``forward`` a
    flattened path does not call (they would not run); except on ``called`` and its parts, whose
    ``forward`` it does call, and ``root``'s own pre-hooks where the path runs them. ``prefix``:
    the name of ``root`` in the messages."""
    inside = set() if called is None else {id(m) for m in called.modules()}
    for name, part in root.named_modules(prefix=prefix):
        pre = {} if part is root and root_pre_hooks_run else part._forward_pre_hooks
        if id(part) not in inside and (pre or part._forward_hooks):
            raise UnsupportedPart(f"{who} runs no forward hooks, found some on {name or 'it'}")


def residual(out: LinearKernel, norm: NormKernel, norm_first: bool, y: Tensor, x: Tensor) -> Tensor:
    """A sub-layer's output projection and its residual connection (§3.1): post-norm
    Norm(x + y Wᵀ + b), or pre-norm x + y Wᵀ + b (normed before the sub-layer)."""
    x = out.add(y, x)  # (N, D_in) @ (D_in, D) + (N, D), the addition inside the product
    return x if norm_first else norm(x)


@dataclass(frozen=True, slots=True)
class FeedForwardKernel:
    """The position-wise feed-forward sub-layer (§3.3, eq. 2), or T5 v1.1's gated variant
    (act(x W_0) ⊙ x W_1) W_2, with its norm and residual connection: (N, D) -> (N, D)."""

    w_in: LinearKernel  # W_1, b_1: (D,) -> (F,)
    gate: LinearKernel | None  # W_0 of a gated network, else None
    w_out: LinearKernel  # W_2, b_2: (F,) -> (D,)
    norm: NormKernel
    activation: str  # a name of POST_OPS
    norm_first: bool

    @staticmethod
    def of(ff: nn.Module, norm: nn.Module, norm_first: bool, who: str) -> FeedForwardKernel:
        """The kernel of a feed-forward network and its sub-layer's norm, both checked."""
        ff = check_feed_forward(ff, who)
        check_norm(norm, who)
        gate = linear_kernel(ff.gate) if isinstance(ff, GatedFeedForward) else None
        return FeedForwardKernel(
            linear_kernel(ff.linear1),
            gate,
            linear_kernel(ff.linear2),
            NormKernel(norm),
            ff.activation_name,
            norm_first,
        )

    def __call__(self, x: Tensor) -> Tensor:
        inner = self.norm(x) if self.norm_first else x
        if self.gate is not None:  # both (N, D) @ (D, F), the gate activated
            hidden = self.gate.activated(inner, self.activation).mul_(self.w_in(inner))
        else:
            hidden = self.w_in.activated(inner, self.activation)  # (N, D) @ (D, F), activated
        return residual(self.w_out, self.norm, self.norm_first, hidden, x)
