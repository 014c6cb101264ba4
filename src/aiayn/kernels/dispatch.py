"""Which kernel runs, per operation and row count, on this machine now: the table ``aiayn
kernels`` prints, ``aiayn serve`` logs at start-up and the benchmarks put beside their figures.

Each row is made by the same functions the operations call at run time
(:func:`aiayn.kernels.int8.choose_int8`, the loaders of :mod:`aiayn.kernels.linear` and
:mod:`aiayn.kernels.attention`) with the settings in force, so the table cannot say one thing
while another runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from aiayn.kernels import cpu
from aiayn.kernels.attention import native_attention_unavailable, variant_name
from aiayn.kernels.int8 import choose_int8, exact_library_kernels, onednn_available
from aiayn.kernels.linear import (
    fp32_variant,
    int8_variant,
    native_fp32_unavailable,
    native_int8_unavailable,
)
from aiayn.settings import performance

INT8_NAMES = {
    "native": "aiayn {variant}",
    "onednn": "oneDNN qlinear_pointwise",
    "int_mm": "torch._int_mm",
    "reference": "reference ops (float64 sums)",
}
"""How the table names each int8 kernel."""


@dataclass(frozen=True)
class Row:
    """One line of the table: an operation over a range of sizes, and the kernel that runs."""

    operation: str
    sizes: str
    kernel: str


def _spans(bounds: list[tuple[int, str]]) -> list[tuple[str, str]]:
    """Consecutive row ranges with one kernel each: [(last row, kernel)] sorted by last row ->
    [("1–8", kernel), ("9–1024", …), ("1025+", …)], neighbours with the same kernel merged.

    E.g. [(8, "a"), (1024, "a"), (2**62, "b")] -> [("1–1024", "a"), ("1025+", "b")].
    """
    merged: list[tuple[int, int, str]] = []
    first = 1
    for last, kernel in bounds:
        if merged and merged[-1][2] == kernel:
            merged[-1] = (merged[-1][0], last, kernel)
        else:
            merged.append((first, last, kernel))
        first = last + 1
    return [(f"{a}+" if b >= 2**62 else f"{a}–{b}", k) for a, b, k in merged]


def int8_rows() -> list[Row]:
    """The int8 linear layers' kernel per row count."""
    settings, variant = performance(), int8_variant()
    native, exact = variant is not None, exact_library_kernels()
    cuts = sorted({settings.int8_native_max_rows, settings.int8_onednn_max_rows, 2**62})
    bounds = [(c, choose_int8(c, native, exact, settings)) for c in cuts]
    names = {k: v.format(variant=variant) for k, v in INT8_NAMES.items()}
    return [Row("int8 linear", f"{s} rows", names[k]) for s, k in _spans(bounds)]


def fp32_rows() -> list[Row]:
    """The fp32 linear layers' kernel per row count on the inference paths."""
    settings, variant = performance(), fp32_variant()
    big = "oneDNN packed (PyTorch F.linear for products that stay in cache)"
    if variant is None or settings.fp32_native_max_rows < 1:
        return [Row("fp32 linear", "1+ rows", big)]
    bounds = [(settings.fp32_native_max_rows, f"aiayn {variant}"), (2**62, big)]
    return [Row("fp32 linear", f"{s} rows", k) for s, k in _spans(bounds)]


def attention_rows() -> list[Row]:
    """Attention's kernel per number of queries, without gradients (a decoding step)."""
    settings, variant = performance(), variant_name()
    pytorch = "PyTorch (fused SDPA or plain ops)"
    if variant is None or settings.native_attention_max_queries < 1:
        gathered = "gathered rows, masked, then " + pytorch
        return [
            Row("attention", "1+ queries", pytorch),
            Row("attention over slots", "1 query a row", gathered),
        ]
    limit = settings.native_attention_max_queries
    return [
        Row("attention", f"1–{limit} queries", f"aiayn {variant}"),
        Row("attention", f"{limit + 1}+ queries", pytorch),
        Row("attention over slots", "1 query a row", f"aiayn {variant} (attend_rows)"),
    ]


def table() -> list[Row]:
    """Every operation's rows."""
    return [*int8_rows(), *fp32_rows(), *attention_rows()]


def machine_lines() -> list[str]:
    """The CPU, its class and caps, PyTorch's own vector class, and why a kernel does not run."""
    import torch

    cap = cpu.environment_cap()
    caps = ", ".join(f"{k}={v}" for k, v in cpu.library_caps().items()) or "none"
    exact = ", ".join(sorted(exact_library_kernels())) or "none"
    lines = [
        f"CPU: {cpu.model_name()}",
        f"class in force: {cpu.level()} (detected {cpu.detected()}; "
        f"{cpu.CAP}={cap or 'unset'}; library caps: {caps})",
        f"PyTorch vector code: {torch.backends.cpu.get_cpu_capability()}; "
        f"oneDNN int8: {'present' if onednn_available() else 'absent'}; "
        f"exact library int8 kernels here: {exact}",
        f"threads: {torch.get_num_threads()} of {os.cpu_count()} CPUs",
    ]
    for name, why in (
        ("int8 linear", native_int8_unavailable()),
        ("fp32 linear", native_fp32_unavailable()),
        ("attention", native_attention_unavailable()),
    ):
        if why is not None:
            lines.append(f"aiayn's {name} kernel does not run: {why}")
    return lines


def report() -> list[str]:
    """What runs on this machine and why: :func:`machine_lines`, then the table."""
    rows = table()
    width = max(len(f"{r.operation}, {r.sizes}") for r in rows)
    return [
        *machine_lines(),
        *(f"  {f'{r.operation}, {r.sizes}':<{width}}  {r.kernel}" for r in rows),
    ]
