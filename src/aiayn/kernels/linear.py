"""aiayn's own linear kernels for x86 CPUs (``csrc/linear.cpp``), each in two builds chosen at
call time by the CPU class in force (:mod:`aiayn.kernels.cpu`): one for AVX-512 and one for AVX2
with FMA.

- **int8** (``linear``: AVX-512 VNNI; ``linear_avx2``: AVX2): the W8A8 scheme of
  :mod:`aiayn.layers.quantized` — activations quantised per row, exact int32 sums, the same fp32
  scaling in the same order — with the quantisation, the product and the scaling in one call
  instead of about ten PyTorch operations around a library GEMM. Both builds compute the bits
  of the reference (tests hold them to them): the AVX2 one multiplies |w| by x·sign(w), so that
  no 16-bit pair sum saturates (the source says why).
- **fp32, for a few rows** (``linear_fp32``: AVX-512F; ``linear_fp32_avx2``: AVX2 + FMA):
  y = x Wᵀ + b (+ a residual), on a weight laid out so that each thread reads it as one
  sequential stream. A decoding step's product of one row reads every weight once, so its time
  is the time to read the weight; in a library GEMM's blocked layout it read more slowly than a
  plain sequential read of the same bytes on the test machine (docs/benchmarks.md, the
  CTranslate2 section). The same products as ``F.linear``, summed in another order.

They are built once per machine (:mod:`aiayn.kernels.build`). Where they cannot be built or the
CPU class is below AVX2, :func:`native_int8` / :func:`native_fp32` are None and the layers run
the library kernels; ``AIAYN_NATIVE=0`` turns them off.

Shape legend:  N output channels (D_out)   K inputs (D_in)   NB = ceil(N / 16)   G = ceil(K / 4)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.kernels import cpu
from aiayn.kernels.build import build_extension

SOURCE = Path(__file__).with_name("csrc") / "linear.cpp"
EXTENSION = "aiayn_linear_v4"  # a new name whenever the source changes its operators
BLOCK = 16  # output channels per block: one 512-bit vector of int32 sums
GROUP = 4  # inputs per VNNI lane (u8 × s8 products summed in fours)
OFFSET = 128  # the activations' shift to unsigned (VNNI's u8 × s8)


def vnni_blocks(weight: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's layout of an int8 weight (N, K): blocks (NB, G, 64), for each 16 output
    channels and each 4 inputs one 64-byte vector (channel-major, then input), zero-padded;
    and the compensation 128 · Σ_i W[o, i] (NB·16,) int32 that the unsigned shift adds.

    E.g. W = [[1, 2, 3, 4, 5]] (N 1, K 5): blocks (1, 2, 64), blocks[0, 0, :4] = [1, 2, 3, 4],
    blocks[0, 1, :4] = [5, 0, 0, 0], everything else 0; compensation [1920, 0, ..., 0].
    """
    n, k = weight.shape
    n_pad, k_pad = -(-n // BLOCK) * BLOCK, -(-k // GROUP) * GROUP
    padded = F.pad(weight, (0, k_pad - k, 0, n_pad - n))  # (N_pad, K_pad)
    blocks = padded.view(n_pad // BLOCK, BLOCK, k_pad // GROUP, GROUP)  # (NB, 16, G, 4)
    blocks = blocks.permute(0, 2, 1, 3).contiguous()  # (NB, 16, G, 4) -> (NB, G, 16, 4)
    compensation = padded.sum(dim=1, dtype=torch.int32) * OFFSET  # (N_pad,)
    return blocks.view(n_pad // BLOCK, k_pad // GROUP, BLOCK * GROUP), compensation


def padded_to_blocks(values: Tensor, n: int) -> Tensor:
    """A per-channel fp32 vector (N,) padded with zeros to whole blocks (NB·16,)."""
    return F.pad(values.float(), (0, -(-n // BLOCK) * BLOCK - n)).contiguous()


def fp32_blocks(weight: Tensor) -> Tensor:
    """The fp32 kernel's layout of a weight (N, K): (NB, K, 16), for each block of 16 output
    channels input by input the 16 weights, zero-padded channels.

    E.g. W = [[1, 2], [3, 4]] (N 2, K 2): blocks (1, 2, 16), blocks[0, 0, :2] = [1, 3],
    blocks[0, 1, :2] = [2, 4], everything else 0.
    """
    n, k = weight.shape
    n_pad = -(-n // BLOCK) * BLOCK
    padded = F.pad(weight.detach().float(), (0, 0, 0, n_pad - n))  # (N_pad, K)
    blocks = padded.view(n_pad // BLOCK, BLOCK, k)  # (NB, 16, K)
    return blocks.transpose(1, 2).contiguous()  # (NB, 16, K) -> (NB, K, 16)


INT8_VARIANTS = {"avx512_vnni": "linear", "avx2": "linear_avx2"}
"""The int8 kernel's builds by the lowest CPU class each runs on (the highest reached runs)."""

FP32_VARIANTS = {"avx512": "linear_fp32", "avx2": "linear_fp32_avx2"}
"""The fp32 kernel's builds, likewise."""

SUPPORTED = {
    "linear": "int8_supported",
    "linear_avx2": "avx2_supported",
    "linear_fp32": "fp32_supported",
    "linear_fp32_avx2": "avx2_supported",
}
"""Each build's own check that the CPU has its instructions (cpuid, in the library)."""


def native_int8() -> Any | None:
    """aiayn's int8 product for the CPU class in force (``linear`` or ``linear_avx2``, resolved:
    ``(x, blocks, compensation, scales, bias, residual, n) -> y``), or None where it does not
    run here (:func:`native_int8_unavailable` says why)."""
    return _operation(_variant(INT8_VARIANTS, cpu.level()))


def native_int8_unavailable() -> str | None:
    """Why aiayn's int8 kernel does not run here, or None when it does."""
    return _why(INT8_VARIANTS, "AVX2")


def native_fp32() -> Any | None:
    """aiayn's fp32 product for a few rows for the CPU class in force (``linear_fp32`` or
    ``linear_fp32_avx2``, resolved: ``(x, blocks, bias, residual, n) -> y``), or None where it
    does not run here (:func:`native_fp32_unavailable` says why)."""
    return _operation(_variant(FP32_VARIANTS, cpu.level()))


def native_fp32_unavailable() -> str | None:
    """Why aiayn's fp32 kernel does not run here, or None when it does."""
    return _why(FP32_VARIANTS, "AVX2")


def native_quantize_rows() -> Any | None:
    """The AVX-512 build's activation quantiser for a library kernel of unsigned inputs
    (``x -> (x_q + 128 as uint8, scales)``), or None where the class in force is below
    ``avx512_vnni`` or the kernel does not run."""
    if not cpu.at_least("avx512_vnni") or native_int8() is None:
        return None
    return torch.ops.aiayn_linear.quantize_rows.default


def int8_variant() -> str | None:
    """The name of the int8 build that runs now, or None."""
    name = _variant(INT8_VARIANTS, cpu.level())
    return name if _operation(name) is not None else None


def fp32_variant() -> str | None:
    """The name of the fp32 build that runs now, or None."""
    name = _variant(FP32_VARIANTS, cpu.level())
    return name if _operation(name) is not None else None


def _variant(variants: dict[str, str], level: str) -> str | None:
    """The build of ``variants`` for CPU class ``level``: the highest whose class it reaches."""
    for needed, name in variants.items():
        if cpu.rank(level) >= cpu.rank(needed):
            return name
    return None


def _why(variants: dict[str, str], lowest: str) -> str | None:
    """Why the kernel of ``variants`` does not run now, or None when it does."""
    why = build_extension(EXTENSION, (SOURCE,))
    if why is not None:
        return why
    name = _variant(variants, cpu.level())
    if name is None:
        return f"the CPU class in force ({cpu.level()}) is below {lowest}"
    return None if _operation(name) is not None else f"this CPU lacks the instructions of {name}"


@functools.cache
def _operation(name: str | None) -> Any | None:
    """The resolved operation ``name`` of the built library, where it is built and the CPU has
    its instructions; None otherwise."""
    if name is None or build_extension(EXTENSION, (SOURCE,)) is not None:
        return None
    ops = torch.ops.aiayn_linear
    return getattr(ops, name).default if getattr(ops, SUPPORTED[name])() else None
