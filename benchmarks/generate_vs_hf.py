"""Benchmark: GPT-2 text generation of aiayn against Hugging Face `GPT2LMHeadModel.generate`.

    python benchmarks/generate_vs_hf.py [--preset gpt2] [--threads 2] [--batches 1 16]

One random `GPT2LMHeadModel` of the preset's shape (124M parameters for `gpt2`), converted into
aiayn with `aiayn.convert` (identical weights); the same prompts (`--prompt-len` random ids),
greedy search, exactly `--new-tokens` new tokens on both sides (`min_new_tokens` holds EOS back),
outputs checked token-identical in the same run. Reports generated tokens/s, the ratio
aiayn / HF, and at each batch the floor: the time to read every weight once (a `Tensor.sum`
over all parameters, timed in the same rounds), as a fraction of aiayn's time per generated
token (batch 1 is bound by that read). aiayn generates as `aiayn generate` does on CPU:
`decoder_only_step` over oneDNN-packed linear layers ("packed"); also timed with PyTorch's own
`F.linear` ("PyTorch linears"), the kernels HF uses. Medians of `--repeats` interleaved rounds
(min and max kept), so every contender meets the same machine.
Writes docs/results/generate_vs_hf_PRESET.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, fmt, machine, spread, time_interleaved, write_report
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


def run_batch(hf: Any, ours: GPT2, packed: GPT2, batch: int, args: argparse.Namespace) -> dict:
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
    fns = {
        "aiayn packed": run(packed),
        "aiayn PyTorch linears": run(ours),
        "hf": run_hf,
        "read": read,
    }
    times = time_interleaved(fns, args.repeats)
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `aiayn generate` sets it on CPU; HF runs in this process too
    hf = hf_model(args.preset, args.seed)
    ours, _ = gpt2_from_hf_tensors(hf.config.to_dict(), hf.state_dict())
    packed = pack_for_inference(ours)
    weight_mb = sum(p.numel() * p.element_size() for p in ours.parameters()) / 1e6
    rows = []
    for batch in args.batches:
        rows.append(run_batch(hf, ours, packed, batch, args))
        print(rows[-1], flush=True)
    report = {
        "command": command_line(),
        "machine": machine(),
        "preset": args.preset,
        "weight_mb": weight_mb,
        "args": vars(args),
        "rows": rows,
    }
    path = write_report(f"generate_vs_hf_{args.preset}", report, markdown(report))
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
    return lines


if __name__ == "__main__":
    main()
