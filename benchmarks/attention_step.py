"""Benchmark: attention at the shapes of a decoding step, aiayn's kernel against PyTorch's.

    python benchmarks/attention_step.py [--threads 2] [--rounds 300] [--inner 20]

Shapes (B, H, T, S, d_k = d_v) of a Marian-shaped decoder (8 heads of 64): one sentence
greedy, self-attention over 8, 32 and 64 cached positions; its 4 beams folded into 4 queries
over a 20-token source; batches of 32 and 128 sentences over 40 keys; 8 sentences' beams folded.
Each shape is timed, interleaved round by round (one batch of ``--inner`` calls per kernel per
round, median over ``--rounds``):

- aiayn's kernel (:mod:`aiayn.attention.native`) on the calling thread, and with the heads
  shared over the threads (a ``min_parallel_macs`` of 0);
- PyTorch's fused ``F.scaled_dot_product_attention``;
- the explicit Q Kᵀ → softmax → · V (``_explicit_attention``);
- :func:`aiayn.attention.scaled_dot_product_attention` as a whole, with its settings as they
  are (aiayn's kernel where it runs) and with ``native_attention_max_queries=0`` (the fused or
  explicit choice it made before the kernel existed).

No mask, no bias (the decode step of one sentence). Medians in µs per call. Writes
docs/results/attention_step.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, write_report
from aiayn.attention import scaled_dot_product_attention
from aiayn.attention.native import native_attention, native_attention_unavailable
from aiayn.attention.scaled_dot_product import _explicit_attention
from aiayn.settings import performance_settings

SHAPES = [  # (B, H, T, S, d)
    (1, 8, 1, 8, 64),
    (1, 8, 1, 32, 64),
    (1, 8, 1, 64, 64),
    (1, 8, 4, 20, 64),
    (32, 8, 1, 40, 64),
    (128, 8, 1, 40, 64),
    (8, 8, 4, 20, 64),
]
SERIAL = 1 << 62  # a min_parallel_macs no call reaches
OFF = {"native_attention_max_queries": 0}  # the paths aiayn had before its kernel

Kernel = tuple[Callable[[], object], dict[str, Any]]  # a call and the settings it runs under


def _kernels(b: int, h: int, t: int, s: int, d: int) -> dict[str, Kernel]:
    """The calls timed at one shape, each with the settings changes it runs under."""
    torch.manual_seed(0)
    q, k, v = torch.randn(b, h, t, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    kernels: dict[str, Kernel] = {}
    ops = native_attention()
    if ops is not None:
        attend = ops.attend.default
        kernels["aiayn kernel, 1 thread"] = (lambda: attend(q, k, v, None, None, None, SERIAL), {})
        kernels["aiayn kernel, threads"] = (lambda: attend(q, k, v, None, None, None, 0), {})
    kernels["PyTorch fused"] = (lambda: F.scaled_dot_product_attention(q, k, v), {})
    kernels["explicit"] = (lambda: _explicit_attention(q, k, v, None, None, None, 0.0), {})
    kernels["aiayn SDPA"] = (lambda: scaled_dot_product_attention(q, k, v), {})
    kernels["aiayn SDPA, kernel off"] = (lambda: scaled_dot_product_attention(q, k, v), OFF)
    return kernels


def _time(kernel: Kernel, inner: int) -> float:
    """Seconds per call over ``inner`` calls, the settings entered outside the clock."""
    fn, changes = kernel
    with performance_settings(**changes):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - start) / inner


def interleaved(kernels: dict[str, Kernel], rounds: int, inner: int) -> dict[str, float]:
    """Median µs per call of each kernel, timed in rounds (one batch of each per round)."""
    for kernel in kernels.values():
        _time(kernel, inner)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(rounds):
        for name, kernel in kernels.items():
            times[name].append(_time(kernel, inner))
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--inner", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    why = native_attention_unavailable()
    rows, results, names = [], [], []
    for shape in SHAPES:
        med = interleaved(_kernels(*shape), args.rounds, args.inner)
        names = list(med)
        results.append({"shape": list(shape), **med})
        speedup = med["aiayn SDPA, kernel off"] / med["aiayn SDPA"]
        cells = " | ".join(f"{med[n]:,.1f}" for n in names)
        rows.append(f"| {', '.join(map(str, shape))} | {cells} | {speedup:.2f}× |")
        print(rows[-1], flush=True)
    info = machine()
    md = [
        "# Attention at decoding-step shapes (µs per call, median)",
        "",
        f"`{command_line()}` — {info['cpu']}, {info['torch_threads']} threads, torch "
        f"{info['torch']}" + (f"; aiayn's kernel: {why}" if why else ""),
        "",
        f"| B, H, T, S, d | {' | '.join(names)} | SDPA speed-up |",
        "|---|" + "---:|" * len(names) + "---:|",
        *rows,
    ]
    print(write_report("attention_step", {"machine": info, "results": results}, md))


if __name__ == "__main__":
    main()
