"""Run every speed benchmark and write one summary table into the docs.

    python benchmarks/run_all.py [--threads 2] [--rounds 3] [--compile-presets small] [--device cpu]
    python benchmarks/run_all.py --from-results   # rebuild the summary from the files already there

Runs, each as its own process (so they never share the cores):
  1. train_vs_torch.py — training tokens/s against torch.nn.Transformer, fraction of the matmul
     peak, peak memory, for the `small` and `base` presets;
  2. profile_train_step.py — where the `small` training step spends its time (grouped profile);
  3. decode_vs_hf.py — decoding tokens/s against Hugging Face generate, `small` and `base`
     (CPU only);
  4. cpu_kernels.py — the linear and attention kernels behind decoding (CPU only).
Then prints one table and writes docs/results/summary.{json,md} with the machine, the torch
version and this command; each benchmark also leaves its own detailed files there. With
``--from-results`` nothing runs: the summary is assembled from those files, and names the
command that wrote each of them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, machine, write_report

HERE = Path(__file__).resolve().parent


def run(script: str, *args: str) -> None:
    command = [sys.executable, str(HERE / script), *args]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--compile-presets", default="small", help="presets also measured with torch.compile"
    )
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="run nothing; rebuild the summary from the result files in docs/results",
    )
    args = parser.parse_args()
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    if args.from_results:
        training, decoding = load_results(device)
    else:
        training, decoding = run_all(args, device)
    write_summary(args.threads, training, decoding, from_results=args.from_results)


def load_results(device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The training and decoding reports already in docs/results."""
    training = json.loads((RESULTS / f"train_vs_torch_{device}.json").read_text())
    decoding: dict[str, Any] = {}
    for preset in ("small", "base"):
        path = RESULTS / f"decode_vs_hf_{preset}.json"
        if device == "cpu" and path.exists():
            decoding[preset] = json.loads(path.read_text())
    return training, decoding


def run_all(args: argparse.Namespace, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run every benchmark (each in its own process) and return the training and decoding
    reports they wrote."""
    train_args = ["--threads", str(args.threads), "--rounds", str(args.rounds)]
    train_args += ["--device", args.device, "--compile-presets", args.compile_presets]
    run("train_vs_torch.py", "--presets", "small,base", *train_args)
    run("profile_train_step.py", "--preset", "small", "--threads", str(args.threads))
    if device == "cpu":
        for preset in ("small", "base"):
            run("decode_vs_hf.py", "--preset", preset, "--threads", str(args.threads))
        run("cpu_kernels.py", "--threads", str(args.threads))
    return load_results(device)


def write_summary(
    threads: int, training: dict[str, Any], decoding: dict[str, Any], *, from_results: bool
) -> None:
    """Print the summary table and write docs/results/summary.{json,md}."""
    peak = training["matmul_peak_flops"]
    lines = [
        "# Benchmark summary",
        "",
        f"`{command_line()}`",
        "",
        f"Machine: {training['machine']['cpu']}, {training['machine'].get('gpu', 'no GPU')}, "
        f"{threads} threads; torch {training['machine']['torch']}; measured "
        f"{training['matmul_peak_dtype']} matmul peak {peak / 1e9:,.0f} GFLOP/s. "
        "Every ratio is aiayn / peer, both measured in the same run (medians).",
        "",
        *(
            [
                "Assembled from the result files of: "
                + "; ".join(
                    f"`{r['command']}`" for r in [training, *decoding.values()] if "command" in r
                )
                + ".",
                "",
            ]
            if from_results
            else []
        ),
        "| what | preset | aiayn | peer | ratio | aiayn, fraction of matmul peak |",
        "|---|---|---|---|---|---|",
    ]
    for preset, rows in training["presets"].items():
        for variant in [k for k in rows if k.startswith("aiayn")]:
            ours = rows[variant]
            peer = rows[variant.replace("aiayn", "torch")]
            lines.append(
                f"| training tok/s ({variant}) vs nn.Transformer | {preset} | "
                f"{ours['tgt_tokens_per_s']['median']:,.0f} | "
                f"{peer['tgt_tokens_per_s']['median']:,.0f} | "
                f"{ours['tgt_tokens_per_s']['median'] / peer['tgt_tokens_per_s']['median']:.2f}× | "
                f"{100 * ours['matmul_peak_fraction']['median']:.1f}% |"
            )
    for preset, report in decoding.items():
        for r in report["rows"]:
            search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            lines.append(
                f"| decoding tok/s, batch {r['batch']}, {search} vs HF generate | {preset} | "
                f"{r['aiayn_tok_s']:,.0f} | {r['hf_tok_s']:,.0f} | {r['ratio']:.2f}× | |"
            )
    summary = {
        "command": command_line(),
        "machine": machine(),
        "training": training,
        "decoding": decoding,
    }
    path = write_report("summary", summary, lines)
    print("\n".join(lines))
    print(f"wrote {path} and .json")


if __name__ == "__main__":
    main()
