"""What this CPU can run: the instruction-set class aiayn's kernels dispatch on, and the caps a
user (or a test) puts on it.

The classes, low to high (:data:`LEVELS`):

- ``generic``: any CPU (x86 without AVX2, ARM, …): PyTorch's and the libraries' kernels only;
- ``avx2``: AVX2 and FMA (AMD Zen 1–3, Intel Haswell to the client CPUs since Alder Lake);
- ``avx512``: AVX-512 F, BW, DQ and VL (Intel Skylake-SP, without VNNI);
- ``avx512_vnni``: and AVX-512 VNNI (Intel Cascade Lake and later Xeons, AMD Zen 4 and 5).

The class in force is the highest the CPU has (read from the kernel's CPU flags on Linux, else
from PyTorch's own dispatch, :func:`torch.backends.cpu.get_cpu_capability`), lowered by the cap
``AIAYN_CPU_CAP`` (one of the classes) or, for a block of code, :func:`capped`. A cap never
raises the class. The libraries have caps of their own (``ONEDNN_MAX_CPU_ISA`` for oneDNN,
``ATEN_CPU_CAPABILITY`` for PyTorch's vectorised operations, ``MKL_ENABLE_INSTRUCTIONS`` for
MKL), read by them at start-up;
:func:`library_caps` reports them. A CPU class a kernel was not written for runs the kernel of
the next lower class, and ``generic`` runs no aiayn kernel at all.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiayn.errors import ConfigError

LEVELS = ("generic", "avx2", "avx512", "avx512_vnni")
"""The CPU classes aiayn's kernels dispatch on, low to high."""

CAP = "AIAYN_CPU_CAP"
"""The environment variable that caps the class (one of :data:`LEVELS`)."""

FLAGS_OF = {
    "avx2": ("avx2", "fma"),
    "avx512": ("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"),
    "avx512_vnni": ("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"),
}
"""The Linux CPU flags (``/proc/cpuinfo``) each class above ``generic`` needs."""

LIBRARY_CAPS = (
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "CT2_FORCE_CPU_ISA",
)
"""The libraries' own caps, reported beside aiayn's (each library reads its own)."""

_override: list[str] = []  # caps of enclosing `capped` blocks, innermost last


def rank(level: str) -> int:
    """The position of a class in :data:`LEVELS` (0 = ``generic``); an unknown name is refused
    by name."""
    if level not in LEVELS:
        raise ConfigError(f"unknown CPU class {level!r}: one of {', '.join(LEVELS)}")
    return LEVELS.index(level)


def level_of_flags(flags: frozenset[str]) -> str:
    """The highest class whose flags are all in ``flags``.

    E.g. {"avx2", "fma"} -> "avx2"; {"avx2", "fma", "avx512f", "avx512bw", "avx512dq",
    "avx512vl"} -> "avx512"; {"sse4_2"} -> "generic".
    """
    best = "generic"
    for level in LEVELS[1:]:
        if set(FLAGS_OF[level]) <= flags:
            best = level
    return best


def _cpuinfo_flags() -> frozenset[str] | None:
    """The first processor's flags in /proc/cpuinfo, or None where there is no such file."""
    path = Path("/proc/cpuinfo")
    try:
        text = path.read_text(errors="replace") if path.is_file() else None
    except OSError:
        return None
    for line in (text or "").splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return None


@functools.cache
def detected() -> str:
    """The highest class this CPU has, before any cap."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "generic"
    flags = _cpuinfo_flags()
    if flags is not None:
        return level_of_flags(flags)
    import torch

    pytorch = torch.backends.cpu.get_cpu_capability().lower()  # e.g. "avx512", "avx2"
    return "avx512" if pytorch.startswith("avx512") else "avx2" if pytorch == "avx2" else "generic"


@functools.cache
def environment_cap() -> str | None:
    """The cap ``AIAYN_CPU_CAP`` sets, or None; a bad value is refused by name."""
    value = os.environ.get(CAP, "").strip().lower()
    if not value:
        return None
    if value not in LEVELS:
        raise ConfigError(f"{CAP}={value!r}: one of {', '.join(LEVELS)}")
    return value


def level() -> str:
    """The class aiayn's kernels dispatch on now: the CPU's, lowered by every cap in force."""
    found = detected()
    for cap in (environment_cap(), *_override):
        if cap is not None and rank(cap) < rank(found):
            found = cap
    return found


def at_least(needed: str) -> bool:
    """Whether the class in force reaches ``needed``."""
    return rank(level()) >= rank(needed)


@contextmanager
def capped(cap: str) -> Iterator[str]:
    """Dispatch as on a CPU of class at most ``cap`` inside the block (tests, benchmarks): the
    class in force there is yielded."""
    rank(cap)  # refuse an unknown name before the block
    _override.append(cap)
    try:
        yield level()
    finally:
        _override.pop()


def library_caps() -> dict[str, str]:
    """The libraries' caps set in the environment (name -> value)."""
    return {name: os.environ[name] for name in LIBRARY_CAPS if os.environ.get(name)}


def model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    path = Path("/proc/cpuinfo")
    try:
        text = path.read_text(errors="replace") if path.is_file() else ""
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "unknown"
