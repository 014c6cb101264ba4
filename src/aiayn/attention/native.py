"""aiayn's own attention kernel for short queries on x86 CPUs with AVX-512
(``csrc/attention.cpp``): eq. (1) of §3.2.1, softmax(scale · Q Kᵀ + bias) V with a boolean mask,
in one call per attention of a decoding step instead of PyTorch's fused kernel or three plain
operations, whose set-up costs more than the few thousand multiply-adds of one query over a few
dozen keys.

It is compiled once per machine on first use by :func:`aiayn.native_build.build_extension` (a
C++ compiler and ninja are needed; cached in ``$TORCH_EXTENSIONS_DIR``). Where it cannot be
built or the CPU lacks AVX-512, :func:`native_attention` is None and attention runs as before;
``AIAYN_NATIVE=0`` turns it off. Tests hold it to the reference path
(:func:`aiayn.attention.scaled_dot_product._explicit_attention`) up to fp32 summation order.

Shape legend:  B batch   H heads   T queries   S keys   d_k query/key size   d_v value size
The operation ``attend(query (B, H, T, d_k), key (B, H, S, d_k), value (B, H, S, d_v), mask,
bias, scale, min_parallel_macs) -> (B, H, T, d_v)``: mask bool and bias float32, each
broadcastable to (B, H, T, S) or None; scale None = 1/√d_k; the heads run on several threads
from ``min_parallel_macs`` multiply-adds in the call (B·H·T·S·(d_k + d_v)), each thread getting
at least half of them.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from aiayn.native_build import build_extension

SOURCE = Path(__file__).with_name("csrc") / "attention.cpp"

_why_not: list[str] = []


def native_attention() -> Any | None:
    """The compiled operations (``attend``, ``supported``) as ``torch.ops.aiayn_attention``, or
    None where they cannot run here (:func:`native_attention_unavailable` says why)."""
    return _load()


@functools.cache
def native_attend() -> Any | None:
    """The ``attend`` operation itself (its one overload, resolved once), or None where the
    kernel does not run here."""
    ops = _load()
    return None if ops is None else ops.attend.default


def native_attention_unavailable() -> str | None:
    """Why the native kernel does not run here, or None when it does."""
    return None if _load() is not None else _why_not[-1]


@functools.cache
def _load() -> Any | None:
    why = build_extension("aiayn_attention_v1", (SOURCE,))
    if why is not None:
        _why_not.append(why)
        return None
    ops = torch.ops.aiayn_attention
    if not ops.supported():
        _why_not.append("this CPU lacks AVX-512")
        return None
    return ops
