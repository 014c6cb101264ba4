"""Benchmark (not a test): data-parallel scaling on CPU from 1 to 2 processes, one thread each.

    nice -n 10 python benchmarks/scaling_ddp.py --steps 80

Trains the demo model (d_model 256, 4 heads, d_ff 1024, 3+3 pre-norm layers) on the built-in
Tatoeba EN-DE corpus three ways over the *same global batches* (2 x max_tokens per step):

* 1 process, 2 micro-batches per step (gradient accumulation), ``python -m aiayn train``;
* 2 processes x 1 micro-batch, DDP over gloo, ``torchrun --nproc-per-node 2 -m aiayn train``;
* the same with ``train.distributed=fsdp`` (FSDP2 ``fully_shard``).

All with ``OMP_NUM_THREADS=1`` and ``train.threads=1``: one core per process. Throughput is the
trainer's own ``tgt_tokens_per_s`` (target tokens of the global batch per second), averaged over
the logged windows after the first (warm-up). Efficiency = speed-up / number of processes.
Writes docs/results/scaling_ddp.md and results/scaling_ddp.json.gz.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, write_report
from aiayn.training.config import DEMO_CONFIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(name: str, nproc: int, accum: int, strategy: str, args: argparse.Namespace) -> dict:
    run_dir = Path(args.run_root) / name
    shutil.rmtree(run_dir, ignore_errors=True)
    config: dict[str, Any] = json.loads(json.dumps(DEMO_CONFIG))
    config["run_dir"] = str(run_dir)
    config["data"].update(valid_size=100, bleu_sentences=10)
    config["train"].update(
        max_tokens=args.max_tokens,
        accum_steps=accum,
        max_steps=args.steps,
        max_minutes=None,
        eval_every=0,
        save_every=0,
        average_last=0,
        log_every=args.log_every,
        threads=1,
        progress=False,
        distributed=strategy,
    )
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    config_file = run_dir.parent / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
    launcher = [sys.executable, "-m"]
    if nproc > 1:
        launcher += [
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            "-m",
        ]
    cmd = [*launcher, "aiayn", "train", "--config", str(config_file)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    rates = [e["tgt_tokens_per_s"] for e in entries if e["kind"] == "train"][1:]
    return {
        "name": name,
        "processes": nproc,
        "micro_batches_per_process": accum,
        "strategy": strategy if nproc > 1 else "-",
        "tgt_tokens_per_s": statistics.mean(rates),
        "tgt_tokens_per_s_windows": rates,
        "wall_s_incl_startup_and_eval": wall,
    }


def main() -> None:
    """Run the three configurations, print the table, write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run")
    parser.add_argument("--log-every", type=int, default=10, help="steps per measured window")
    parser.add_argument("--max-tokens", type=int, default=1500, help="tokens per micro-batch")
    parser.add_argument("--run-root", default="runs/bench_scaling_ddp")
    parser.add_argument("--no-fsdp", action="store_true", help="skip the FSDP row")
    args = parser.parse_args()

    rows = [_run("1proc_accum2", 1, 2, "ddp", args), _run("2proc_ddp", 2, 1, "ddp", args)]
    if not args.no_fsdp:
        rows.append(_run("2proc_fsdp", 2, 1, "fsdp", args))
    base = rows[0]["tgt_tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tgt_tokens_per_s"] / base
        row["efficiency"] = row["speedup"] / row["processes"]
    report = {
        "command": command_line(),
        "machine": machine(),
        "threads_per_process": 1,
        "model": "demo: d_model 256, 4 heads, d_ff 1024, 3+3 pre-norm layers, vocab 4000",
        "global_batch": f"2 x {args.max_tokens} tokens per step (same batches in every row)",
        "rows": rows,
    }
    lines = [
        "| processes | strategy | micro-batches / process | target tokens/s | speed-up | "
        "efficiency |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['processes']} | {r['strategy']} | {r['micro_batches_per_process']} | "
            f"{r['tgt_tokens_per_s']:.0f} | {r['speedup']:.2f}x | {100 * r['efficiency']:.0f}% |"
            for r in rows
        ),
    ]
    write_report("scaling_ddp", report, [f"`{report['command']}`", "", *lines])
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
