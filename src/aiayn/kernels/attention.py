"""aiayn's own attention kernel for short queries on x86 CPUs (``csrc/attention.cpp``): eq. (1)
of §3.2.1, softmax(scale · Q Kᵀ + bias) V with a boolean mask, in one call per attention of a
decoding step instead of PyTorch's fused kernel or three plain operations, whose set-up costs
more than the few thousand multiply-adds of one query over a few dozen keys.

One source holds two builds of the kernel, chosen at call time by the CPU class in force
(:mod:`aiayn.kernels.cpu`): ``attend`` (AVX-512F) and ``attend_avx2`` (AVX2 and FMA). It is built
once per machine (:mod:`aiayn.kernels.build`); where it cannot be built or the class is
``generic``, :func:`native_attend` is None and attention runs as before; ``AIAYN_NATIVE=0`` turns
it off. Tests hold both builds to the reference path
(:func:`aiayn.attention.scaled_dot_product._explicit_attention`) up to fp32 summation order.

Shape legend:  B batch   H heads   T queries   S keys   d_k query/key size   d_v value size
The operation ``attend(query (B, H, T, d_k), key (B, H, S, d_k), value (B, H, S, d_v), mask,
bias, scale, min_parallel_macs) -> (B, H, T, d_v)``: mask bool and bias float32, each
broadcastable to (B, H, T, S) or None; scale None = 1/√d_k; the heads run on several threads
from ``min_parallel_macs`` multiply-adds in the call (B·H·T·S·(d_k + d_v)), each thread getting
at least half of them. ``attend_rows(query (B, H, 1, d_k), key (N, H, C, d_k), value (N, H, C,
d_v), rows (B,), lengths (B,), bias, scale, min_parallel_macs) -> (B, H, 1, d_v)``: query row b
over the first ``lengths[b]`` keys of row ``rows[b]`` of a slot pool's buffers
(:mod:`aiayn.attention.slots`), bias broadcastable to (B, H, 1, max(lengths)).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from aiayn.kernels import cpu
from aiayn.kernels.build import build_extension

SOURCE = Path(__file__).with_name("csrc") / "attention.cpp"
EXTENSION = "aiayn_attention_v3"  # a new name whenever the source changes its operators

VARIANTS = {"avx512": "attend", "avx2": "attend_avx2"}
"""The kernel's builds by the lowest CPU class each runs on (highest first when chosen)."""


def native_attention() -> Any | None:
    """The compiled operations as ``torch.ops.aiayn_attention``, or None where the kernel does
    not run here (:func:`native_attention_unavailable` says why)."""
    return None if native_attention_unavailable() is not None else torch.ops.aiayn_attention


def native_attention_unavailable() -> str | None:
    """Why the native kernel does not run here, or None when it does."""
    why = build_extension(EXTENSION, (SOURCE,))
    if why is not None:
        return why
    return None if _variant(cpu.level()) is not None else "the CPU class is generic"


def native_attend() -> Any | None:
    """The ``attend`` operation of the build for the CPU class in force (its one overload,
    resolved once per class), or None where the kernel does not run here."""
    return _attend_for(cpu.level())


def native_attend_rows() -> Any | None:
    """The ``attend_rows`` operation of the build for the CPU class in force, or None where the
    kernel does not run here."""
    return _attend_for(cpu.level(), "_rows")


def variant_name() -> str | None:
    """The name of the build :func:`native_attend` runs now, or None."""
    return _variant(cpu.level()) if native_attend() is not None else None


def _variant(level: str) -> str | None:
    """The build for CPU class ``level``: the highest whose class it reaches."""
    for needed, name in VARIANTS.items():
        if cpu.rank(level) >= cpu.rank(needed):
            return name
    return None


@functools.cache
def _attend_for(level: str, kind: str = "") -> Any | None:
    """The resolved operation (``attend`` + ``kind``) of the build for ``level``, where it is
    built and the CPU has it."""
    name = _variant(level)
    if name is None or build_extension(EXTENSION, (SOURCE,)) is not None:
        return None
    ops = torch.ops.aiayn_attention
    supported = ops.supported() if name == "attend" else ops.avx2_supported()
    return getattr(ops, name.replace("attend", "attend" + kind)).default if supported else None
