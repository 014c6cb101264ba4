"""Process-level settings that make training and inference faster: the CPU allocator, the GPU
matmul mode.

CPU: PyTorch allocates every activation and gradient with ``malloc``. glibc serves blocks above
its mmap threshold (≤ 32 MiB, adaptive) with fresh ``mmap`` calls and returns them to the OS on
``free``, so each step page-faults and zero-fills its large tensors again (the (N, V) logits of a
``small`` step are ~130 MB). :func:`keep_freed_memory` raises the mmap and trim thresholds so
freed memory stays in the heap for the next step, as a caching allocator would (the process
keeps its peak memory instead of shrinking between steps). Measured on the `small` step:
see docs/performance.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_LARGE = 1 << 30  # 1 GiB: larger blocks than this still come from mmap


def keep_freed_memory() -> bool:
    """Make glibc keep freed blocks up to 1 GiB for reuse; True if it took effect.

    Affects the whole process and lasts until it exits. A no-op (False) off Linux/glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_ok = mallopt(_M_MMAP_THRESHOLD, _LARGE)
    trim_ok = mallopt(_M_TRIM_THRESHOLD, 2 * _LARGE - 1)
    return bool(mmap_ok and trim_ok)


def return_freed_memory() -> bool:
    """Give the freed heap back to the system (glibc's ``malloc_trim(0)``), whatever
    :func:`keep_freed_memory` keeps; True if it ran. A no-op (False) off Linux/glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def configure_device(device: torch.device) -> None:
    """Per-device speed settings: TF32 matmuls on CUDA (no effect on bf16/fp16 autocast)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
