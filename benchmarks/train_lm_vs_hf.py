"""Benchmark: training speed of aiayn's GPT-2 against Hugging Face `GPT2LMHeadModel` in a plain
loop, same weights, same batches, same optimizer.

    python benchmarks/train_lm_vs_hf.py [--preset gpt2] [--batch 8] [--seq 128] [--threads 2]

One random `GPT2LMHeadModel` of the preset's shape, converted into aiayn (identical weights;
the first loss of both, without dropout, is checked equal in the same run). Each model trains on
the same random token blocks ((B, T + 1) ids: inputs and next-token targets), with dropout as
configured (GPT-2's 0.1 by default), AdamW (lr 1e-4, weight decay 0.01), mean next-token loss.
aiayn's step is what `aiayn train` runs for a language model: `LanguageModelObjective`
(causal kernel, the LM head fused with the loss a chunk of positions at a time, no (N, V)
logits tensor), then backward and the optimizer step; HF's is the cross-entropy of
`model(inputs).logits` against the targets, backward, step. Both use `torch.optim.AdamW` as
the trainer builds it on CPU (the default, unfused implementation). Steps alternate between the two
(interleaved rounds, after warm-up steps), so both meet the same machine. Reports tokens/s,
the ratio aiayn / HF, and the fraction of the measured fp32 matmul peak (matmul FLOPs of a
step / step time / peak).
Writes docs/results/train_lm_vs_hf_PRESET.md and results/train_lm_vs_hf_PRESET.json.gz.
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
from _common import Peak, command_line, device_peak, fmt, machine, spread, write_report
from aiayn.convert.gpt2 import gpt2_from_hf_tensors
from aiayn.models import GPT2Config
from aiayn.performance import keep_freed_memory
from aiayn.training.objective import LanguageModelObjective
from generate_vs_hf import hf_model


def step_flops(c: GPT2Config, batch: int, seq: int) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3 × forward): per token, the
    block weights (4D² attention + 2·D·F feed-forward per layer) and the LM head (V·D) at
    2 FLOPs per multiply-add, plus attention's two (T × T × D) products per layer."""
    d, f, n = c.d_model, c.inner_size, c.num_layers
    per_token = 2 * (n * (4 * d * d + 2 * d * f) + c.vocab_size * d)
    attention = n * 2 * 2 * seq * seq * d  # Q Kᵀ and weights · V, per sequence
    return 3 * (batch * seq * per_token + batch * attention)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `aiayn train` sets it on CPU; both run in this process
    hf = hf_model(args.preset, args.seed).train()
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        setattr(hf.config, key, args.dropout)
    hf = type(hf)(hf.config).train()  # rebuilt with the dropout asked for
    ours, _ = gpt2_from_hf_tensors(hf.config.to_dict(), hf.state_dict())
    ours.train()
    first_loss_gap = check_same_loss(hf, ours, args)
    data = torch.randint(
        0,
        ours.config.vocab_size,
        (args.warmup + args.steps, args.batch, args.seq + 1),
        generator=torch.Generator().manual_seed(args.seed),
    )
    steps = {"aiayn": aiayn_step(ours), "hf": hf_step(hf)}
    measured = device_peak()
    peak = measured.flops
    times = time_alternating(steps, data, args.warmup)
    flops = step_flops(ours.config, args.batch, args.seq)
    tokens = args.batch * args.seq
    row: dict[str, Any] = {"first_loss_gap": first_loss_gap, "tokens_per_step": tokens}
    for name, t in times.items():
        s = statistics.median(t)
        row[name] = {"step_s": spread(t), "tok_s": tokens / s, "peak_fraction": flops / s / peak}
    row["ratio"] = statistics.median(times["hf"]) / statistics.median(times["aiayn"])
    report = {
        "command": command_line(),
        "machine": machine(),
        "preset": args.preset,
        "args": vars(args),
        "matmul_peak_flops": peak,
        "matmul_peak": measured._asdict(),
        "step_flops": flops,
        "row": row,
    }
    print(row, flush=True)
    print(f"wrote {write_report(f'train_lm_vs_hf_{args.preset}', report, markdown(report))}")


def check_same_loss(hf: Any, ours: Any, args: argparse.Namespace) -> float:
    """|aiayn's − HF's| mean next-token loss on one batch, both without dropout."""
    block = torch.randint(0, ours.config.vocab_size, (2, args.seq + 1))
    hf.eval(), ours.eval()
    with torch.no_grad():
        want = hf_loss(hf, block)
        sums = LanguageModelObjective(ours)(block[:, :-1], block[:, 1:])
    hf.train(), ours.train()
    return abs(float(sums.loss) / block[:, 1:].numel() - float(want))


def aiayn_step(model: Any) -> Callable[[torch.Tensor], None]:
    objective = LanguageModelObjective(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def step(block: torch.Tensor) -> None:
        sums = objective(block[:, :-1], block[:, 1:])
        (sums.loss / block[:, 1:].numel()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def hf_loss(model: Any, block: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of HF's logits: (B, T + 1) block -> scalar."""
    logits = model(block[:, :-1]).logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), block[:, 1:].flatten())  # (B·T, V), (B·T,)


def hf_step(model: Any) -> Callable[[torch.Tensor], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def step(block: torch.Tensor) -> None:
        hf_loss(model, block).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_alternating(
    steps: dict[str, Callable[[torch.Tensor], None]], data: torch.Tensor, warmup: int
) -> dict[str, list[float]]:
    """One step of each per batch, in turn; the first ``warmup`` batches untimed."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i, block in enumerate(data):
        for name, step in steps.items():
            start = time.perf_counter()
            step(block)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def peak_caption(report: dict[str, Any]) -> str:
    """The peak and its kernel (reports written before the kernel was recorded: the rate)."""
    if "matmul_peak" in report:
        return Peak(**report["matmul_peak"]).describe()
    return f"{report['matmul_peak_flops'] / 1e9:,.0f} GFLOP/s (torch.mm)"


def markdown(report: dict[str, Any]) -> list[str]:
    """The results table."""
    a, r = report["args"], report["row"]
    lines = [
        f"# GPT-2 training: aiayn vs a plain Hugging Face loop (`{report['preset']}`)",
        "",
        f"`{report['command']}` on {report['machine']['cpu']}, {a['threads']} threads, torch "
        f"{report['machine']['torch']}. Batches of {a['batch']} × {a['seq']} tokens, dropout "
        f"{a['dropout']}, AdamW; {a['steps']} timed steps each, alternating, after "
        f"{a['warmup']} warm-up steps; both sides' linear layers run PyTorch's autograd "
        "kernels (F.linear, MKL); fp32 matmul peak measured in the same run, fastest kernel: "
        f"{peak_caption(report)}. First loss (no dropout) "
        f"|aiayn − HF| = {r['first_loss_gap']:.1e}.",
        "",
        "| implementation | step s, median (min–max) | tokens/s | vs HF "
        "| fraction of matmul peak |",
        "|---|---|---|---|---|",
    ]
    for name in ("aiayn", "hf"):
        x = r[name]
        ratio = f"{r['ratio']:.2f}×" if name == "aiayn" else "1.00×"
        lines.append(
            f"| {name} | {fmt(x['step_s'], 1, 2)} | {x['tok_s']:,.0f} | {ratio} "
            f"| {100 * x['peak_fraction']:.1f}% |"
        )
    return lines


if __name__ == "__main__":
    main()
