"""Benchmark: encoder-only inference of aiayn against Hugging Face with identical weights.

    python benchmarks/encoders_vs_hf.py [--threads 2] [--rounds 3] [--batches 2]
        [--models bert vit] [--quantize {none,int8}] [--no-report]

- BERT-base shape (12 layers, 768 wide, vocabulary 30,522): batches of 32 sentences of random
  lengths 8–128 tokens, each batch padded to its longest sentence (Hugging Face's
  `padding=True`); both sides get the same padded ids and the same attention mask. Hugging Face
  runs every layer on every padded position, as its `BertModel` does; aiayn runs its encoder
  inference (`aiayn.inference.encoder.BertInference`, what `aiayn embed` runs), whose
  linear layers, feed-forward networks, norms and residuals work on the real tokens only and
  whose attention runs on the padded layout with the mask, as Hugging Face's. Sentences/s of
  the final states.
- ViT-B/16 shape (224×224 images, patch 16): batches of 8 images (nothing padded); aiayn runs
  `ViTInference` (the blocks flattened: activation and residual additions fused into the
  products). Images/s of the logits.

Random weights drawn by transformers, saved with `save_pretrained` and converted by
`aiayn.convert`, so both sides run identical weights; outputs checked equal in the same run (max
|difference| over the real positions; aiayn returns zeros at padded ones). aiayn runs as its
commands do on CPU: the model with its linear layers packed for oneDNN
(`aiayn.inference.pack_for_inference`, once, not timed). fp32, medians of interleaved rounds
(min–max). The fraction of the matmul peak counts the multiply–adds each side performs (2 FLOPs
each: linear layers over every padded position for Hugging Face, over the real tokens for
aiayn; attention products over the padded lengths for both) per second against the CPU's fp32
matmul peak measured in the same run: the fastest of `torch.mm` (MKL) and oneDNN's packed
linear (`_common.matmul_peaks`; on AMD CPUs MKL runs AVX2 code, oneDNN AVX-512, so `torch.mm`
alone understates the peak). Each table names the CPU, the winning kernel, and each side's
kernels (aiayn: oneDNN-packed linears; Hugging Face: `F.linear`, MKL).

With `--quantize int8`, BERT also runs as aiayn int8 (`aiayn.inference.quantize.quantize_model(
model, mode="int8")` under `BertInference`, what `aiayn embed --quantize int8` runs) in the same
rounds: sentences/s against aiayn fp32 (goal ≥ 1.5×), its fraction of the int8 matmul peak
measured in the same run (integer operations of the linear layers, fp32 attention counted
alike), and the cosine of its sentence embeddings (mean over the real tokens) to fp32's, the
lowest over the sentences (gate ≥ 0.99). Writes docs/results/encoders_vs_hf.md and
results/encoders_vs_hf.json.gz (`encoders_vs_hf_int8` with `--quantize int8`) unless
`--no-report`.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Peak,
    add_cpu_class_flags,
    aiayn_kernels,
    command_line,
    machine,
    matmul_peaks,
    report_name,
    run_cpu_classes,
    spread,
    time_interleaved,
    without_cpu_classes,
    write_report,
)
from aiayn.convert import from_hf
from aiayn.inference import pack_for_inference
from aiayn.inference.encoder import BertInference, ViTInference

GOAL = 1.3
INT8_GOAL = 1.5
"""The issue's goal: BERT-base embeddings, aiayn int8 ≥ 1.5× aiayn fp32."""
COSINE_GATE = 0.99
KERNELS = "aiayn: oneDNN-packed linears (`mkldnn._linear_pointwise`); HF: `F.linear` (MKL)"


def bert_pair(folder: Path) -> tuple[Any, Any]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    hf = BertModel(BertConfig()).eval()  # bert-base-uncased's shape
    hf.save_pretrained(folder)
    return hf, from_hf(folder).model


def vit_pair(folder: Path) -> tuple[Any, Any]:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    hf = ViTForImageClassification(ViTConfig(num_labels=1000)).eval()  # ViT-B/16 at 224
    hf.save_pretrained(folder)
    return hf, from_hf(folder).model


def sentence_batches(n: int, batch: int = 32, vocab: int = 30522) -> list[tuple[Any, Any]]:
    """``n`` batches of ``batch`` random sentences of 8–128 ids, padded to the longest."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        lengths = torch.randint(8, 129, (batch,), generator=g)
        ids = torch.randint(1000, vocab, (batch, int(lengths.max())), generator=g)
        mask = torch.arange(ids.size(1))[None, :] < lengths[:, None]  # (B, S)
        out.append((ids.masked_fill(~mask, 0), mask))
    return out


def bert_flops(
    batches: list[tuple[Any, Any]], *, padded: bool, d: int = 768, f: int = 3072, n: int = 12
) -> float:
    """Multiply–adds × 2 of the encoder: per token and layer 4D² + 2DF in the linear layers
    (``padded``: every position of the padded batches, as Hugging Face; else the real tokens
    only, as aiayn), plus attention's 2·S·D per position of the padded batch (both sides)."""
    total = 0
    for ids, mask in batches:
        b, s = ids.shape
        tokens = b * s if padded else int(mask.sum())
        total += n * (tokens * (4 * d * d + 2 * d * f) + b * s * 2 * s * d)
    return 2.0 * total


def vit_flops(images: int, d: int = 768, f: int = 3072, n: int = 12, s: int = 197) -> float:
    patch = 196 * 3 * 16 * 16 * d  # the patch projection
    return 2.0 * images * (patch + n * s * (4 * d * d + 2 * d * f + 2 * s * d))


@torch.inference_mode()
def run_bert(rounds: int, n_batches: int, int8: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        hf, ours = bert_pair(Path(tmp))
    fast = BertInference(pack_for_inference(ours))
    batches = sentence_batches(n_batches)
    gap = max(
        float((hf(input_ids=i, attention_mask=m.long()).last_hidden_state
               - fast(i, attention_mask=m).hidden)[m].abs().max())
        for i, m in batches
    )  # fmt: skip
    fns: dict[str, Callable[[], object]] = {
        "hf": lambda: [hf(input_ids=i, attention_mask=m.long()) for i, m in batches],
        "aiayn": lambda: [fast(i, attention_mask=m) for i, m in batches],
    }
    cosine = None
    if int8:
        from aiayn.inference.quantize import quantize_model

        # in place: a copy of the fp32 model, packed as `aiayn embed --quantize int8` runs it;
        # outside inference mode, as the command quantises (QuantizedLinear checks its
        # tensors' version counters, which inference tensors lack)
        with torch.inference_mode(False):
            int8_model = quantize_model(copy.deepcopy(ours), mode="int8")
            quantised = BertInference(pack_for_inference(int8_model))
        fns["aiayn int8"] = lambda: [quantised(i, attention_mask=m) for i, m in batches]
        cosine = min(
            min_cosine(fast(i, attention_mask=m).hidden, quantised(i, attention_mask=m).hidden, m)
            for i, m in batches
        )
    times = time_interleaved(fns, rounds)
    real = sum(int(m.sum()) for _, m in batches)
    positions = sum(m.numel() for _, m in batches)
    flops = {"hf": bert_flops(batches, padded=True), "aiayn": bert_flops(batches, padded=False)}
    if int8:
        flops["aiayn int8"] = flops["aiayn"]
    return {"times": {k: spread(v) for k, v in times.items()}, "sentences": 32 * n_batches,
            "flops": flops, "real_tokens": real, "positions": positions,
            "max_abs_difference": gap, "int8_min_cosine": cosine}  # fmt: skip


def min_cosine(a: Tensor, b: Tensor, mask: Tensor) -> float:
    """The lowest cosine between the sentence embeddings (mean of the real tokens' states) of
    two (B, S, D) outputs; ``mask`` (B, S), True = real token."""
    m = mask[..., None].to(a.dtype)  # (B, S, 1)
    ea, eb = (x.mul(m).sum(1) / m.sum(1) for x in (a, b))  # (B, D)
    return float(torch.nn.functional.cosine_similarity(ea, eb, dim=-1).min())


@torch.inference_mode()
def run_vit(rounds: int, n_batches: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        hf, ours = vit_pair(Path(tmp))
    fast = ViTInference(pack_for_inference(ours))
    g = torch.Generator().manual_seed(2)
    images = [torch.randn(8, 3, 224, 224, generator=g) for _ in range(n_batches)]
    gap = max(float((hf(pixel_values=x).logits - fast(x).logits).abs().max()) for x in images)
    fns = {
        "hf": lambda: [hf(pixel_values=x) for x in images],
        "aiayn": lambda: [fast(x) for x in images],
    }
    times = time_interleaved(fns, rounds)
    flops = vit_flops(8 * n_batches)
    return {"times": {k: spread(v) for k, v in times.items()}, "images": 8 * n_batches,
            "flops": {"hf": flops, "aiayn": flops}, "max_abs_difference": gap}  # fmt: skip


def speedup(r: dict[str, Any]) -> float:
    """aiayn's throughput over Hugging Face's (medians)."""
    return r["times"]["hf"]["median"] / r["times"]["aiayn"]["median"]


def row(name: str, unit: str, count: int, r: dict[str, Any], peak: float) -> str:
    hf, ours = r["times"]["hf"]["median"], r["times"]["aiayn"]["median"]
    ratio = speedup(r)
    met = "met" if ratio >= GOAL else "**not met**"
    line = (
        f"| {name} | {count / ours:.1f} {unit}/s | {count / hf:.1f} {unit}/s | **{ratio:.2f}×** "
        f"| {r['flops']['aiayn'] / ours / peak:.0%} | {r['flops']['hf'] / hf / peak:.0%} | "
        f"{r['max_abs_difference']:.1e} | ≥ {GOAL}×: {met} |"
    )
    return line


def table(
    args: argparse.Namespace, results: dict[str, Any], peaks: dict[str, Peak], load: float
) -> list[str]:
    """The report's Markdown lines."""
    peak, cpu = peaks["fp32"].flops, machine()["cpu"]
    lines = [
        "# Encoders: aiayn vs Hugging Face (identical weights)",
        "",
        f"`{command_line()}` on {cpu}; {args.threads} threads, fp32; kernels: {KERNELS}; fp32 "
        f"matmul peak measured in the same run, fastest kernel: {peaks['fp32'].describe()}; "
        f"load average (1 min) at start {load:.1f}, at end {os.getloadavg()[0]:.1f}. "
        f"Medians of {args.rounds} interleaved rounds of {args.batches} batches.",
    ]
    if "bert" in results:
        r = results["bert"]
        lines[-1] += (
            " BERT: both sides get the same batches, each padded to its longest sentence "
            f"({r['real_tokens']:,} real tokens of {r['positions']:,} positions, "
            f"{1 - r['real_tokens'] / r['positions']:.0%} padding); Hugging Face runs every "
            "position, aiayn the real tokens only (attention on the padded layout, masked)."
        )
    lines += [
        "",
        "| model, batch | aiayn | HF | **aiayn / HF** | aiayn, of matmul peak | HF, of peak "
        "| max abs difference | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "bert": ("BERT-base, 32 sentences of 8–128 tokens", "sentences"),
        "vit": ("ViT-B/16, 8 images of 224²", "images"),
    }
    for model, r in results.items():
        name, unit = names[model]
        lines.append(row(name, unit, r[unit], r, peak))
    if "int8" in peaks and "bert" in results:
        lines += int8_table(results["bert"], peaks["int8"])
    return lines


def int8_table(r: dict[str, Any], peak: Peak) -> list[str]:
    """BERT int8 against BERT fp32 (both aiayn), same rounds."""
    fp32, int8 = r["times"]["aiayn"]["median"], r["times"]["aiayn int8"]["median"]
    ratio = fp32 / int8
    met = "met" if ratio >= INT8_GOAL else "**not met**"
    cos = r["int8_min_cosine"]
    cos_met = "met" if cos >= COSINE_GATE else "**not met**"
    return [
        "",
        'BERT int8 (`quantize_model(model, mode="int8")` under `BertInference`) against '
        f"aiayn fp32, same rounds; kernels: {aiayn_kernels()}; "
        "int8 matmul peak measured in the same run: "
        f"{peak.describe('GOP/s')}.",
        "",
        "| model, batch | aiayn fp32 | aiayn int8 | **int8 / fp32** | int8, of int8 peak "
        "| lowest embedding cosine to fp32 | goals |",
        "|---|---|---|---|---|---|---|",
        f"| BERT-base, 32 sentences of 8–128 tokens | {r['sentences'] / fp32:.1f} sentences/s "
        f"| {r['sentences'] / int8:.1f} sentences/s | **{ratio:.2f}×** "
        f"| {r['flops']['aiayn int8'] / int8 / peak.flops:.0%} | {cos:.4f} "
        f"| ≥ {INT8_GOAL}×: {met}; cosine ≥ {COSINE_GATE}: {cos_met} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=2, help="batches per timed call")
    parser.add_argument("--models", nargs="+", choices=("bert", "vit"), default=["bert", "vit"])
    parser.add_argument("--quantize", choices=("none", "int8"), default="none",
                        help="int8: also BERT int8 in the same rounds")  # fmt: skip
    parser.add_argument("--no-report", dest="report", action="store_false",
                        help="print the table only; write no report")  # fmt: skip
    add_cpu_class_flags(parser)
    args = parser.parse_args()
    if args.cpu_class is None:  # the parent: each class in a process of its own, with its caps
        run_cpu_classes(args.cpu_classes, __file__, without_cpu_classes(sys.argv[1:]))
        return
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    int8 = args.quantize == "int8"
    peaks = {kind: matmul_peaks(kind) for kind in (("fp32", "int8") if int8 else ("fp32",))}
    results = {}
    for model in args.models:
        if model == "bert":
            results[model] = run_bert(args.rounds, args.batches, int8)
        else:
            results[model] = run_vit(args.rounds, args.batches)
    lines = table(args, results, peaks, load)
    ratios = {model: speedup(r) for model, r in results.items()}
    data = {"machine": machine(), "command": command_line(), "threads": args.threads,
            "matmul_peak_flops": peaks["fp32"].flops,
            "matmul_peaks": {k: p._asdict() for k, p in peaks.items()},
            "kernels": KERNELS, "cpu_class": args.cpu_class, "aiayn_kernels": aiayn_kernels(),
            **results, "ratios": ratios}  # fmt: skip
    print("\n".join(lines))
    if args.report:
        name = "encoders_vs_hf_int8" if int8 else "encoders_vs_hf"
        write_report(report_name(name, args.cpu_class), data, lines)


if __name__ == "__main__":
    main()
