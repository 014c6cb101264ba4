"""aiayn's own linear kernels for x86 CPUs with AVX-512 (``csrc/linear.cpp``):

- **int8** (AVX-512 VNNI): the W8A8 scheme of :mod:`aiayn.layers.quantized` — activations
  quantised per row, exact int32 sums, the same fp32 scaling in the same order — with the
  quantisation, the product and the scaling in one call instead of about ten PyTorch operations
  around a library GEMM. It computes the same bits as the reference (tests hold it to them).
- **fp32, for a few rows** (AVX-512F): y = x Wᵀ + b (+ a residual), on a weight laid out so that
  each thread reads it as one sequential stream. A decoding step's product of one row reads
  every weight once, so its time is the time to read the weight; in a library GEMM's blocked
  layout it read more slowly than a plain sequential read of the same bytes on the test
  machine (docs/benchmarks.md, the CTranslate2 section). The same products as ``F.linear``,
  summed in another order.

They are compiled once per machine on first use (:mod:`aiayn.native_build`). Where they cannot
be built or the CPU lacks the instructions, :func:`native_int8` / :func:`native_fp32` are None
and the layers run the library kernels; ``AIAYN_NATIVE=0`` turns them off.

Shape legend:  N output channels (D_out)   K inputs (D_in)   NB = ceil(N / 16)   G = ceil(K / 4)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.native_build import build_extension

SOURCE = Path(__file__).with_name("csrc") / "linear.cpp"
EXTENSION = "aiayn_linear_v3"  # a new name whenever the source changes its operators
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


def native_int8() -> Any | None:
    """The compiled operations (``linear``, ``quantize_rows``) as ``torch.ops.aiayn_linear``,
    or None where they cannot run here (:func:`native_int8_unavailable` says why)."""
    return _load()[0]


def native_int8_unavailable() -> str | None:
    """Why the native int8 kernel does not run here, or None when it does."""
    return _load()[1]


def native_fp32() -> Any | None:
    """The compiled operations (``linear_fp32``) as ``torch.ops.aiayn_linear``, or None where
    they cannot run here (:func:`native_fp32_unavailable` says why)."""
    return _load()[2]


def native_fp32_unavailable() -> str | None:
    """Why the native fp32 kernel does not run here, or None when it does."""
    return _load()[3]


@functools.cache
def _load() -> tuple[Any | None, str | None, Any | None, str | None]:
    """(int8 operations, why not; fp32 operations, why not)."""
    why = build_extension(EXTENSION, (SOURCE,))
    if why is not None:
        return None, why, None, why
    ops = torch.ops.aiayn_linear
    int8 = (ops, None) if ops.int8_supported() else (None, "this CPU lacks AVX-512 VNNI")
    fp32 = (ops, None) if ops.fp32_supported() else (None, "this CPU lacks AVX-512")
    return (*int8, *fp32)
