"""Benchmark: GPT-2 text generation of aiayn against Hugging Face `GPT2LMHeadModel.generate`.

    python benchmarks/generate_vs_hf.py [--preset gpt2] [--threads 2] [--batches 1 16]

One random `GPT2LMHeadModel` of the preset's shape (124M parameters for `gpt2`), converted into
aiayn with `aiayn.convert` (identical weights); the same prompts (`--prompt-len` random ids),
greedy search, exactly `--new-tokens` new tokens on both sides (`min_new_tokens` holds EOS back),
outputs checked token-identical in the same run. Reports generated tokens/s, the ratio
aiayn / HF, and at each batch the floor: the time to read every weight once (a `Tensor.sum`
over all parameters, timed in the same rounds), as a fraction of aiayn's time per generated
token (batch 1 is bound by that read). aiayn generates as `aiayn generate` does on CPU:
`decoder_only_step` over packed linear layers ("packed": aiayn's fp32 kernel for a few rows,
oneDNN's beyond); also timed with PyTorch's own
`F.linear` ("PyTorch linears"), the kernels HF uses. Medians of `--repeats` interleaved rounds
(min and max kept), so every contender meets the same machine.
With `--quantize int8`, also aiayn int8 (`aiayn.inference.quantize.quantize_model(model,
mode="int8")`, what `aiayn generate --quantize int8` runs) in the same rounds: its tokens/s,
its ratio to aiayn fp32 (goal at batch 1: ≥ 2×), and the share of its outputs identical to
fp32's (int8 arithmetic may change a greedy choice; no identity is required of it).
Writes docs/results/generate_vs_hf_PRESET.md and results/generate_vs_hf_PRESET.json.gz (`_int8`
appended with `--quantize int8`).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    add_cpu_class_flags,
    aiayn_kernels,
    command_line,
    fmt,
    machine,
    report_name,
    run_cpu_classes,
    spread,
    time_interleaved,
    without_cpu_classes,
    write_report,
)
from aiayn.convert.gpt2 import gpt2_from_hf_tensors
from aiayn.decoding.generate import GenerateOptions, generate_ids
from aiayn.inference import pack_for_inference
from aiayn.models import GPT2, gpt2_preset
from aiayn.performance import keep_freed_memory


def hf_model(preset: str, seed: int):  # type: ignore[no-untyped-def]
    """A random-weight `GPT2LMHeadModel` of the preset's shape, without dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    c = gpt2_preset(preset)
    config = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_len,
        n_embd=c.d_model,
        n_layer=c.num_layers,
        n_head=c.num_heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=c.bos_id,
        eos_token_id=c.eos_id,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


INT8_GOAL = 2.0
"""The issue's goal: aiayn int8 ≥ 2× aiayn fp32 tokens/s at batch 1."""


def run_batch(
    hf: Any, ours: GPT2, packed: GPT2, batch: int, args: argparse.Namespace, int8: GPT2 | None
) -> dict:
    """Time one batch size; check the outputs are identical first."""
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, ours.config.vocab_size, (batch, args.prompt_len), generator=g)
    new = args.new_tokens
    options = GenerateOptions(max_new_tokens=new, min_new_tokens=new, batch_size=batch, pack=False)
    ids = prompts.tolist()

    def run_hf() -> list[list[int]]:
        with torch.inference_mode():
            out = hf.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=ours.config.pad_id,
            )
        return out[:, args.prompt_len :].tolist()

    def run(model: GPT2) -> Callable[[], list[list[int]]]:
        return lambda: [h[0].tokens for h in generate_ids(model, ids, options)]

    weights = [p.detach() for p in ours.parameters()]

    def read() -> None:
        for w in weights:
            w.sum()

    want = run_hf()
    identical = run(packed)() == want and run(ours)() == want
    fns: dict[str, Callable[[], object]] = {
        "aiayn packed": run(packed),
        "aiayn PyTorch linears": run(ours),
        "hf": run_hf,
        "read": read,
    }
    int8_out: list[list[list[int]]] = []
    if int8 is not None:
        run_int8 = run(int8)

        def keep_int8() -> None:
            int8_out.append(run_int8())

        fns["aiayn int8"] = keep_int8
    times = time_interleaved(fns, args.repeats)
    return batch_row(times, batch, new, identical, want, int8_out)


def batch_row(
    times: dict[str, list[float]],
    batch: int,
    new: int,
    identical: bool,
    want: list[list[int]],
    int8_out: list[list[list[int]]],
) -> dict[str, Any]:
    """One batch size's row from its times: tokens/s, ratios and floor fractions of each side
    (int8's where it was timed; ``int8_out`` holds its outputs)."""
    tokens = batch * new
    row: dict[str, Any] = {"batch": batch, "identical_outputs": identical, "new_tokens": new}
    for name, t in times.items():
        row[name] = spread(t)
    hf_s = statistics.median(times["hf"])
    for name in ("aiayn packed", "aiayn PyTorch linears"):
        s = statistics.median(times[name])
        row[f"{name} tok/s"] = tokens / s
        row[f"{name} vs hf"] = hf_s / s
        row[f"{name} floor fraction"] = statistics.median(times["read"]) / (s / new)
    if "aiayn int8" in times:
        s = statistics.median(times["aiayn int8"])
        row["aiayn int8 tok/s"] = tokens / s
        row["aiayn int8 vs packed"] = statistics.median(times["aiayn packed"]) / s
        row["aiayn int8 identical to fp32"] = sum(
            a == b for a, b in zip(int8_out[-1], want, strict=True)
        ) / len(want)
    row["hf tok/s"] = tokens / hf_s
    row["hf floor fraction"] = statistics.median(times["read"]) / (hf_s / new)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantize", choices=("none", "int8"), default="none",
                        help="also time aiayn int8 in the same rounds")  # fmt: skip
    add_cpu_class_flags(parser)
    args = parser.parse_args()
    if args.cpu_class is None:  # the parent: each class in a process of its own, with its caps
        run_cpu_classes(args.cpu_classes, __file__, without_cpu_classes(sys.argv[1:]))
        return
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `aiayn generate` sets it on CPU; HF runs in this process too
    hf = hf_model(args.preset, args.seed)
    ours, _ = gpt2_from_hf_tensors(hf.config.to_dict(), hf.state_dict())
    packed = pack_for_inference(ours)
    int8 = None
    if args.quantize == "int8":
        from aiayn.inference.quantize import quantize_model

        # in place: a copy of the fp32 model, packed as `aiayn generate --quantize int8` does
        int8 = pack_for_inference(quantize_model(copy.deepcopy(ours), mode="int8"))
    weight_mb = sum(p.numel() * p.element_size() for p in ours.parameters()) / 1e6
    rows = []
    for batch in args.batches:
        rows.append(run_batch(hf, ours, packed, batch, args, int8))
        print(rows[-1], flush=True)
    report = {
        "command": command_line(),
        "machine": machine(),
        "preset": args.preset,
        "weight_mb": weight_mb,
        "aiayn_kernels": aiayn_kernels(),
        "cpu_class": args.cpu_class,
        "args": vars(args),
        "rows": rows,
    }
    suffix = "_int8" if args.quantize == "int8" else ""
    name = report_name(f"generate_vs_hf_{args.preset}{suffix}", args.cpu_class)
    path = write_report(name, report, markdown(report))
    print(f"wrote {path}")


def markdown(report: dict[str, Any]) -> list[str]:
    """The results table."""
    lines = [
        f"# GPT-2 generation: aiayn vs Hugging Face generate (`{report['preset']}`)",
        "",
        f"`{report['command']}` on {report['machine']['cpu']}, "
        f"{report['machine']['torch_threads']} threads, torch {report['machine']['torch']}. "
        f"Greedy, {report['args']['prompt_len']}-token prompts, {report['args']['new_tokens']} "
        f"new tokens; the weights are {report['weight_mb']:.0f} MB (fp32). Medians of "
        f"{report['args']['repeats']} interleaved rounds (min–max).",
        "",
        "| batch | identical | HF tok/s | aiayn packed tok/s | vs HF | aiayn PyTorch linears "
        "tok/s | vs HF | read floor ms/token | floor / aiayn packed time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        new, b = r["new_tokens"], r["batch"]
        tok = b * new
        lines.append(
            f"| {b} | {'yes' if r['identical_outputs'] else 'NO'} "
            f"| {tok / r['hf']['median']:,.0f} "
            f"| {r['aiayn packed tok/s']:,.0f} | {r['aiayn packed vs hf']:.2f}× "
            f"| {r['aiayn PyTorch linears tok/s']:,.0f} | {r['aiayn PyTorch linears vs hf']:.2f}× "
            f"| {fmt(r['read'], 1e3, 1)} | {100 * r['aiayn packed floor fraction']:.0f}% |"
        )
    if any("aiayn int8 tok/s" in r for r in report["rows"]):
        lines += int8_lines(report)
    return lines


def int8_lines(report: dict[str, Any]) -> list[str]:
    """aiayn int8 against aiayn fp32 (packed), same rounds."""
    lines = [
        "",
        'aiayn int8 (`quantize_model(model, mode="int8")`) against aiayn fp32, same rounds, '
        f"on {report['machine']['cpu']}; kernels: {report.get('aiayn_kernels', 'not recorded')}; "
        f"goal at batch 1: ≥ {INT8_GOAL:.0f}×.",
        "",
        "| batch | aiayn fp32 tok/s | aiayn int8 tok/s | **int8 / fp32** | int8 outputs = fp32 "
        "| goal |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        ratio = r["aiayn int8 vs packed"]
        goal = ""
        if r["batch"] == 1:
            goal = f"≥ {INT8_GOAL:.0f}×: " + ("met" if ratio >= INT8_GOAL else "**not met**")
        lines.append(
            f"| {r['batch']} | {r['aiayn packed tok/s']:,.0f} | {r['aiayn int8 tok/s']:,.0f} "
            f"| **{ratio:.2f}×** | {r['aiayn int8 identical to fp32']:.0%} | {goal} |"
        )
    return lines


if __name__ == "__main__":
    main()
