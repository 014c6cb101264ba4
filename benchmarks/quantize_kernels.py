"""Benchmark: the int8 linear kernels against fp32, per weight shape and number of rows.

    python benchmarks/quantize_kernels.py [--threads 2] [--repeats 30]

For the linear layers of an OPUS-MT-shaped decoder (d_model 512, d_ff 2048, vocabulary 58,101)
and BERT-base (768, 3072), at 1 to 256 rows (greedy and beam decoding of 1 and 32 sentences,
encoders), times, interleaved round by round (``_common.time_interleaved``):

- fp32: PyTorch's ``F.linear`` (MKL), oneDNN's packed kernel (``PackedLinear``'s for many rows)
  and aiayn's own fp32 kernel for a few rows (:class:`~aiayn.inference.kernels.NativeFp32`,
  AVX-512F; left out where it does not run);
- W8A16: ``torch.ops.aten._weight_int8pack_mm`` (int8 weights, fp32 activations);
- W8A8, rows quantised on the fly (aiayn's :class:`~aiayn.layers.quantized.Int8Kernel`, each
  of its kernels forced): aiayn's own VNNI kernel (:mod:`aiayn.kernels.linear`, quantisation
  and scaling fused; left out where it does not run), ``torch._int_mm`` and oneDNN's
  ``qlinear_pointwise``;
- PyTorch's dynamic quantised linear (``torch.ops.quantized.linear_dynamic``, fbgemm; one
  activation scale per call, not per row).

The fastest W8A8 kernel per row count sets
:attr:`~aiayn.settings.PerformanceSettings.int8_native_max_rows` and ``int8_onednn_max_rows``;
the fastest fp32 kernel, ``fp32_native_max_rows``.
Medians in µs. Writes docs/results/quantize_kernels.md and results/quantize_kernels.json.gz.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, time_interleaved, write_report
from aiayn.inference import PackedLinear
from aiayn.inference.kernels import NativeFp32
from aiayn.kernels.linear import native_int8
from aiayn.layers.quantized import QuantizedLinear
from aiayn.settings import performance_settings

SHAPES = {  # (D_in, D_out)
    "opus-mt": [(512, 1536), (512, 512), (512, 2048), (2048, 512), (512, 58101)],
    "bert-base": [(768, 2304), (768, 3072), (3072, 768)],
}
ROWS = (1, 2, 4, 8, 16, 32, 128, 256, 1024)
W8A8 = ("W8A8 aiayn VNNI", "W8A8 oneDNN", "W8A8 _int_mm")
FP32 = ("fp32 F.linear", "fp32 oneDNN", "fp32 aiayn")


def _kernels(d_in: int, d_out: int, rows: int) -> dict[str, Callable[[], object]]:
    """The callables timed for one shape and row count."""
    torch.manual_seed(0)
    linear = nn.Linear(d_in, d_out).requires_grad_(False)
    with performance_settings(fp32_native_max_rows=0):  # oneDNN's kernel at every row count
        packed = PackedLinear(linear, dense_small=False)
    x = torch.randn(rows, d_in)
    ours = NativeFp32.of(linear.weight, linear.bias)
    fp32 = {} if ours is None else {"fp32 aiayn": lambda: ours(x)}
    quantized = QuantizedLinear.of(linear)
    w, scales, bias = quantized.weight, quantized.scales, quantized.bias
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the quantized-tensor API's deprecation notice
        zero = torch.zeros(d_out, dtype=torch.long)
        qw = torch.quantize_per_channel(linear.weight, scales.double(), zero, 0, torch.qint8)
    fbgemm = torch.ops.quantized.linear_prepack(qw, bias)

    kernel = quantized.kernel()  # each of its CPU kernels called directly
    native = {"W8A8 aiayn VNNI": lambda: kernel.native(x)} if native_int8() is not None else {}
    return {
        "fp32 F.linear": lambda: F.linear(x, linear.weight, linear.bias),
        "fp32 oneDNN": lambda: packed(x),
        **fp32,
        "W8A16 _weight_int8pack_mm": lambda: torch.ops.aten._weight_int8pack_mm(x, w, scales),
        **native,
        "W8A8 oneDNN": lambda: kernel.onednn(x),
        "W8A8 _int_mm": lambda: kernel.int_mm(x),
        "fbgemm dynamic": lambda: torch.ops.quantized.linear_dynamic(x, fbgemm, False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows_out, results = [], []
    names: list[str] = []
    for model, shapes in SHAPES.items():
        for d_in, d_out in shapes:
            for rows in ROWS:
                fns = _kernels(d_in, d_out, rows)
                names = list(fns)
                repeats = max(3, args.repeats // (8 if d_out > 10000 else 1))
                times = time_interleaved(fns, repeats)
                med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                results.append({"model": model, "d_in": d_in, "d_out": d_out, "rows": rows, **med})
                best = min((k for k in W8A8 if k in med), key=med.__getitem__)
                best32 = min((k for k in FP32 if k in med), key=med.__getitem__)
                cells = " | ".join(f"{med[k]:,.0f}" for k in names)
                line = f"| {model} | {d_in}→{d_out} | {rows} | {cells} | {best32} | {best} |"
                rows_out.append(line)
                print(rows_out[-1], flush=True)
    info = machine()
    md = [
        "# Linear kernels, int8 and fp32 (µs per call, median)",
        "",
        f"`{command_line()}` — {info['cpu']}, {info['torch_threads']} threads, torch "
        f"{info['torch']}",
        "",
        f"| model | shape | rows | {' | '.join(names)} | fastest fp32 | fastest W8A8 |",
        "|---|---|---:|" + "---:|" * len(names) + "---|---|",
        *rows_out,
    ]
    print(write_report("quantize_kernels", {"machine": info, "results": results}, md))


if __name__ == "__main__":
    main()
