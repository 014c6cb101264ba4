"""The int8 products of the libraries aiayn runs beside its own kernel, and the rule that lets one
run only where it is exact.

The W8A8 scheme (:mod:`aiayn.layers.quantized`) sums x_q · W_q exactly in int32, so every kernel
gives the reference's bits. Two library kernels compute those sums:

- oneDNN's ``qlinear_pointwise`` (shipped in PyTorch), on unsigned activations x_q + 128;
- PyTorch's ``torch._int_mm`` (int8 × int8 -> int32), itself on oneDNN on x86.

On a CPU with VNNI (AVX-512 VNNI, or AVX-VNNI) oneDNN multiplies u8 × s8 with ``vpdpbusd``, which
sums in int32: exact. Without it (AVX2 alone, or oneDNN capped by ``ONEDNN_MAX_CPU_ISA``), it
multiplies with ``vpmaddubsw``, whose pairs of products saturate at ±32767, and 255 · 127 · 2 does
not fit (docs/quantization.md gives the measured error). Whether a library kernel is exact is
therefore not assumed from the CPU's name: :func:`exact_library_kernels` runs each once on the
operands that saturate soonest (every magnitude 127, both signs) against sums in int64, and a
kernel that differs in one bit is never chosen (:func:`choose_int8`).

Shape legend:  N rows   D_in inputs   D_out outputs
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from aiayn.settings import PerformanceSettings

LIBRARY_KERNELS = ("onednn", "int_mm")
"""The library int8 kernels, in the order they are preferred where both are exact."""

KERNELS = ("native", *LIBRARY_KERNELS, "reference")
"""Every int8 kernel on CPU: aiayn's (:mod:`aiayn.kernels.linear`), the libraries', and the
reference's plain operations (:func:`aiayn.layers.quantized.int8_linear_reference`)."""


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's int8 linear kernel."""
    onednn = getattr(torch.ops, "onednn", None)
    return torch.backends.mkldnn.is_available() and hasattr(onednn, "qlinear_pointwise")


def onednn_pack(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """An int8 (D_out, D_in) weight packed for oneDNN, with unit scales and zero offsets (the
    scheme's scaling runs after the product)."""
    return (
        torch.ops.onednn.qlinear_prepack(weight, None),
        torch.ones(weight.size(0)),
        torch.zeros(weight.size(0), dtype=torch.long),
    )


def onednn_sums(unsigned: Tensor, packed: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """oneDNN's sums Σ_i x_q[i] · W[o, i] as fp32 (N, D_out), from x_q + 128 (N, D_in) uint8
    with zero point 128."""
    weight, unit_scales, zero_points = packed
    return torch.ops.onednn.qlinear_pointwise(  # (N, D_in) @ (D_in, D_out)
        *(unsigned, 1.0, 128, weight, unit_scales, zero_points, None),
        *(1.0, 0, torch.float32, "none", [], ""),
    )


def int_mm_sums(quantized: Tensor, columns: Tensor) -> Tensor:
    """``torch._int_mm``'s int32 sums (N, D_out) of x_q (N, D_in) int8 and the weight laid out
    (D_in, D_out)."""
    return torch._int_mm(quantized, columns)  # (N, D_in) @ (D_in, D_out)


def probe_operands() -> tuple[Tensor, Tensor]:
    """Activations (32, 64) and a weight (32, 64), int8 in [-127, 127], on which a kernel whose
    16-bit pair sums saturate goes wrong: rows of +127, −127 and alternating signs, against
    weights of the same patterns, then random values (seed 0)."""
    patterns = torch.tensor([[127] * 64, [-127] * 64, [127, -127] * 32, [-127, 127] * 32])
    generator = torch.Generator().manual_seed(0)
    rest = torch.randint(-127, 128, (28, 64), generator=generator)
    x = torch.cat([patterns, rest]).to(torch.int8)  # (32, 64)
    w = torch.cat([patterns.flip(0), rest.flip(0)]).to(torch.int8)  # (32, 64)
    return x, w


def exact_sums(x: Tensor, w: Tensor) -> Tensor:
    """Σ_i x[n, i] · w[o, i] in int64: (N, D_in), (D_out, D_in) -> (N, D_out)."""
    return x.long() @ w.long().t()  # (N, D_in) @ (D_in, D_out)


def _library_sums(kernel: str, x: Tensor, w: Tensor) -> Tensor:
    """The sums ``kernel`` computes for int8 ``x`` and ``w``, as int64."""
    if kernel == "onednn":
        unsigned = (x.to(torch.int16) + 128).to(torch.uint8)  # (N, D_in) x_q + 128
        return onednn_sums(unsigned, onednn_pack(w)).round().long()
    return int_mm_sums(x, w.t().contiguous()).long()


@functools.cache
def exact_library_kernels() -> frozenset[str]:
    """The library kernels that give exact sums in this process (once per process: the
    libraries read their caps at start-up)."""
    x, w = probe_operands()
    want = exact_sums(x, w)
    exact = set()
    for kernel in LIBRARY_KERNELS:
        if kernel == "onednn" and not onednn_available():
            continue
        try:
            if torch.equal(_library_sums(kernel, x, w), want):
                exact.add(kernel)
        except RuntimeError:  # not built for this CPU or this PyTorch
            continue
    return frozenset(exact)


def choose_int8(
    rows: int, native: bool, exact: frozenset[str], settings: PerformanceSettings
) -> str:
    """The int8 kernel (one of :data:`KERNELS`) for a product of ``rows`` rows, where aiayn's
    kernel runs (``native``) and the library kernels in ``exact`` are exact.

    aiayn's kernel up to ``int8_native_max_rows`` rows; then oneDNN up to
    ``int8_onednn_max_rows``, then ``_int_mm`` (oneDNN still where only it is exact), each only
    where exact; aiayn's kernel where neither library is; the reference where nothing else is.
    E.g. with the defaults:
    (1, True, {onednn, int_mm}) -> native; (2048, True, {onednn, int_mm}) -> onednn;
    (2048, True, {}) -> native; (2048, False, {}) -> reference; (2048, False, {int_mm}) -> int_mm.
    """
    if native and rows <= settings.int8_native_max_rows:
        return "native"
    if "onednn" in exact and (rows <= settings.int8_onednn_max_rows or "int_mm" not in exact):
        return "onednn"
    if "int_mm" in exact:
        return "int_mm"
    return "native" if native else "reference"
