"""Int8 linear layers for CPU inference: weights stored as int8 with one scale per output channel,
activations quantised on the fly one row at a time (W8A8), products accumulated exactly in int32.

The scheme (symmetric, no zero points), for a weight W (D_out, D_in) and an input row x (D_in,):

    s_w[o] = max_i |W[o, i]| / 127          (a row of zeros: s_w[o] = 1, its int8 row is zero)
    W_q[o, i] = round(W[o, i] / s_w[o])     in [-127, 127]
    s_x = max_i |x[i]| / 127,  x_q = round(x / s_x)     (likewise for a row of zeros)
    y[o] = (Σ_i x_q[i] · W_q[o, i]) · s_w[o] · s_x + b[o]

As in LLM.int8() (Dettmers et al. 2022, §3.1, "vector-wise quantization": one scale per row of the
activations and per column of the weight) without its fp16 outlier decomposition, and as
CTranslate2's ``int8_float32`` compute type. The int32 sum is exact (|x_q·W_q| ≤ 127², summed
over fewer than 2^17 inputs), so a row's output depends on that row alone and not on the kernel,
the batch or the order of summation: the decoding step with a key/value cache computes every row
as the full forward does. Only the final scaling is fp32 arithmetic, done in one order by every
kernel.

Kernels, on CPU (chosen per call by :func:`aiayn.kernels.int8.choose_int8`): aiayn's own
(:mod:`aiayn.kernels.linear`: an AVX-512 VNNI build and an AVX2 build, the row quantisation, the
sum and the scaling in one call), oneDNN's ``qlinear_pointwise`` on a weight packed once for it
(unsigned activations x_q + 128 with zero point 128, the same exact sum), or PyTorch's
``torch._int_mm`` (int8 × int8 -> int32) on the weight laid out (D_in, D_out). A library kernel
runs only where it is exact in this process (:func:`aiayn.kernels.int8.exact_library_kernels`:
without VNNI, oneDNN's u8 × s8 products saturate); where none is and aiayn's kernel does not
run (a CPU below AVX2), the reference's operations run, with sums in float64 (exact). Which one
runs is chosen by the number of rows at call time
(:attr:`~aiayn.settings.PerformanceSettings.int8_native_max_rows` and ``int8_onednn_max_rows``,
measured in docs/performance.md); on a device other than the CPU the product runs as fp32 on
the int8 values (exact while the sums stay below 2^24). Norms, softmax, residuals and losses
stay fp32: only ``nn.Linear`` layers are replaced (:func:`quantize_linears`).

Inference only: no gradients flow to the int8 weights.

Shape legend:  N rows (leading dimensions flattened)   D_in input size   D_out output size
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.kernels import int8 as library
from aiayn.kernels.linear import (
    native_int8,
    native_int8_unavailable,
    native_quantize_rows,
    padded_to_blocks,
    vnni_blocks,
)
from aiayn.settings import performance

QMAX = 127
"""The largest magnitude of an int8 value in the symmetric scheme (−128 is never used)."""

QUANTIZE_MODES = ("none", "int8")
"""What ``--quantize`` accepts: ``none`` (fp32) or ``int8`` (this module)."""


def absmax_scales(x: Tensor) -> Tensor:
    """Scales of the symmetric int8 scheme, one per row: max|x_row| / 127, and 1 for a row of
    zeros (any scale quantises it to zeros; 1 keeps the division finite).

    (N, D) -> (N,) fp32. E.g. rows [0.5, −1.27] and [0, 0] -> [0.01, 1.0].
    """
    peak = x.detach().abs().amax(dim=-1).float()  # (N,)
    return torch.where(peak > 0, peak / QMAX, torch.ones_like(peak))


def quantize_rows(x: Tensor, scales: Tensor) -> Tensor:
    """round(x / scale) per row, as int8: (N, D), (N,) -> (N, D) in [-127, 127]."""
    q = torch.round(x.float() / scales[:, None])  # (N, D)
    return q.clamp_(-QMAX, QMAX).to(torch.int8)


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(D_out, D_in) fp weight -> its int8 values (D_out, D_in) and per-output-channel scales
    (D_out,) fp32."""
    scales = absmax_scales(weight)
    return quantize_rows(weight, scales), scales


def dequantize_weight(weight: Tensor, scales: Tensor) -> Tensor:
    """int8 (D_out, D_in) and scales (D_out,) -> the fp32 weight they stand for."""
    return weight.float() * scales[:, None]


def int8_linear_reference(x: Tensor, weight: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor:
    """The scheme of the module docstring in plain operations (any device): (N, D_in) ->
    (N, D_out). On CPU the sums are in float64, exact (|Σ| ≤ 127² · D_in < 2^53), and so the
    bits every CPU kernel gives; elsewhere in fp32, exact while below 2^24."""
    x_scales = absmax_scales(x)  # (N,)
    exact = torch.float64 if x.device.type == "cpu" else torch.float32
    x_q = quantize_rows(x, x_scales).to(exact)  # (N, D_in)
    acc = x_q @ weight.to(exact).t()  # (N, D_in) @ (D_in, D_out): integer-valued
    return _epilogue(acc, scales, x_scales, bias)


def _epilogue(acc: Tensor, scales: Tensor, x_scales: Tensor, bias: Tensor | None) -> Tensor:
    """(N, D_out) sums -> Σ · s_w · s_x + b, in this order on every kernel."""
    y = acc.float().mul_(scales).mul_(x_scales[:, None])  # (N, D_out)
    return y if bias is None else y.add_(bias)


class Int8Kernel:
    """y = x Wᵀ + b for one int8 weight (or a block of its rows) on CPU, by the scheme of the
    module docstring: (N, D_in) -> (N, D_out).

    Four CPU kernels compute the same bits, chosen by the number of rows N at call time
    (:func:`aiayn.kernels.int8.choose_int8`): aiayn's own (:mod:`aiayn.kernels.linear`, for
    the CPU class in force), oneDNN's ``qlinear_pointwise`` and ``torch._int_mm`` where each
    is exact here, and the reference's operations. Each one's weight layout is made when it
    first runs.

    Args:
        weight: (D_out, D_in) int8.
        scales: (D_out,) fp32.
        bias: (D_out,) fp32, or None.
    """

    __slots__ = ("_columns", "_native", "_packed", "bias", "cpu", "scales", "weight")

    def __init__(self, weight: Tensor, scales: Tensor, bias: Tensor | None):
        self.weight = weight.contiguous()  # (D_out, D_in): the reference's
        self.scales = scales.float().contiguous()
        self.bias = None if bias is None else bias.float().contiguous()
        self.cpu = weight.device.type == "cpu"
        self._columns: Tensor | None = None  # (D_in, D_out): _int_mm's
        self._packed: tuple[Tensor, Tensor, Tensor] | None = None  # oneDNN's blocked layout
        # aiayn's kernel: VNNI blocks, compensation, scales and bias padded to whole blocks
        self._native: tuple[Tensor, Tensor, Tensor, Tensor | None] | None = None

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """(N, D_in) -> (N, D_out), on the kernel chosen for N rows; plus ``residual`` (N, D_out)
        where given, added after the bias (by aiayn's kernel inside its call)."""
        ops = native_int8() if self.cpu else None  # looked up once per call
        kernel = self._choose(x, ops) if self.cpu else "reference"
        if kernel == "native":
            return self._native_on(ops, x, residual)
        if kernel == "onednn":
            y = self.onednn(x)
        elif kernel == "int_mm":
            y = self.int_mm(x)
        else:
            y = int8_linear_reference(x, self.weight, self.scales, self.bias)
        return y if residual is None else y.add_(residual)

    @staticmethod
    def choice(x: Tensor) -> str:
        """The kernel a call on ``x`` (N, D_in) runs (one of :data:`aiayn.kernels.int8.KERNELS`)."""
        return Int8Kernel._choose(x, native_int8())

    @staticmethod
    def _choose(x: Tensor, ops: Any) -> str:
        """:meth:`choice` with aiayn's kernel ``ops`` (or None) already looked up."""
        if x.device.type != "cpu":
            return "reference"
        exact = library.exact_library_kernels()
        return library.choose_int8(x.size(0), ops is not None, exact, performance())

    def native(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """aiayn's kernel (where it runs here: :func:`~aiayn.kernels.linear.native_int8`), with
        ``residual`` added after the bias where given."""
        ops = native_int8()
        if ops is None:
            why = native_int8_unavailable()
            raise RuntimeError(f"aiayn's int8 kernel does not run here: {why}")
        return self._native_on(ops, x, residual)

    def _native_on(self, ops: Any, x: Tensor, residual: Tensor | None) -> Tensor:
        """:meth:`native` with the kernel's operation ``ops`` already looked up."""
        if self._native is None:  # its layout, made when it first runs
            blocks, compensation = vnni_blocks(self.weight)
            n = self.weight.size(0)
            bias = None if self.bias is None else padded_to_blocks(self.bias, n)
            self._native = (blocks, compensation, padded_to_blocks(self.scales, n), bias)
        blocks, compensation, scales, bias = self._native
        x = x.float().contiguous()
        if residual is not None:
            residual = residual.float().contiguous()
        return ops(x, blocks, compensation, scales, bias, residual, self.weight.size(0))

    def int_mm(self, x: Tensor) -> Tensor:
        """PyTorch's ``torch._int_mm`` on the activations quantised by PyTorch operations."""
        x_scales = absmax_scales(x)  # (N,)
        if self._columns is None:
            self._columns = self.weight.t().contiguous()  # (D_out, D_in) -> (D_in, D_out)
        acc = library.int_mm_sums(quantize_rows(x, x_scales), self._columns)  # (N, D_out)
        return _epilogue(acc, self.scales, x_scales, self.bias)

    def onednn(self, x: Tensor) -> Tensor:
        """oneDNN's u8 × s8 product on the activations shifted by 128 (zero point 128),
        quantised by aiayn's kernel where it runs, else by PyTorch operations."""
        if self._packed is None:
            self._packed = library.onednn_pack(self.weight)
        quantize = native_quantize_rows()
        if quantize is not None:
            unsigned, x_scales = quantize(x.float().contiguous())  # (N, D_in) u8
        else:
            x_scales = absmax_scales(x)  # (N,)
            unsigned = quantize_rows(x, x_scales).to(torch.int16).add_(128).to(torch.uint8)
        acc = library.onednn_sums(unsigned, self._packed)  # (N, D_out), the exact sum as fp32
        return _epilogue(acc, self.scales, x_scales, self.bias)


class QuantizedLinear(nn.Module):
    """An ``nn.Linear`` with int8 weights and per-output-channel scales (module docstring): the
    same (..., D_in) -> (..., D_out) map, for inference.

    Its state: ``weight`` (D_out, D_in) int8, ``scales`` (D_out,) fp32 and ``bias`` (D_out,) or
    None, all buffers (saved and loaded with the model, never trained). Like
    :class:`~aiayn.inference.kernels.PackedLinear` it also applies a block of its rows
    (multi-head attention's W^Q, or W^K; W^V, of the stacked projection).

    Args:
        in_features, out_features: D_in and D_out.
        bias: whether it adds a bias.
    """

    weight: Tensor
    scales: Tensor
    bias: Tensor | None

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self._kernels: dict[tuple[int, int] | None, Int8Kernel] = {}  # by block of rows
        self._stamp: object = None  # the buffers' versions and device the kernels were made of

    @staticmethod
    def of(linear: nn.Linear) -> QuantizedLinear:
        """The layer quantising ``linear``'s weight (its bias kept in fp32)."""
        layer = _empty_like(linear)
        weight, scales = quantize_weight(linear.weight.detach())
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.scales.copy_(scales)
            if linear.bias is not None and layer.bias is not None:
                layer.bias.copy_(linear.bias.detach())
        return layer

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        """(..., D_in) -> (..., D_out), or (..., len(rows)) for a block of rows."""
        flat = x.reshape(-1, x.size(-1))  # (N, D_in)
        y = self.kernel(rows)(flat)  # (N, D_out)
        return y.view(*x.shape[:-1], y.size(-1)).to(x.dtype)

    def kernel(self, rows: slice | None = None) -> Int8Kernel:
        """The kernel of W, or of a block of its rows, made on first use (and again after the
        buffers change: loaded in place, replaced, moved or converted)."""
        stamp = tuple(_stamp(t) for t in (self.weight, self.scales, self.bias))
        if stamp != self._stamp:
            self._kernels, self._stamp = {}, stamp
        key = None if rows is None else (rows.start, rows.stop)
        kernel = self._kernels.get(key)
        if kernel is None:
            part = slice(None) if rows is None else rows
            bias = None if self.bias is None else self.bias[part]
            kernel = self._kernels[key] = Int8Kernel(self.weight[part], self.scales[part], bias)
        return kernel

    def __getstate__(self) -> dict[str, object]:
        """Copied or pickled without its kernels (made again on first use)."""
        return {**self.__dict__, "_kernels": {}, "_stamp": None}

    def dequantized(self) -> Tensor:
        """The fp32 (D_out, D_in) weight this layer's int8 values and scales stand for."""
        return dequantize_weight(self.weight, self.scales)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(
    model: nn.Module, keep: Callable[[str], bool] = lambda name: False, *, values: bool = True
) -> None:
    """Replace every ``nn.Linear`` of ``model`` (exactly that class) by a :class:`QuantizedLinear`
    of its weight, in place, except those whose qualified name ``keep`` accepts. A linear layer
    reached under several names (a shared module) is quantised once. ``values=False``: layers
    of the same shapes with zero weights, to load a quantised state into."""
    done: dict[int, QuantizedLinear] = {}
    for parent_name, parent in list(model.named_modules(remove_duplicate=False)):
        for name, child in list(parent._modules.items()):  # every name, shared or not
            qualified = f"{parent_name}.{name}" if parent_name else name
            if type(child) is not nn.Linear or keep(qualified):
                continue
            if id(child) not in done:
                done[id(child)] = QuantizedLinear.of(child) if values else _empty_like(child)
            setattr(parent, name, done[id(child)])


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds int8 layers."""
    return any(isinstance(m, QuantizedLinear) for m in model.modules())


def _stamp(tensor: Tensor | None) -> tuple[object, ...]:
    """What identifies a buffer's contents: its storage, device and in-place version (tensors
    made under ``torch.inference_mode`` keep no version: they cannot change outside it)."""
    if tensor is None:
        return ()
    version = 0 if tensor.is_inference() else tensor._version
    return (tensor.data_ptr(), tensor.device, version)


def _empty_like(linear: nn.Linear) -> QuantizedLinear:
    """An int8 layer of ``linear``'s shape and device, its weight zero and its scales one."""
    has_bias = linear.bias is not None
    layer = QuantizedLinear(linear.in_features, linear.out_features, bias=has_bias)
    return layer.to(linear.weight.device)
