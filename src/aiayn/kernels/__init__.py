"""aiayn's CPU kernels and the choice of which kernel runs where: the lowest package, which the
attention, the layers and the inference paths call.

- :mod:`aiayn.kernels.cpu`: the CPU class the choice is made on (``generic``, ``avx2``,
  ``avx512``, ``avx512_vnni``), and its caps (``AIAYN_CPU_CAP``, :func:`~aiayn.kernels.cpu.capped`);
- :mod:`aiayn.kernels.build`: building the C++ sources in ``csrc/`` once per machine, bounded in
  time, trusted only with a digest written after a successful build;
- :mod:`aiayn.kernels.linear` and :mod:`aiayn.kernels.attention`: the compiled kernels (linear
  int8 and fp32, decoding-step attention), each in an AVX-512 and an AVX2 build;
- :mod:`aiayn.kernels.int8`: the libraries' int8 products, the rule that lets one run only where
  it is exact, and the choice among the int8 kernels;
- :mod:`aiayn.kernels.dispatch`: the table of which kernel runs for each operation and row count
  on this machine, as ``aiayn kernels`` prints it.

The thresholds between kernels are in :class:`aiayn.settings.PerformanceSettings`, settable by
environment variable for tuning.
"""

from __future__ import annotations

import time


def prepare() -> list[str]:
    """Build (where needed) and load every kernel that runs on this machine, before timed work
    (a training run's clock, a server's readiness): lines saying what is ready, for a log."""
    from aiayn.kernels.attention import native_attention_unavailable
    from aiayn.kernels.linear import native_fp32_unavailable, native_int8_unavailable

    lines = []
    for name, why_not in (
        ("linear", native_int8_unavailable),
        ("attention", native_attention_unavailable),
    ):
        start = time.perf_counter()
        why = why_not()
        took = time.perf_counter() - start
        state = "ready" if why is None else f"not run: {why}"
        lines.append(f"aiayn's {name} kernels: {state} ({took:.1f} s)")
    if native_fp32_unavailable() is not None and native_int8_unavailable() is None:
        lines.append(f"aiayn's fp32 linear kernel: not run: {native_fp32_unavailable()}")
    return lines
