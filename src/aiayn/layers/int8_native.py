"""aiayn's own int8 linear kernel for x86 CPUs with AVX-512 VNNI (``csrc/int8_linear.cpp``):
the W8A8 scheme of :mod:`aiayn.layers.quantized` — activations quantised per row, exact int32
sums, the same fp32 scaling in the same order — with the quantisation, the product and the
scaling in one call instead of about ten PyTorch operations around a library GEMM.

It is compiled once per machine on first use, by PyTorch's extension builder (a C++ compiler
and ninja are needed; the build is cached in ``$TORCH_EXTENSIONS_DIR``, by default under
``~/.cache/torch_extensions``). Where it cannot be built or the CPU lacks VNNI, :func:`native_int8`
is None and the layers run the library kernels; ``AIAYN_NATIVE=0`` turns it off. Every
kernel computes the same bits (tests hold them to the reference), so which one runs changes
speed only.

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

SOURCE = Path(__file__).with_name("csrc") / "int8_linear.cpp"
BLOCK = 16  # output channels per block: one 512-bit vector of int32 sums
GROUP = 4  # inputs per VNNI lane (u8 × s8 products summed in fours)
OFFSET = 128  # the activations' shift to unsigned (VNNI's u8 × s8)

_why_not: list[str] = []


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


def native_int8() -> Any | None:
    """The compiled operations (``linear``, ``quantize_rows``) as ``torch.ops.aiayn_int8``, or
    None where they cannot run here (:func:`native_int8_unavailable` says why)."""
    return _load()


def native_int8_unavailable() -> str | None:
    """Why the native kernel does not run here, or None when it does."""
    return None if _load() is not None else _why_not[-1]


@functools.cache
def _load() -> Any | None:
    why = build_extension("aiayn_int8_v1", (SOURCE,))
    if why is not None:
        _why_not.append(why)
        return None
    ops = torch.ops.aiayn_int8
    if not ops.supported():
        _why_not.append("this CPU lacks AVX-512 VNNI")
        return None
    return ops
