"""Benchmark: aiayn against a plain ``torch.nn.Transformer`` on Multi30k: same data, same
direction, same wall-clock training budget, one after the other, in one invocation.

    python benchmarks/train_multi30k.py --data-dir ../shared/data/multi30k --direction en-de
    python benchmarks/train_multi30k.py --data-dir ../shared/data/multi30k --direction both
    python benchmarks/train_multi30k.py --data-dir ../shared/data/multi30k --smoke

(``--minutes 60`` of training each is the default; ``both`` runs en-de, then de-en.)

The two systems (each in a fresh process, aiayn first, then the peer):

- aiayn: ``aiayn train`` with configs/multi30k_small.yaml (the ``small`` preset: d_model 256,
  4 heads, d_ff 1024, 3+3 layers; its recipe as written there), the data paths set for the
  direction; scored at its last checkpoint and at its averaged one.
- peer: benchmarks/_peer_nmt.py, written here and not imported from aiayn: ``nn.Transformer`` of
  the same layer sizes with the standard recipe of the paper: its own joint BPE of the same size
  (Hugging Face ``tokenizers``), token-budget batches, label smoothing 0.1, Adam (0.9, 0.98,
  1e-9), eq. (3) with warm-up 4,000, dropout 0.1, post-norm, its last weights.

Both read the same training pairs (task 1's 29,000, whitespace-normalised and filtered by the
config's data.max_words/max_ratio); the budget (``--minutes``, each) is training time: data
preparation, BPE learning and the final scoring come on top; aiayn's periodic validations
(train.eval_every) fall inside its budget. Both are scored on test_2016_flickr with sacreBLEU
(detokenized, cased) and chrF, greedy and beam 4 (α 0.6, output ≤ source + 50 tokens), with the
brevity penalty and the hypothesis/reference length ratio; plus the steps and median target
tokens/s (over log windows of 100 steps) each got, and aiayn's BLEU minus and over the peer's.
aiayn's final checkpoint (averaged, else last) is also decoded with beam 4 at the α that scored
best on the validation set (``--alphas``; ``aiayn tune-alpha``'s rule: tuned on validation,
never on the test set), compared with the peer's beam 4.

Writes docs/results/multi30k_<direction>.{json,md} for each direction. ``--smoke`` checks the
whole path quickly (0.3 minutes each, the first 100 test sentences) and writes its report under
the run folder instead of docs/results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common
from _common import ROOT, command_line, machine, write_report

DIRECTIONS = ("en-de", "de-en")
SEARCHES = (("greedy", 1), ("beam 4, α 0.6", 4))
TUNED = "beam 4, α tuned on validation"
SMOKE_MINUTES, SMOKE_TEST_SENTENCES = 0.3, 100


def parse_args() -> argparse.Namespace:
    """The command line (the parent's, which the workers repeat with --worker/--out added)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="folder with the Multi30k .gz files")
    p.add_argument("--direction", choices=(*DIRECTIONS, "both"), default="en-de")
    p.add_argument("--minutes", type=float, default=60.0, help="training budget of each system")
    p.add_argument("--smoke", action="store_true", help="0.3 min each, 100 test sentences")
    p.add_argument("--test-sentences", type=int, help="score the first N test sentences only")
    p.add_argument("--config", default=str(ROOT / "configs" / "multi30k_small.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], help="aiayn's config")
    p.add_argument("--run-dir", help="keep the runs here (default: a temporary folder)")
    p.add_argument("--force", action="store_true", help="replace aiayn runs already in --run-dir")
    p.add_argument("--results-dir", help="where the reports go (default: docs/results)")
    p.add_argument(
        "--alphas",
        type=lambda text: tuple(float(x) for x in text.split(",")),
        default=(0.6, 1.0, 1.5, 2.0),
        help="aiayn's α grid, tuned on the validation set (default 0.6,1,1.5,2)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda, for both systems")
    p.add_argument("--threads", type=int, help="torch CPU threads for both (default: torch's)")
    p.add_argument("--peer-warmup", type=int, default=4000, help="warm-up steps of eq. (3)")
    p.add_argument("--peer-dropout", type=float, default=0.1)
    p.add_argument("--peer-norm-first", action="store_true", help="pre-norm (default: post)")
    p.add_argument(
        "--peer-settings",
        choices=("same", "default"),
        default="same",
        help="same: the peer's process gets aiayn's allocator (CPU) / TF32 (GPU) setting",
    )
    p.add_argument("--worker", choices=("aiayn", "peer"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke:
        args.minutes = SMOKE_MINUTES
        args.test_sentences = args.test_sentences or SMOKE_TEST_SENTENCES
    return args


# -- shared by both workers: the data and the scores (sacreBLEU) ---------------------------------
def files(args: argparse.Namespace, direction: str, split: str) -> tuple[Path, Path]:
    """(source file, target file) of a split in the direction."""
    src, tgt = direction.split("-")
    d = Path(args.data_dir)
    return d / f"{split}.{src}.gz", d / f"{split}.{tgt}.gz"


def test_set(args: argparse.Namespace, direction: str) -> tuple[list[str], list[str]]:
    """Sources and references of test_2016_flickr (the first ``--test-sentences``)."""
    from aiayn.data import normalize, read_parallel

    pairs = read_parallel(*files(args, direction, "test_2016_flickr"))[: args.test_sentences]
    return [normalize(s) for s, _ in pairs], [normalize(t) for _, t in pairs]


def score(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """sacreBLEU BLEU (detokenized, cased) with its brevity penalty and length ratio; chrF."""
    bleu = sacrebleu.BLEU().corpus_score(hyps, [refs])
    return {
        "bleu": bleu.score,
        "chrf": sacrebleu.CHRF().corpus_score(hyps, [refs]).score,
        "brevity_penalty": bleu.bp,
        "length_ratio": bleu.sys_len / bleu.ref_len,
        "hyp_length": bleu.sys_len,
        "ref_length": bleu.ref_len,
    }


def signature() -> str:
    """sacreBLEU's BLEU signature (known once a metric has scored something)."""
    bleu = sacrebleu.BLEU()
    bleu.corpus_score(["a"], [["a"]])
    return str(bleu.get_signature())


# -- the aiayn worker ----------------------------------------------------------------------------
def aiayn_config(args: argparse.Namespace, direction: str, run_dir: Path) -> Any:
    """configs/multi30k_small.yaml with the direction's data and the budget (no test set: this
    script scores it)."""
    from aiayn.training.config import load_run_config

    (train_src, train_tgt), (valid_src, valid_tgt) = (
        files(args, direction, split) for split in ("train", "val")
    )
    overrides = [
        f"run_dir={run_dir}",
        f"train.max_minutes={args.minutes}",
        f"train.device={args.device}",
        "train.progress=false",
        f"data.train_src={train_src}",
        f"data.train_tgt={train_tgt}",
        f"data.valid_src={valid_src}",
        f"data.valid_tgt={valid_tgt}",
        "data.test_src=null",
        "data.test_tgt=null",
        *([f"train.threads={args.threads}"] if args.threads else []),
        *(["data.bleu_sentences=50"] if args.smoke else []),
        *args.overrides,
    ]
    return load_run_config(args.config, overrides)


def run_aiayn(args: argparse.Namespace, direction: str, run_dir: Path) -> dict[str, Any]:
    """Train with ``aiayn train``'s trainer, score the last and the averaged checkpoint."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.data import Tokenizer
    from aiayn.decoding.translate import DecodeOptions, translate_texts
    from aiayn.training.trainer import resolve_device, train

    config = aiayn_config(args, direction, run_dir)
    result = train(config, force=args.force)
    sources, refs = test_set(args, direction)
    device = resolve_device(args.device)
    rows: dict[str, dict[str, float]] = {}
    parameters = 0
    for label, path in (
        ("last", result.final_checkpoint),
        ("averaged", result.averaged_checkpoint),
    ):
        if path is None:
            continue
        ckpt = load_checkpoint(path, map_location=device)
        tokenizer = Tokenizer.load(ckpt.tokenizer_path)
        parameters = sum(p.numel() for p in ckpt.model.parameters())
        for search, beam in SEARCHES:
            options = DecodeOptions(beam_size=beam, alpha=0.6)
            rows[f"{label}, {search}"] = score(
                translate_texts(ckpt.model, tokenizer, sources, options), refs
            )
    if path is not None:  # the averaged checkpoint, else the last: α tuned on validation
        rows.update(tuned_rows(args, direction, ckpt.model, tokenizer, label, sources, refs))
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    rates = [m["tgt_tokens_per_s"] for m in metrics if m["kind"] == "train"]
    return {
        "steps": result.steps,
        "training_minutes": result.minutes,
        "median_tgt_tokens_per_s": statistics.median(rates) if rates else None,
        "averaged_checkpoint": str(result.averaged_checkpoint or "") or None,
        "scores": rows,
        "recipe": {**config.to_dict(), "parameters": parameters, "config_file": args.config},
    }


def tuned_rows(
    args: argparse.Namespace,
    direction: str,
    model: Any,
    tokenizer: Any,
    label: str,
    sources: list[str],
    refs: list[str],
) -> dict[str, dict[str, Any]]:
    """Beam 4 with α chosen on the validation set (``aiayn tune-alpha``'s rule, never the test
    set), then scored on the test set; the row records the α and the validation table."""
    from aiayn.data import normalize, read_parallel
    from aiayn.decoding.translate import DecodeOptions, translate_texts
    from aiayn.evaluation.tuning import tune_alpha

    pairs = read_parallel(*files(args, direction, "val"))[: args.test_sentences]
    val_src, val_ref = [normalize(s) for s, _ in pairs], [normalize(t) for _, t in pairs]
    options = DecodeOptions(beam_size=4)

    def decode(alpha: float) -> list[str]:
        return translate_texts(model, tokenizer, val_src, replace(options, alpha=alpha))

    alpha, table = tune_alpha(decode, val_ref, args.alphas)
    row = score(translate_texts(model, tokenizer, sources, replace(options, alpha=alpha)), refs)
    row["alpha"] = alpha
    row["validation"] = {f"{a:g}": asdict(s) for a, s in table.items()}
    return {f"{label}, {TUNED}": row}


# -- the peer worker -----------------------------------------------------------------------------
def run_peer(args: argparse.Namespace, direction: str) -> dict[str, Any]:
    """Train the peer (benchmarks/_peer_nmt.py) on the same pairs for the same budget; score it."""
    import _peer_nmt as peer
    from aiayn.data import filter_pairs, read_parallel

    run = aiayn_config(args, direction, Path("unused"))  # the same data rules and layer sizes
    device = _peer_device(args)
    pairs, _ = filter_pairs(
        read_parallel(*files(args, direction, "train")),
        max_words=run.data.max_words,
        max_ratio=run.data.max_ratio,
    )
    torch.manual_seed(run.train.seed)
    started = time.perf_counter()
    tokenizer = peer.train_bpe([s for s, _ in pairs] + [t for _, t in pairs], run.data.vocab_size)
    data = peer.Encoded.of(tokenizer, pairs, run.data.max_tokens_per_sentence)
    seconds = time.perf_counter() - started
    print(f"peer: {len(data.src)} pairs, BPE of {tokenizer.get_vocab_size()} ({seconds:.1f}s)")
    m = run.model
    config = peer.PeerConfig(
        vocab_size=tokenizer.get_vocab_size(),
        d_model=m.d_model,
        num_heads=m.num_heads,
        num_encoder_layers=m.num_encoder_layers,
        num_decoder_layers=m.num_decoder_layers,
        d_ff=m.d_ff,
        dropout=args.peer_dropout,
        norm_first=args.peer_norm_first,
    )
    model = peer.TorchReference(config).to(device)
    amp = torch.bfloat16 if device.type == "cuda" else None
    log = peer.train_for(
        model,
        data,
        minutes=args.minutes,
        max_tokens=run.train.max_tokens,
        warmup=args.peer_warmup,
        seed=run.train.seed,
        device=device,
        amp=amp,
    )
    sources, refs = test_set(args, direction)
    rows = {
        f"last, {search}": score(
            peer.translate(model, tokenizer, sources, beam_size=beam, device=device), refs
        )
        for search, beam in SEARCHES
    }
    return {
        "steps": log.steps,
        "training_minutes": log.seconds / 60,
        "median_tgt_tokens_per_s": statistics.median(log.window_rates)
        if log.window_rates
        else None,
        "mean_tgt_tokens_per_s": log.tgt_tokens / log.seconds if log.seconds else None,
        "epochs_completed": log.epochs,
        "scores": rows,
        "recipe": {
            "model": vars(config),
            "parameters": sum(p.numel() for p in model.parameters()),
            "bpe": f"tokenizers.SentencePieceBPETokenizer, joint, {config.vocab_size} tokens",
            "max_tokens": run.train.max_tokens,
            "warmup_steps": args.peer_warmup,
            "label_smoothing": 0.1,
            "adam": [0.9, 0.98, 1e-9],
            "precision": "bf16 autocast" if amp else "fp32",
            "process_settings": args.peer_settings,
        },
    }


def _peer_device(args: argparse.Namespace) -> torch.device:
    """The device (as aiayn resolves it), with the process settings ``--peer-settings`` asks."""
    from aiayn.performance import configure_device, keep_freed_memory
    from aiayn.training.trainer import resolve_device

    device = resolve_device(args.device)
    if args.peer_settings == "same":
        if device.type == "cpu":
            keep_freed_memory()
        configure_device(device)
    return device


# -- the parent: run both, one after the other; the report ---------------------------------------
def spawn(system: str, direction: str, run_dir: Path) -> dict[str, Any]:
    """Run one system's worker in a fresh process; its result."""
    out = run_dir / f"{system}.json"
    cmd = [sys.executable, __file__, *sys.argv[1:], "--direction", direction]
    cmd += ["--worker", system, "--out", str(out), "--run-dir", str(run_dir / system)]
    subprocess.run(cmd, check=True)
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def compare(aiayn: dict[str, Any], peer: dict[str, Any]) -> list[dict[str, Any]]:
    """aiayn's BLEU minus and over the peer's, per search, for each aiayn checkpoint."""
    rows = []
    for search in (*(name for name, _ in SEARCHES), TUNED):
        peer_search = search if search != TUNED else SEARCHES[-1][0]
        theirs = peer["scores"][f"last, {peer_search}"]["bleu"]
        for label in ("last", "averaged"):
            ours = aiayn["scores"].get(f"{label}, {search}")
            if ours is None:
                continue
            ratio = ours["bleu"] / theirs if theirs > 0 else None
            difference = ours["bleu"] - theirs
            rows.append(
                {
                    "aiayn": f"{label}, {search}",
                    "peer": f"last, {peer_search}",
                    "bleu_difference": difference,
                    "bleu_ratio": ratio,
                }
            )
    return rows


def markdown(direction: str, report: dict[str, Any]) -> list[str]:
    """The report's tables."""
    src, tgt = (x.upper() for x in direction.split("-"))
    a, p = report["aiayn"], report["peer"]
    n, hardware = report["test_sentences"], report["machine"].get("gpu", report["machine"]["cpu"])
    lines = [
        f"# Multi30k {src}→{tgt}: aiayn vs a plain torch.nn.Transformer, same budget",
        "",
        f"`{report['command']}`",
        "",
        f"{report['minutes']:g} minutes of training each, one after the other (aiayn first); "
        f"test_2016_flickr ({n} sentences); {hardware}, torch {report['machine']['torch']}. "
        f"sacreBLEU `{report['signature']}`.",
        "",
        "| system | checkpoint, search | BLEU | chrF | BP | hyp/ref length |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in (("aiayn", a), ("peer", p)):
        for row, s in result["scores"].items():
            row = f"{row} (α {s['alpha']:g})" if "alpha" in s else row
            lines.append(
                f"| {name} | {row} | {s['bleu']:.2f} | {s['chrf']:.2f} | "
                f"{s['brevity_penalty']:.3f} | {s['length_ratio']:.3f} |"
            )
    lines += [
        "",
        "| system | steps | training minutes | median target tokens/s |",
        "|---|---|---|---|",
    ]
    for name, result in (("aiayn", a), ("peer", p)):
        rate = result["median_tgt_tokens_per_s"]
        lines.append(
            f"| {name} | {result['steps']:,} | {result['training_minutes']:.1f} | "
            + (f"{rate:,.0f} |" if rate is not None else "– |")
        )
    lines += ["", "| aiayn | peer | BLEU difference | BLEU ratio |", "|---|---|---|---|"]
    for c in report["comparison"]:
        ratio = "–" if c["bleu_ratio"] is None else f"{c['bleu_ratio']:.3f}"
        lines.append(f"| {c['aiayn']} | {c['peer']} | {c['bleu_difference']:+.2f} | {ratio} |")
    return [*lines, "", *recipes(a["recipe"], p["recipe"])]


def recipes(aiayn: dict[str, Any], peer: dict[str, Any]) -> list[str]:
    """What each system was trained with (all of it is in the JSON)."""
    t, m = aiayn["train"], aiayn["model"]
    return [
        f"aiayn ({Path(aiayn['config_file']).name}): {aiayn['parameters']:,} parameters, "
        f"model {m}, batches of {t['max_tokens']:,} tokens, warm-up {t['warmup_steps']:,}, "
        f"lr scale {t['lr_scale']}, averaging {t['average_last']}.",
        f"peer (benchmarks/_peer_nmt.py): {peer['parameters']:,} parameters, "
        f"{'pre' if peer['model']['norm_first'] else 'post'}-norm, dropout "
        f"{peer['model']['dropout']}, {peer['bpe']}, batches of {peer['max_tokens']:,} tokens, "
        f"warm-up {peer['warmup_steps']:,}, label smoothing {peer['label_smoothing']}, "
        f"Adam {tuple(peer['adam'])}, {peer['precision']}, its last weights.",
    ]


def run_direction(args: argparse.Namespace, direction: str, run_root: Path) -> None:
    """Both systems in one direction, then the report."""
    folder = run_root / direction
    folder.mkdir(parents=True, exist_ok=True)
    results = {system: spawn(system, direction, folder) for system in ("aiayn", "peer")}
    report = {
        "benchmark": "train_multi30k",
        "command": command_line(),
        "machine": machine(),
        "direction": direction,
        "minutes": args.minutes,
        "smoke": args.smoke,
        "test_sentences": len(test_set(args, direction)[0]),
        "signature": signature(),
        **results,
        "comparison": compare(results["aiayn"], results["peer"]),
    }
    path = write_report(f"multi30k_{direction}", report, markdown(direction, report))
    print("\n".join(markdown(direction, report)))
    print(f"wrote {path} and .json")


def main() -> None:
    """Parent: each direction, each system in its own process; worker: one system."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        if args.worker == "aiayn":
            result = run_aiayn(args, args.direction, Path(args.run_dir))
        else:
            result = run_peer(args, args.direction)
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")
        return
    if args.results_dir or args.smoke:
        default = Path(args.run_dir or ROOT / "runs" / "bench_multi30k_smoke") / "results"
        _common.RESULTS = Path(args.results_dir) if args.results_dir else default
    directions = DIRECTIONS if args.direction == "both" else (args.direction,)
    with tempfile.TemporaryDirectory(prefix="bench_multi30k_") as tmp:
        run_root = Path(args.run_dir) if args.run_dir else Path(tmp)
        for direction in directions:
            run_direction(args, direction, run_root)


if __name__ == "__main__":
    main()
