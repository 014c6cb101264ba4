"""Benchmark: training throughput of aiayn against `torch.nn.Transformer`, side by side.

    python benchmarks/train_vs_torch.py [--presets small,base] [--threads 2] [--rounds 3]

Both train the same configuration (a preset's layer sizes, the demo corpus's 8k joint BPE,
shared and tied embeddings, dropout 0.1 on sub-layers and embeddings, none on attention weights,
label smoothing 0.1, Adam (0.9, 0.98, 1e-9) with the eq. (3) schedule) on the same token-budget
batches, one optimizer step per batch:

- aiayn: its own training step, ``Trainer.train_step`` (what ``aiayn train`` runs);
- torch: a plain PyTorch loop around ``torch.nn.Transformer`` of identical layer sizes, with
  embeddings, sinusoidal positions and the tied output layer added by hand, boolean padding and
  causal masks, and ``F.cross_entropy(label_smoothing=0.1, ignore_index=pad)`` (the model:
  ``TorchReference`` of benchmarks/_peer_nmt.py, the peer train_multi30k.py trains).

Every (implementation, round) runs in a fresh process (so peak memory is its own); rounds
alternate the order. Per run: ``--warmup`` steps, then ``--steps`` timed steps. Reported:
target tokens/s (median, min–max over rounds), the ratio aiayn / torch of the medians, the
fraction of the measured matmul peak (model FLOPs / time / peak, FLOPs from
:mod:`aiayn.models.flops`), and peak memory (CPU: growth of the peak RSS over the training steps;
GPU: peak allocated). Both processes get the same process settings (``--peer-settings same``,
the default: aiayn's glibc allocator setting and TF32 matmuls apply to the torch loop too);
``--peer-settings default`` leaves the torch loop with the system defaults.
Writes docs/results/train_vs_torch_DEVICE.md and results/train_vs_torch_DEVICE.json.gz
(``_peer_default`` added with ``--peer-settings default``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _multi30k_protocol as protocol
from _common import Peak, command_line, device_peak, fmt, machine, spread, sync, write_report
from _peer_nmt import TorchReference
from aiayn.data import Batch, TokenBatchSampler
from aiayn.models.flops import training_flops
from aiayn.performance import configure_device, keep_freed_memory
from aiayn.training.config import RunConfig, run_config_from_dict
from aiayn.training.schedule import transformer_lr
from aiayn.training.trainer import Trainer, autocast_dtype, prepare_data, resolve_device
from aiayn.training.translation import TRANSLATION_LABEL_SMOOTHING


def run_config(
    args: argparse.Namespace, preset: str, run_dir: Path, *, compile_: bool = False
) -> RunConfig:
    return run_config_from_dict(
        {
            "run_dir": str(run_dir),
            "model": {"preset": preset},
            "data": {"vocab_size": args.vocab_size},
            "train": {
                "max_tokens": args.max_tokens,
                "warmup_steps": 4000,
                "device": args.device,
                "precision": args.precision,
                "threads": args.threads,
                "progress": False,
                "compile": compile_,
                "log_every": 10**6,
                "eval_every": 0,
                "save_every": 0,
            },
        }
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _time_steps(
    step: Callable[[list[int]], None], batches: list[list[int]], warmup: int, device: str
) -> dict[str, Any]:
    """Run every batch through ``step``; time the ones after ``warmup``; note peak memory."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    rss_before = _rss_bytes()
    times = []
    for i, ids in enumerate(batches):
        sync(device)
        start = time.perf_counter()
        step(ids)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    return {"step_seconds": times, "peak_memory_bytes": peak}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One implementation, one round, in this process."""

    run = run_config(args, args.preset, Path(args.run_dir), compile_=args.compile)
    n = args.warmup + args.steps
    if args.worker == "aiayn":
        data, config, batches, step = aiayn_steps(run, n)
    else:
        data, config, batches, step = torch_steps(args, run, n)

    result = _time_steps(step, batches, args.warmup, args.device_name)
    timed = batches[args.warmup :]
    src_lengths = [int(data.train.src_lengths[i]) + 1 for b in timed for i in b]  # + EOS
    tgt_lengths = [int(data.train.tgt_lengths[i]) + 1 for b in timed for i in b]
    result["tgt_tokens"] = sum(tgt_lengths)
    result["flops"] = training_flops(config, src_lengths, tgt_lengths)
    result["batch_shapes"] = [len(b) for b in timed]
    return result


def aiayn_steps(
    run: RunConfig, n: int
) -> tuple[Any, Any, list[list[int]], Callable[[list[int]], None]]:
    """aiayn's data, model config, first ``n`` batches and training step (its Trainer's)."""
    trainer = Trainer(run, resume=True)  # resume: reuse the tokenizer the parent trained
    data, config = trainer.data, trainer.model_config
    batches = trainer.sampler.batches(0)[:n]

    def step(ids: list[int]) -> None:
        trainer.train_step([ids])

    return data, config, batches, step


def peer_layers(run: RunConfig, vocab_size: int) -> Any:
    """The torch loop's layers: the Multi30k protocol's same-recipe peer of ``run``."""
    return protocol.peer_config(run, protocol.same_recipe(run), vocab_size)


def torch_steps(
    args: argparse.Namespace, run: RunConfig, n: int
) -> tuple[Any, Any, list[list[int]], Callable[[list[int]], None]]:
    """The torch loop's data, model config, first ``n`` batches and training step."""
    data = prepare_data(run, reuse_tokenizer=True)
    device = resolve_device(args.device)
    if args.peer_settings == "same":
        if device.type == "cpu":
            keep_freed_memory()
        configure_device(device)
    tok = data.tokenizer
    config = run.model.replace(vocab_size=tok.vocab_size, pad_id=tok.pad_id)
    torch.manual_seed(run.train.seed)
    model = TorchReference(peer_layers(run, tok.vocab_size)).to(device).train()
    compiled: Callable[..., Tensor] = torch.compile(model) if args.compile else model
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=0.0,
        betas=run.train.adam_betas,
        eps=run.train.adam_eps,
        fused=device.type == "cuda" or None,
    )
    amp = autocast_dtype(run.train.precision, device)
    sampler = TokenBatchSampler(
        data.train.src_lengths,
        data.train.tgt_lengths,
        run.train.max_tokens,
        seed=run.train.seed,
    )
    batches = sampler.batches(0)[:n]
    step_number = itertools.count(1)

    def step(ids: list[int]) -> None:
        batch: Batch = data.train.collate(ids)
        if device.type == "cuda":
            batch = batch.pin_memory().to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            logits = compiled(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            batch.tgt_out.flatten(),
            ignore_index=config.pad_id,
            label_smoothing=TRANSLATION_LABEL_SMOOTHING,  # aiayn's default: §5.4
            reduction="sum",
        )
        (loss / batch.num_tgt_tokens).backward()
        lr = transformer_lr(next(step_number), config.d_model, run.train.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return data, config, batches, step


def spawn(
    args: argparse.Namespace, impl: str, preset: str, run_dir: Path, compile_: bool
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        impl,
        "--preset",
        preset,
        "--run-dir",
        str(run_dir),
        "--out",
        str(out),
        "--threads",
        str(args.threads),
        "--max-tokens",
        str(args.max_tokens),
        "--vocab-size",
        str(args.vocab_size),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
        "--precision",
        args.precision,
        "--peer-settings",
        args.peer_settings,
    ] + (["--compile"] if compile_ else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return result


def parse_args() -> argparse.Namespace:
    """The command line (the hidden options are the worker's)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="small,base")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--compile", action="store_true", help="also measure torch.compile")
    parser.add_argument(
        "--compile-presets", default="", help="measure torch.compile for these presets only"
    )
    parser.add_argument("--peer-settings", choices=("same", "default"), default="same")
    parser.add_argument("--worker", choices=("aiayn", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.device_name = resolve_device(args.device).type
    if args.worker:
        if args.device_name == "cpu":
            torch.set_num_threads(args.threads)
        Path(args.out).write_text(json.dumps(worker(args)))
        return

    torch.set_num_threads(args.threads)
    on_gpu = args.device_name == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    peak_name = "bf16" if on_gpu else "fp32"
    measured = [device_peak(args.device_name, dtype)]  # again at the end: the higher counts
    print(f"measured {peak_name} matmul peak: {measured[0].describe()}", flush=True)
    compile_presets = args.presets if args.compile else args.compile_presets
    report: dict[str, Any] = {
        "benchmark": "train_vs_torch",
        "command": command_line(),
        "machine": machine(),
        "matmul_peak_dtype": peak_name,
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("worker", "preset", "run_dir", "out")
        },
        "presets": {},
    }
    all_runs = run_presets(args, compile_presets)
    measured.append(device_peak(args.device_name, dtype))
    best = max(measured, key=lambda p: p.flops)
    peaks = [p.flops for p in measured]
    peak = best.flops
    report["matmul_peak_flops"] = peak
    report["matmul_peak_kernel"] = best.kernel
    report["matmul_peak_measurements"] = peaks
    report["matmul_peak_by_kernel"] = [p.by_kernel for p in measured]
    lines = header_lines(args, report["machine"], best, peaks, peak_name, on_gpu)
    for preset, runs in all_runs.items():
        rows = preset_rows(runs, peak)
        lines += preset_lines(preset, rows)
        report["presets"][preset] = rows
    suffix = "" if args.peer_settings == "same" else "_peer_default"
    path = write_report(f"train_vs_torch_{args.device_name}{suffix}", report, lines)
    print("\n".join(lines))
    print(f"wrote {path} and results/{path.stem}.json.gz")


def run_presets(
    args: argparse.Namespace, compile_presets: str
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Run every round of every preset, each in its own processes; the runs by preset and side."""
    all_runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            run_dir = Path(tmp) / preset
            prepare_data(run_config(args, preset, run_dir), reuse_tokenizer=False)
            variants = [("aiayn", False), ("torch", False)]
            if preset in compile_presets.split(","):
                variants += [("aiayn", True), ("torch", True)]
            runs = all_runs.setdefault(preset, {})
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for impl, comp in order:
                    name = impl + (" + compile" if comp else "")
                    res = spawn(args, impl, preset, run_dir, comp)
                    runs.setdefault(name, []).append(res)
                    rate = res["tgt_tokens"] / sum(res["step_seconds"])
                    print(f"{preset} round {r + 1} {name}: {rate:,.0f} tok/s", flush=True)
    return all_runs


def header_lines(
    args: argparse.Namespace,
    machine_info: dict[str, Any],
    best: Peak,
    peaks: list[float],
    peak_name: str,
    on_gpu: bool,
) -> list[str]:
    """The Markdown page down to the table's header: command, machine, peak and protocol."""
    return [
        f"# Training throughput: aiayn vs torch.nn.Transformer ({args.device_name})",
        "",
        f"`{command_line()}`",
        "",
        f"Machine: {machine_info['cpu']}"
        + (f", {machine_info['gpu']}" if on_gpu else f", {args.threads} threads")
        + f"; torch {torch.__version__}; both sides' linear layers run PyTorch's autograd "
        f"kernels; measured {peak_name} matmul peak, fastest kernel: {best.describe()} (the "
        "higher of "
        + " and ".join(f"{p / 1e9:,.0f}" for p in peaks)
        + f", before and after). Medians over {args.rounds} rounds (min–max), "
        f"{args.steps} timed steps each after {args.warmup} warm-up steps; "
        f"batches of {args.max_tokens} tokens.",
        "",
        "| preset | implementation | target tokens/s | vs torch | fraction of matmul peak "
        "| peak memory (MiB) |",
        "|---|---|---|---|---|---|",
    ]


def preset_rows(runs: dict[str, list[dict[str, Any]]], peak: float) -> dict[str, dict[str, Any]]:
    """One preset's results by implementation: spreads over its rounds and the ratio to torch."""
    rows = {}
    for name, results in runs.items():
        rates = [x["tgt_tokens"] / sum(x["step_seconds"]) for x in results]
        mfu = [x["flops"] / sum(x["step_seconds"]) / peak for x in results]
        mem = [x["peak_memory_bytes"] / 2**20 for x in results]
        rows[name] = {
            "tgt_tokens_per_s": spread(rates),
            "matmul_peak_fraction": spread(mfu),
            "peak_memory_mib": spread(mem),
            "runs": results,
        }
    torch_rate = rows["torch"]["tgt_tokens_per_s"]["median"]
    for row in rows.values():
        row["ratio_vs_torch"] = row["tgt_tokens_per_s"]["median"] / torch_rate
    return rows


def preset_lines(preset: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    """One preset's table rows, one per implementation."""
    return [
        f"| {preset} | {name} | {fmt(row['tgt_tokens_per_s'])} | "
        f"{row['ratio_vs_torch']:.2f}× | {fmt(row['matmul_peak_fraction'], 100, 1)}% | "
        f"{fmt(row['peak_memory_mib'])} |"
        for name, row in rows.items()
    ]


if __name__ == "__main__":
    main()
