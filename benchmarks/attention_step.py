"""Benchmark: attention at the shapes of a decoding step, aiayn's kernel against PyTorch's.

    python benchmarks/attention_step.py [--threads 2] [--rounds 100] [--batch-us 500]
                                        [--decode-repeats 9] [--vocab-size 58101]

Shapes (B, H, T, S, d_k = d_v) of a Marian-shaped decoder (8 heads of 64): one sentence
greedy, self-attention over 8, 32 and 64 cached positions; its 4 beams folded into 4 queries
over a 20-token source; batches of 32 and 128 sentences over 40 keys; 8 sentences' beams
folded; then longer queries (8 to 128), where the query-length cut-off
(:attr:`~aiayn.settings.PerformanceSettings.native_attention_max_queries`) is chosen. Each shape
is timed, interleaved round by round (one batch of calls per kernel per round, as many as take
about ``--batch-us`` µs; median over ``--rounds``):

- aiayn's kernel (:mod:`aiayn.kernels.attention`) on the calling thread, and with the heads
  shared over the threads (a ``min_parallel_macs`` of 0);
- PyTorch's fused ``F.scaled_dot_product_attention``;
- the explicit Q Kᵀ → softmax → · V (``_explicit_attention``);
- :func:`aiayn.attention.scaled_dot_product_attention` as a whole, with its settings as they
  are (aiayn's kernel where it runs) and with ``native_attention_max_queries=0`` (the fused or
  explicit choice it made before the kernel existed).

No mask, no bias (the decode step of one sentence). Medians in µs per call.

Then the kernel alone on one thread and on all, at 2^15 to 2^19 multiply–adds per call
(B·H·T·S·(d_k + d_v)), where
:attr:`~aiayn.settings.PerformanceSettings.native_attention_min_parallel_macs` is chosen.

Then whole decodes, to see the kernel's share of a token: greedy and beam-4 decoding of one
24-token source to exactly 64 tokens by a Marian-shaped model (the ``base`` preset: 6 + 6 layers,
d_model 512, 8 heads of 64; OPUS-MT's vocabulary size; random weights), as ``aiayn translate``
runs it on CPU (``pack_for_inference``), in fp32 and in int8 (``quantize_model``), with the
settings as they are and with ``native_attention_max_queries=0``, interleaved; ms per token
(``--decode-repeats 0``: skipped). Writes docs/results/attention_step.md and
results/attention_step.json.gz.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, write_report
from aiayn.attention import scaled_dot_product_attention
from aiayn.attention.scaled_dot_product import _explicit_attention
from aiayn.config import preset
from aiayn.decoding import beam_search, greedy_search, inference_step
from aiayn.inference import pack_for_inference
from aiayn.inference.quantize import quantize_model
from aiayn.kernels.attention import native_attention, native_attention_unavailable
from aiayn.models import Transformer
from aiayn.performance import keep_freed_memory
from aiayn.settings import performance_settings

SHAPES = [  # (B, H, T, S, d)
    (1, 8, 1, 8, 64),
    (1, 8, 1, 32, 64),
    (1, 8, 1, 64, 64),
    (1, 8, 4, 20, 64),
    (32, 8, 1, 40, 64),
    (128, 8, 1, 40, 64),
    (8, 8, 4, 20, 64),
    (1, 8, 8, 64, 64),
    (1, 8, 16, 64, 64),
    (1, 8, 32, 64, 64),
    (8, 8, 16, 64, 64),
    (8, 8, 32, 32, 64),
    (1, 8, 64, 64, 64),
    (1, 8, 128, 128, 64),
]
THREADS = [  # (B, H, T, S, d): 32k to 512k multiply-adds
    (1, 8, 1, 32, 64),
    (1, 8, 1, 64, 64),
    (1, 8, 4, 20, 64),
    (1, 8, 4, 32, 64),
    (1, 8, 4, 64, 64),
    (4, 8, 1, 64, 64),
    (1, 8, 8, 64, 64),
]
BOS, EOS = 1, 2
SRC_LEN, OUT_LEN = 24, 64
BEAMS = (1, 4)  # greedy, and beam 4 (its cross-attention: 4 queries over the source)
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


def interleaved(kernels: dict[str, Kernel], rounds: int, batch_s: float) -> dict[str, float]:
    """Median µs per call of each kernel, timed in rounds (one batch of each per round, of as
    many calls as take about ``batch_s`` seconds by a warm-up batch of 3)."""
    inner = {name: max(1, round(batch_s / _time(kernel, 3))) for name, kernel in kernels.items()}
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(rounds):
        for name, kernel in kernels.items():
            times[name].append(_time(kernel, inner[name]))
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


def threads_table(rounds: int, batch_s: float) -> list[str]:
    """Markdown rows: the kernel on one thread and on all, by multiply-adds per call."""
    ops = native_attention()
    if ops is None:
        return []
    attend, rows = ops.attend.default, []
    for b, h, t, s, d in THREADS:
        q, k, v = torch.randn(b, h, t, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)
        kernels: dict[str, Kernel] = {
            "one": (partial(attend, q, k, v, None, None, None, SERIAL), {}),
            "all": (partial(attend, q, k, v, None, None, None, 0), {}),
        }
        med = interleaved(kernels, rounds, batch_s)
        macs = b * h * t * s * 2 * d
        rows.append(
            f"| {b}, {h}, {t}, {s}, {d} | {macs:,} | {med['one']:.2f} | {med['all']:.2f} "
            f"| {med['one'] / med['all']:.2f}× |"
        )
        print(rows[-1], flush=True)
    return rows


def decodes(repeats: int, vocab_size: int) -> dict[str, float]:
    """Median ms per token of greedy and beam-4 decoding by a Marian-shaped model, fp32 and
    int8, with aiayn's attention kernel and without, interleaved."""
    torch.manual_seed(0)
    plain = Transformer(preset("base", vocab_size=vocab_size, dropout=0.0)).eval()
    models = {
        "fp32": pack_for_inference(plain),
        "int8": pack_for_inference(quantize_model(copy.deepcopy(plain), mode="int8")),
    }
    src = torch.randint(3, vocab_size, (1, SRC_LEN))
    src[:, -1] = EOS
    ends = {"bos_id": BOS, "eos_id": EOS, "max_len": OUT_LEN, "min_len": OUT_LEN, "batch_size": 1}

    def run(model: Transformer, beam: int) -> object:
        step, state = inference_step(model, src)
        if beam == 1:
            return greedy_search(step, state, **ends)
        return beam_search(step, state, beam_size=beam, alpha=0.6, **ends)

    kernels: dict[str, Kernel] = {}
    for name, model in models.items():
        for beam in BEAMS:
            for label, changes in (("kernel", {}), ("kernel off", OFF)):
                kernels[f"{name}, beam {beam}, {label}"] = (partial(run, model, beam), changes)
    med = interleaved(kernels, repeats, 0.0)  # one decode per batch
    return {name: us / 1e3 / OUT_LEN for name, us in med.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--batch-us", type=float, default=500.0)
    parser.add_argument("--decode-repeats", type=int, default=9)
    parser.add_argument("--vocab-size", type=int, default=58101)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    keep_freed_memory()  # as `aiayn translate` sets it on CPU
    why = native_attention_unavailable()
    rows, results, names = [], [], []
    for shape in SHAPES:
        med = interleaved(_kernels(*shape), args.rounds, args.batch_us * 1e-6)
        names = list(med)
        results.append({"shape": list(shape), **med})
        speedup = med["aiayn SDPA, kernel off"] / med["aiayn SDPA"]
        cells = " | ".join(f"{med[n]:,.1f}" for n in names)
        rows.append(f"| {', '.join(map(str, shape))} | {cells} | {speedup:.2f}× |")
        print(rows[-1], flush=True)
    thread_rows = threads_table(2 * args.rounds, args.batch_us * 1e-6 / 2)
    threads_md = [
        "",
        "aiayn's kernel on one thread and on all (µs per call, median):",
        "",
        "| B, H, T, S, d | multiply–adds | one thread | all threads | speed-up |",
        "|---|---:|---:|---:|---:|",
        *thread_rows,
    ]
    per_token = decodes(args.decode_repeats, args.vocab_size) if args.decode_repeats else {}
    decode_md = [
        "",
        f"Decoding one {SRC_LEN}-token source to {OUT_LEN} tokens, `base` preset, vocabulary "
        f"{args.vocab_size:,} (ms per token, median of {args.decode_repeats}):",
        "",
        "| model | search | kernel | kernel off | speed-up |",
        "|---|---|---:|---:|---:|",
    ]
    for name in ("fp32", "int8") if per_token else ():
        for beam in BEAMS:
            on, off = (per_token[f"{name}, beam {beam}, {x}"] for x in ("kernel", "kernel off"))
            search = "greedy" if beam == 1 else f"beam {beam}"
            decode_md.append(f"| {name} | {search} | {on:.3f} | {off:.3f} | {off / on:.3f}× |")
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
        *(threads_md if thread_rows else []),
        *(decode_md if per_token else []),
    ]
    report = {"machine": info, "results": results, "decode_ms_per_token": per_token}
    print(write_report("attention_step", report, md))


if __name__ == "__main__":
    main()
