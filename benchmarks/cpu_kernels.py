"""Benchmark: the CPU kernels behind two decoding choices, against PyTorch's defaults.

    python benchmarks/cpu_kernels.py [--threads 2]

1. Linear layers: ``F.linear`` (MKL GEMM) against aiayn's oneDNN-packed ``PackedLinear`` (oneDNN
   for every product here: ``dense_small=False``), for the weight shapes of the ``small`` and
   ``base`` decoders at 1, 4, 32 and 128 rows (greedy and beam-4 decoding of 1 and 32
   sentences). GFLOP/s = 2·rows·D_in·D_out / time. The weights stay in cache between calls; the
   last column is the kernel ``pack_for_inference`` picks for such a product when a decoding
   step's weights stay in cache (PyTorch's for up to 2^18 multiply–adds).
2. Attention: ``F.scaled_dot_product_attention`` (fused kernel) against the explicit
   Q Kᵀ → softmax → · V that aiayn uses for many short queries without gradients.

Best of 5 rounds of ``--calls`` calls each. The fp32 and int8 matmul peaks are measured in the
same run with the fastest kernel of each (``_common.matmul_peaks``: fp32 ``torch.mm``/MKL or
oneDNN's packed linear; int8 ``torch._int_mm`` or the quantized engines' linears), and named
with the CPU. Writes docs/results/cpu_kernels.md and results/cpu_kernels.json.gz.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Peak, command_line, machine, matmul_peaks, write_report
from aiayn.attention.scaled_dot_product import _explicit_attention, _explicit_is_faster
from aiayn.inference import PackedLinear
from aiayn.inference.kernels import small_product

SHAPES = {  # (D_in, D_out) of the decoder's linear layers and the output layer
    "small": [(256, 768), (256, 256), (256, 1024), (1024, 256), (256, 8000)],
    "base": [(512, 1536), (512, 512), (512, 2048), (2048, 512), (512, 8000)],
}
ATTENTION = [  # (B, H, T, S): decoding steps of 1 and 32 sentences, greedy and beam 4
    (1, 4, 1, 32),
    (4, 4, 1, 32),
    (32, 4, 1, 32),
    (128, 4, 1, 32),
    (32, 4, 4, 24),
    (1, 8, 4, 24),
    (8, 8, 4, 24),
    (32, 8, 1, 32),
    (128, 8, 1, 32),
]


def best_us(fn: Callable[[], object], calls: int) -> float:
    """Best per-call time in µs over 5 rounds of ``calls`` calls, after a warm-up."""
    for _ in range(5):
        fn()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return min(rounds)


@torch.inference_mode()
def main() -> None:
    """Time both kernels for every shape and write the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peaks = {kind: matmul_peaks(kind) for kind in ("fp32", "int8")}
    linear_rows = time_linears(args.calls)
    attention_rows = time_attention(args.calls)
    report = {
        "command": command_line(),
        "machine": machine(),
        "matmul_peak_gflops": peaks["fp32"].flops / 1e9,  # the fastest fp32 kernel
        "matmul_peaks": {k: p._asdict() for k, p in peaks.items()},
        "linear": linear_rows,
        "attention": attention_rows,
    }
    lines = markdown(report, peaks, args.threads)
    write_report("cpu_kernels", report, lines)
    print("\n".join(lines))


def time_linears(calls: int) -> list[dict[str, Any]]:
    """F.linear against the packed linear for every weight shape and row count, one row each."""
    linear_rows = []
    for preset, shapes in SHAPES.items():
        for d_in, d_out in shapes:
            layer = nn.Linear(d_in, d_out)
            packed = PackedLinear(layer, dense_small=False)  # oneDNN throughout
            for rows in (1, 4, 32, 128):
                x = torch.randn(rows, d_in)
                ours = best_us(lambda x=x, packed=packed: packed(x), calls)
                torchs = best_us(
                    lambda x=x, layer=layer: F.linear(x, layer.weight, layer.bias), calls
                )
                flops = 2 * rows * d_in * d_out
                linear_rows.append(
                    {
                        "preset": preset,
                        "d_in": d_in,
                        "d_out": d_out,
                        "rows": rows,
                        "f_linear_us": torchs,
                        "packed_us": ours,
                        "speedup": torchs / ours,
                        "f_linear_gflops": flops / torchs / 1e3,
                        "packed_gflops": flops / ours / 1e3,
                        # pack_for_inference's rule while a step's weights stay in cache
                        "aiayn_uses": "F.linear" if small_product(x, d_out) else "packed",
                    }
                )
                print(linear_rows[-1], flush=True)
    return linear_rows


def time_attention(calls: int) -> list[dict[str, Any]]:
    """The fused attention kernel against the explicit one for every shape, one row each."""
    attention_rows = []
    for b, h, t, s in ATTENTION:
        q, k, v = torch.randn(b, h, t, 64), torch.randn(b, h, s, 64), torch.randn(b, h, s, 64)
        fused = best_us(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v), calls)
        explicit = best_us(
            lambda q=q, k=k, v=v: _explicit_attention(q, k, v, None, None, None, 0.0), calls
        )
        attention_rows.append(
            {
                "shape": [b, h, t, s],
                "fused_us": fused,
                "explicit_us": explicit,
                "aiayn_uses": "explicit" if _explicit_is_faster(q, k, 0.0) else "fused",
            }
        )
        print(attention_rows[-1], flush=True)
    return attention_rows


def markdown(report: dict[str, Any], peaks: dict[str, Peak], threads: int) -> list[str]:
    """The two tables, after a line naming the machine, the matmul peaks and the kernels."""
    lines = [
        f"On {report['machine']['cpu']}, {threads} threads. Matmul peaks measured in the "
        f"same run, fastest kernel of each: fp32 {peaks['fp32'].describe()}; int8 "
        f"{peaks['int8'].describe('GOP/s')}. Kernels: F.linear is PyTorch's (MKL), packed is "
        "oneDNN's `mkldnn._linear_pointwise` on a weight packed once.",
        "",
        "| preset | D_in × D_out | rows | F.linear µs (GFLOP/s) | packed µs (GFLOP/s) | speed-up "
        "| aiayn uses, weights in cache |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["linear"]:
        lines.append(
            f"| {r['preset']} | {r['d_in']} × {r['d_out']} | {r['rows']} "
            f"| {r['f_linear_us']:.0f} ({r['f_linear_gflops']:.0f}) "
            f"| {r['packed_us']:.0f} ({r['packed_gflops']:.0f}) | {r['speedup']:.2f}× "
            f"| {r['aiayn_uses']} |"
        )
    lines += [
        "",
        "| attention (B, H, T, S), d_k 64 | fused µs | explicit µs | aiayn uses |",
        "|---|---|---|---|",
    ]
    for r in report["attention"]:
        lines.append(
            f"| {tuple(r['shape'])} | {r['fused_us']:.0f} | {r['explicit_us']:.0f} "
            f"| {r['aiayn_uses']} |"
        )
    return lines


if __name__ == "__main__":
    main()
