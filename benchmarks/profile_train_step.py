"""Where aiayn's training step spends its time: torch.profiler over a few steps, grouped.

    python benchmarks/profile_train_step.py [--preset small] [--steps 4] [--threads 2]

The same setup as train_vs_torch.py (demo corpus, 8k BPE, 4,096-token batches, the real
``Trainer.train_step``), 2 warm-up steps, then ``--steps`` profiled. Self CPU time of every aten
operator, summed into groups (matmuls, attention kernels, the loss's log-softmax, copies,
dropout, …). Writes docs/results/profile_train_step_PRESET.md and
results/profile_train_step_PRESET.json.gz.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, write_report
from aiayn.training.trainer import Trainer, prepare_data
from train_vs_torch import run_config

GROUPS = {  # aten operator -> group (everything else: "other element-wise and bookkeeping")
    "aten::mm": "matmuls",
    "aten::addmm": "matmuls",
    "aten::bmm": "matmuls",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention kernels",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention kernels",
    "aten::_log_softmax": "loss: log-softmax and exp",
    "aten::exp_": "loss: log-softmax and exp",
    "aten::copy_": "copies",
    "aten::cat": "copies",
    "aten::random_": "dropout masks (random bits, compare)",
    "aten::ge": "dropout masks (random bits, compare)",
    "aten::clamp_min": "ReLU forward and backward",
    "aten::threshold_backward": "ReLU forward and backward",
    "aten::native_layer_norm": "LayerNorm forward and backward",
    "aten::native_layer_norm_backward": "LayerNorm forward and backward",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args()
    args.device, args.precision = "cpu", "auto"
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        run = run_config(args, args.preset, Path(tmp))
        prepare_data(run, reuse_tokenizer=False)
        trainer = Trainer(run, resume=True)  # resume: reuse the tokenizer just trained
        batches = trainer.sampler.batches(0)[: 2 + args.steps]
        for ids in batches[:2]:
            trainer.train_step([ids])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for ids in batches[2:]:
                trainer.train_step([ids])
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        group = GROUPS.get(event.key, "other element-wise and bookkeeping")
        groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total
    total = sum(groups.values())
    rows = sorted(groups.items(), key=lambda kv: -kv[1])
    report: dict[str, Any] = {
        "command": command_line(),
        "machine": machine(),
        "preset": args.preset,
        "steps": args.steps,
        "self_cpu_us": groups,
    }
    lines = [
        f"# Training-step profile: {args.preset}",
        "",
        f"`{command_line()}`",
        "",
        f"{report['machine']['cpu']}, {args.threads} threads, torch {torch.__version__}; "
        f"self CPU time of aten operators over {args.steps} steps of "
        f"{args.max_tokens}-token batches.",
        "",
        "| where | share |",
        "|---|---|",
        *(f"| {name} | {100 * t / total:.1f}% |" for name, t in rows),
    ]
    path = write_report(f"profile_train_step_{args.preset}", report, lines)
    print("\n".join(lines))
    print(f"wrote {path} and results/{path.stem}.json.gz")


if __name__ == "__main__":
    main()
