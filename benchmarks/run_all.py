"""Run every speed benchmark and write one summary table into the docs.

    python benchmarks/run_all.py [--threads 2] [--rounds 3] [--compile-presets small] [--device cpu]
    python benchmarks/run_all.py --from-results   # rebuild the summary from the files already there

Runs, each as its own process (so they never share the cores):
  1. train_vs_torch.py — training tokens/s against torch.nn.Transformer, fraction of the matmul
     peak, peak memory, for the `small` and `base` presets;
  2. profile_train_step.py — where the `small` training step spends its time (grouped profile);
  3. decode_vs_hf.py — decoding tokens/s against Hugging Face generate, `small` and `base`
     (CPU only);
  4. cpu_kernels.py — the linear and attention kernels behind decoding (CPU only);
  5. generate_vs_hf.py — GPT-2 (124M-shaped) generation against Hugging Face generate, and
     train_lm_vs_hf.py — GPT-2 training steps against a plain GPT2LMHeadModel loop, at 124M and
     at the LM demo's size (CPU only);
  6. translate_vs_hf.py — translation of converted t5-small- and opus-mt-en-de-shaped models
     against Hugging Face generate, outputs checked identical (CPU only);
  7. translate_vs_ct2.py — the opus-mt-en-de shape against CTranslate2, fp32 and int8 (CPU
     only).
Then prints one table and writes docs/results/summary.md (and results/summary.json.gz) with the
machine, the torch version and this command; each benchmark also leaves its own table there and
its raw numbers in results/. With ``--from-results`` nothing runs: the summary is assembled from
those raw files (results/NAME.json.gz), and names the command that wrote each of them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, raw_path, read_json, write_report

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
        help="run nothing; rebuild the summary from the raw result files in results/",
    )
    args = parser.parse_args()
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    if not args.from_results:
        run_all(args, device)
    training, decoding = load_results(device)
    write_summary(
        args.threads,
        training,
        decoding,
        gpt2_results(device),
        translation_results(device),
        from_results=args.from_results,
    )


def load_results(device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The training and decoding reports already in results/."""
    training = read_json(raw_path(f"train_vs_torch_{device}"))
    decoding: dict[str, Any] = {}
    for preset in ("small", "base"):
        path = raw_path(f"decode_vs_hf_{preset}")
        if device == "cpu" and path.exists():
            decoding[preset] = read_json(path)
    return training, decoding


TRANSLATION_MODELS = ("t5-small", "opus-mt-en-de")
"""The checkpoint shapes of translate_vs_hf.py."""
CT2_REPORT = "opus-mt-en-de vs CTranslate2"
"""translate_vs_ct2.py's report, among the translation reports."""

GPT2_TRAINING = {
    "gpt2": [],
    "gpt2-tiny": ["--batch", "16", "--seq", "128", "--steps", "20", "--warmup", "3"],
}


def gpt2_results(device: str) -> dict[str, Any]:
    """The GPT-2 reports in results/: "generate" and "train PRESET" (CPU only)."""
    found: dict[str, Any] = {}
    paths = {"generate": raw_path("generate_vs_hf_gpt2")}
    paths.update({f"train {p}": raw_path(f"train_lm_vs_hf_{p}") for p in GPT2_TRAINING})
    for name, path in paths.items():
        if device == "cpu" and path.exists():
            found[name] = read_json(path)
    return found


def translation_results(device: str) -> dict[str, Any]:
    """The translation reports in results/, by checkpoint shape (CPU only)."""
    found: dict[str, Any] = {}
    for model in TRANSLATION_MODELS:
        path = raw_path(f"translate_vs_hf_{model}")
        if device == "cpu" and path.exists():
            found[model] = read_json(path)
    path = raw_path("translate_vs_ct2")
    if device == "cpu" and path.exists():
        found[CT2_REPORT] = read_json(path)
    return found


def run_all(args: argparse.Namespace, device: str) -> None:
    """Run every benchmark, each in its own process; each writes its report."""
    train_args = ["--threads", str(args.threads), "--rounds", str(args.rounds)]
    train_args += ["--device", args.device, "--compile-presets", args.compile_presets]
    run("train_vs_torch.py", "--presets", "small,base", *train_args)
    run("profile_train_step.py", "--preset", "small", "--threads", str(args.threads))
    if device == "cpu":
        for preset in ("small", "base"):
            run("decode_vs_hf.py", "--preset", preset, "--threads", str(args.threads))
        run("cpu_kernels.py", "--threads", str(args.threads))
        run("generate_vs_hf.py", "--preset", "gpt2", "--threads", str(args.threads))
        for preset, extra in GPT2_TRAINING.items():
            run("train_lm_vs_hf.py", "--preset", preset, "--threads", str(args.threads), *extra)
        for model in TRANSLATION_MODELS:
            run(
                "translate_vs_hf.py",
                *("--model", model, "--threads", str(args.threads), "--rounds", str(args.rounds)),
            )
        run("translate_vs_ct2.py", "--threads", str(args.threads), "--rounds", str(args.rounds))


def write_summary(
    threads: int,
    training: dict[str, Any],
    decoding: dict[str, Any],
    gpt2: dict[str, Any],
    translation: dict[str, Any],
    *,
    from_results: bool,
) -> None:
    """Print the summary table and write docs/results/summary.md, results/summary.json.gz."""
    sources = [training, *decoding.values(), *gpt2.values(), *translation.values()]
    lines = summary_header(threads, training, sources if from_results else [])
    lines += training_rows(training)
    lines += decoding_rows(decoding)
    lines += gpt2_rows(gpt2)
    lines += translation_rows(translation)
    summary = {
        "command": command_line(),
        "machine": machine(),
        "training": training,
        "decoding": decoding,
        "gpt2": gpt2,
        "translation": translation,
    }
    path = write_report("summary", summary, lines)
    print("\n".join(lines))
    print(f"wrote {path} and {raw_path('summary')}")


def summary_header(
    threads: int, training: dict[str, Any], sources: list[dict[str, Any]]
) -> list[str]:
    """The summary page down to the table's header: command, machine, peak, and the commands
    of the result files ``sources`` it was assembled from (none: no such line)."""
    peak = training["matmul_peak_flops"]
    return [
        "# Benchmark summary",
        "",
        f"`{command_line()}`",
        "",
        f"Machine: {training['machine']['cpu']}, {training['machine'].get('gpu', 'no GPU')}, "
        f"{threads} threads; torch {training['machine']['torch']}; measured "
        f"{training['matmul_peak_dtype']} matmul peak {peak / 1e9:,.0f} GFLOP/s "
        f"({peak_kernel(training)}; fractions of the peak are of that). "
        "Every ratio is aiayn / peer, both measured in the same run (medians); each "
        "benchmark's own report names the kernels each side ran.",
        "",
        *(
            [
                "Assembled from the result files of: "
                + "; ".join(f"`{r['command']}`" for r in sources if "command" in r)
                + ".",
                "",
            ]
            if sources
            else []
        ),
        "| what | preset | aiayn | peer | ratio | aiayn, fraction of matmul peak |",
        "|---|---|---|---|---|---|",
    ]


def training_rows(training: dict[str, Any]) -> list[str]:
    """Summary rows of train_vs_torch.py: each aiayn variant against its torch peer."""
    lines = []
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
    return lines


def decoding_rows(decoding: dict[str, Any]) -> list[str]:
    """Summary rows of the decode_vs_hf.py reports."""
    lines = []
    for preset, report in decoding.items():
        for r in report["rows"]:
            search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            lines.append(
                f"| decoding tok/s, batch {r['batch']}, {search} vs HF generate | {preset} | "
                f"{r['aiayn_tok_s']:,.0f} | {r['hf_tok_s']:,.0f} | {r['ratio']:.2f}× | |"
            )
    return lines


def peak_kernel(training: dict[str, Any]) -> str:
    """Which kernel the training report's peak is: the fastest measured
    (`_common.matmul_peaks`), or `torch.mm` alone in reports written before that."""
    if "matmul_peak_kernel" in training:
        return f"{training['matmul_peak_kernel']}, the fastest kernel measured"
    return "torch.mm alone: a report written before the peak took the fastest kernel"


def gpt2_rows(gpt2: dict[str, Any]) -> list[str]:
    """Summary rows of the GPT-2 reports."""
    lines = []
    for r in gpt2.get("generate", {}).get("rows", []):
        lines.append(
            f"| GPT-2 generation tok/s, batch {r['batch']}, greedy vs HF generate | gpt2 | "
            f"{r['aiayn packed tok/s']:,.0f} | {r['hf tok/s']:,.0f} | "
            f"{r['aiayn packed vs hf']:.2f}× | |"
        )
    for name, report in gpt2.items():
        if name.startswith("train "):
            r = report["row"]
            lines.append(
                f"| GPT-2 training tok/s vs GPT2LMHeadModel loop | {report['preset']} | "
                f"{r['aiayn']['tok_s']:,.0f} | {r['hf']['tok_s']:,.0f} | {r['ratio']:.2f}× | "
                f"{100 * r['aiayn']['peak_fraction']:.1f}% |"
            )
    return lines


def translation_rows(translation: dict[str, Any]) -> list[str]:
    """Summary rows of the translation reports (with how many outputs were identical)."""
    lines = []
    for model, report in translation.items():
        if model == CT2_REPORT:
            lines += ct2_rows(report)
            continue
        for r in report["rows"]:
            search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            lines.append(
                f"| translation tok/s, batch {r['batch']}, {search} vs HF generate "
                f"({r['identical']}/{r['sentences']} outputs identical) | {model} | "
                f"{r['aiayn_tok_s']:,.0f} | {r['hf_tok_s']:,.0f} | {r['ratio']:.2f}× | |"
            )
    return lines


def ct2_rows(report: dict[str, Any]) -> list[str]:
    """Summary rows of translate_vs_ct2.py: aiayn fp32 vs CTranslate2's fastest float32 run, and
    aiayn int8 vs its fastest int8 type, per configuration (the peer named in the row)."""
    lines = []
    for r in report["rows"]:
        search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        rates = r["tok_s"]
        peers = {}
        for ours, prefix in (
            ("aiayn fp32", "CTranslate2 float32"),
            ("aiayn int8", "CTranslate2 int8"),
        ):
            found = [k for k in rates if k.startswith(prefix)]  # each backend CTranslate2 ran
            if found:
                peers[ours] = max(found, key=lambda k: rates[k])
        for ours, peer in peers.items():
            if ours in rates and peer in rates:
                lines.append(
                    f"| translation tok/s, batch {r['batch']}, {search}, {ours} vs {peer} | "
                    f"opus-mt-en-de | {rates[ours]:,.0f} | {rates[peer]:,.0f} | "
                    f"{rates[ours] / rates[peer]:.2f}× | |"
                )
    return lines


if __name__ == "__main__":
    main()
