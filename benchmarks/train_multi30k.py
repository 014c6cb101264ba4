"""Benchmark: aiayn against a plain ``torch.nn.Transformer`` on Multi30k: same data, same
direction, same wall-clock training budget, the same recipe, several seeds.

    python benchmarks/train_multi30k.py --data-dir ../shared/data/multi30k --direction en-de
    python benchmarks/train_multi30k.py --data-dir ../shared/data/multi30k --direction both
    python benchmarks/train_multi30k.py --data-dir ../shared/data/multi30k --smoke

(``--minutes 60`` of training per run is the default, ``--seeds 2`` runs per system.)

Three systems, each run in a fresh process, one after the other, seed by seed:

- ``aiayn``: ``aiayn train`` with configs/multi30k_small.yaml (the ``small`` preset) and the
  ``--set`` overrides, the data paths set for the direction; scored at its last checkpoint and
  at its averaged one.
- ``peer-same`` (the primary comparison): benchmarks/_peer_nmt.py, written here and not imported
  from aiayn: ``nn.Transformer`` of the same layer sizes given aiayn's recipe, read from the same
  config and overrides (:func:`_multi30k_protocol.same_recipe`): norm placement (pre-norm with
  the final LayerNorms aiayn's pre-norm stacks have), dropout, warm-up, lr scale, label
  smoothing, Adam, batch size in tokens, embeddings shared/tied as the preset has them, a joint
  BPE of the same size, averaging over the same window by the same rule, the same decoding.
  What is left differs only by implementation: steps per minute, and correctness.
- ``peer-paper``: the same peer with the paper's recipe for 100k-step runs (post-norm, warm-up
  4,000, dropout 0.1: the ``--peer-*`` flags), its last weights, beam α 0.6: the second row.

Each system's process trains on the same pairs (task 1's 29,000, filtered by the config's
data.max_words/max_ratio); the budget is training time (data preparation, BPE and scoring come on
top; aiayn's periodic validations fall inside its budget). Scores on test_2016_flickr: sacreBLEU
(detokenized, cased) and chrF, greedy and beam 4 (α 0.6, output ≤ source + 50 tokens) at the
last and the averaged weights, and beam 4 with α chosen on the validation set (``--alphas``,
``aiayn tune-alpha``'s rule, never the test set) at the final weights (averaged, else last).

Seeds: ``--seeds N`` runs every system N times per direction (seeds S, S+1, … from the config's
train.seed). The report gives each row's mean, min–max and standard deviation over the seeds,
and calls a difference of means significant only when it exceeds the larger min–max range;
sacreBLEU's paired bootstrap (1,000 resamples) between aiayn's and each peer's test outputs of
the same seed is the second measure.

Resumable: each run writes ``STORE/DIRECTION/SYSTEM/seed_N/result.json.gz`` (scores, outputs,
its protocol; gzipped JSON, a plain result.json of an older run is still read) and is skipped
when that file is there, so the runs can be spread over several sessions (``--max-runs`` bounds
a session's share); a result made under another protocol is refused. ``STORE`` is
``--results-store``, by default the run folder, whose checkpoints
(``RUN_DIR/DIRECTION/SYSTEM/seed_N/run``) are too big to keep under version control: a store
in the repository (results/multi30k_runs) carries the finished runs to a fresh checkout.
The report is assembled from the results there are and names the missing ones:
``RUN_DIR/DIRECTION/report.{md,json.gz}`` always, and once every run is there
docs/results/multi30k_<direction>.md with results/multi30k_<direction>.json.gz (both in
``--results-dir`` when given). ``--smoke`` checks the whole path quickly (0.3 minutes per run,
the first 20 test and validation sentences: an untrained peer decodes to the length limit
without a cache) in runs/bench_multi30k_smoke, its report under the run folder instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _multi30k_protocol as protocol
import _multi30k_report as report_mod
from _common import ROOT, command_line, machine, raw_path, read_json, write_json_gz, write_report

DIRECTIONS = ("en-de", "de-en")
SEARCHES = (("greedy", 1), ("beam 4, α 0.6", 4))
TUNED = "beam 4, α tuned on validation"
SMOKE_MINUTES, SMOKE_TEST_SENTENCES = 0.3, 20
BOOTSTRAP_SAMPLES = 1000

Translate = Callable[[list[str], int, float], list[str]]
"""(sources, beam size, α) -> detokenized translations."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (the parent's, which the workers repeat with --worker/--seed/--out)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="folder with the Multi30k .gz files")
    p.add_argument("--direction", choices=(*DIRECTIONS, "both"), default="en-de")
    p.add_argument("--minutes", type=float, default=60.0, help="training budget of each run")
    p.add_argument(
        "--steps",
        type=_steps_arg,
        help="a budget in steps instead: N, or SYSTEM=N,… (e.g. the steps each system makes in "
        "--minutes on the CPU, replayed on a GPU)",
    )
    p.add_argument("--seeds", type=int, default=2, help="runs of each system per direction")
    p.add_argument(
        "--systems",
        type=lambda text: tuple(text.split(",")),
        default=protocol.SYSTEMS,
        help=f"which of {','.join(protocol.SYSTEMS)} to run now (the report has all)",
    )
    p.add_argument(
        "--max-runs", type=int, help="run at most N missing runs per direction, then report"
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs at a time, each its own process (on a GPU; on a CPU they share its cores)",
    )
    p.add_argument("--report-only", action="store_true", help="no training: the report")
    p.add_argument("--smoke", action="store_true", help="0.3 min per run, 20 sentences")
    p.add_argument("--test-sentences", type=int, help="the first N test (and validation) sentences")
    p.add_argument("--config", default=str(ROOT / "configs" / "multi30k_small.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], help="aiayn's config")
    _add_folder_args(p)
    p.add_argument(
        "--alphas",
        type=lambda text: tuple(float(x) for x in text.split(",")),
        default=(0.6, 1.0, 1.5, 2.0),
        help="the α grid tuned on the validation set (default 0.6,1,1.5,2)",
    )
    add_alpha_growth_flags(p)
    p.add_argument(
        "--decode-tokens",
        type=int,
        help="both sides decode in batches of this many source tokens × beam (aiayn's"
        " max_tokens; default: aiayn's 4096, the peer 64 sentences)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda, for every system")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    _add_peer_args(p)
    p.add_argument("--worker", choices=protocol.SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return _checked(p, p.parse_args(argv))


def _add_folder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", help="the runs' checkpoints (default runs/bench_multi30k[_smoke])")
    p.add_argument(
        "--results-store",
        help="where each run's result.json.gz is kept (default: --run-dir); a folder under"
        " version control carries a protocol spread over sessions to a fresh checkout",
    )
    p.add_argument("--force", action="store_true", help="replace a run left without a result")
    p.add_argument(
        "--results-dir", help="where complete reports go (default: docs/results and results)"
    )


def _add_peer_args(p: argparse.ArgumentParser) -> None:
    """The paper-recipe peer's flags and the peers' process settings."""
    p.add_argument("--peer-warmup", type=int, default=4000, help="peer-paper: eq. (3) warm-up")
    p.add_argument("--peer-dropout", type=float, default=0.1, help="peer-paper: dropout")
    p.add_argument("--peer-norm-first", action="store_true", help="peer-paper: pre-norm")
    p.add_argument(
        "--peer-settings",
        choices=("same", "default"),
        default="same",
        help="same: the peers' processes get aiayn's allocator (CPU) / TF32 (GPU) setting",
    )


def _checked(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Bad values refused by name (exit 2); the smoke settings and the default run folder."""
    unknown = sorted(set(args.systems) - set(protocol.SYSTEMS))
    if unknown:
        p.error(f"--systems: unknown {', '.join(unknown)} (choose from {protocol.SYSTEMS})")
    if args.parallel < 1:
        p.error(f"--parallel must be >= 1, got {args.parallel}")
    if args.decode_tokens is not None and args.decode_tokens < 1:
        p.error(f"--decode-tokens must be >= 1, got {args.decode_tokens}")
    unbudgeted = [s for s in args.systems if args.steps and s not in args.steps]
    if unbudgeted:
        p.error(f"--steps: no budget for {', '.join(unbudgeted)} (give SYSTEM=N for each)")
    if args.smoke:
        args.minutes = SMOKE_MINUTES
        args.test_sentences = args.test_sentences or SMOKE_TEST_SENTENCES
    default_dir = "runs/bench_multi30k_smoke" if args.smoke else "runs/bench_multi30k"
    args.run_dir = args.run_dir or str(ROOT / default_dir)
    args.results_store = args.results_store or args.run_dir
    return args


def add_alpha_growth_flags(p: argparse.ArgumentParser) -> None:
    """``--alpha-grow-by`` and ``--alpha-grow-to`` (:func:`growth`), by DecodeOptions.alpha's
    rule (finite, >= 0): checked before any run."""
    from aiayn.decoding.translate import DecodeOptions
    from aiayn.validation import flag

    alpha = flag(DecodeOptions, "alpha")
    p.add_argument(
        "--alpha-grow-by",
        type=alpha,
        default=0.5,
        help="while the grid's largest α scores best on validation, try it plus this much "
        "(default 0.5; 0: the grid as given)",
    )
    p.add_argument(
        "--alpha-grow-to", type=alpha, default=4.0, help="the largest α grown to (default 4)"
    )


def _steps_arg(text: str) -> dict[str, int]:
    try:
        return protocol.parse_steps(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def protocol_of(args: argparse.Namespace) -> dict[str, Any]:
    """What a result must share with the others to be reported beside them."""
    config = Path(args.config)
    return {
        "minutes": None if args.steps else args.minutes,
        "steps": args.steps,
        "config": config.name,
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "overrides": list(args.overrides),
        "test_sentences": args.test_sentences,
        "alphas": list(args.alphas),
        "alpha_growth": [args.alpha_grow_by, args.alpha_grow_to],
        "device": args.device,
        "threads": args.threads,
        "peer_paper": [args.peer_warmup, args.peer_dropout, args.peer_norm_first],
        "peer_settings": args.peer_settings,
        "decode_tokens": args.decode_tokens,
    }


# -- shared by the workers: the data and the scores (sacreBLEU) ----------------------------------
def files(args: argparse.Namespace, direction: str, split: str) -> tuple[Path, Path]:
    """(source file, target file) of a split in the direction."""
    src, tgt = direction.split("-")
    d = Path(args.data_dir)
    return d / f"{split}.{src}.gz", d / f"{split}.{tgt}.gz"


def eval_set(args: argparse.Namespace, direction: str, split: str) -> tuple[list[str], list[str]]:
    """Sources and references of a split (the first ``--test-sentences``)."""
    from aiayn.data import normalize, read_parallel

    pairs = read_parallel(*files(args, direction, split))[: args.test_sentences]
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


def scored_rows(
    args: argparse.Namespace,
    direction: str,
    weights: dict[str, Translate],
    tune: bool,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Rows "LABEL, SEARCH" for each of ``weights`` ("last", "averaged": their translate) and
    search; with ``tune``, "final, TUNED" at the last of ``weights`` (averaged, else last).
    Returns (scores, test outputs) by row."""
    sources, refs = eval_set(args, direction, "test_2016_flickr")
    rows: dict[str, dict[str, Any]] = {}
    outputs: dict[str, list[str]] = {}
    for label, translate in weights.items():
        for search, beam in SEARCHES:
            name, start = f"{label}, {search}", time.perf_counter()
            outputs[name] = translate(sources, beam, 0.6)
            rows[name] = score(outputs[name], refs)
            _log_row(args, name, rows[name], start)
    if tune:
        label, translate = list(weights.items())[-1]
        name, start = f"final, {TUNED}", time.perf_counter()
        rows[name], outputs[name] = tuned_row(args, direction, translate, sources, refs)
        rows[name]["checkpoint"] = label
        _log_row(args, name, rows[name], start)
    return rows, outputs


def _log_row(args: argparse.Namespace, name: str, row: dict[str, Any], start: float) -> None:
    """One line per scored row, with the seconds its decoding took (tuning included)."""
    took = time.perf_counter() - start
    print(f"{args.worker}: {name}: BLEU {row['bleu']:.2f} ({took:.1f} s)", flush=True)


def tuned_row(
    args: argparse.Namespace,
    direction: str,
    translate: Translate,
    sources: list[str],
    refs: list[str],
) -> tuple[dict[str, Any], list[str]]:
    """Beam 4 with α chosen on the validation set (``aiayn tune-alpha``'s rule, never the test
    set; the grid grown past its largest α while that one scores best, :func:`growth`), then
    scored on the test set; the row records the α and the validation table."""
    from aiayn.evaluation.tuning import tune_alpha

    val_src, val_ref = eval_set(args, direction, "val")
    alpha, table = tune_alpha(
        lambda a: translate(val_src, 4, a), val_ref, args.alphas, **growth(args)
    )
    hyps = translate(sources, 4, alpha)
    row: dict[str, Any] = score(hyps, refs)
    row["alpha"] = alpha
    row["validation"] = {f"{a:g}": asdict(s) for a, s in table.items()}
    return row, hyps


def growth(args: argparse.Namespace) -> dict[str, float]:
    """``tune_alpha``'s growth of the grid: ``--alpha-grow-by`` up to ``--alpha-grow-to``. A
    peer whose best α is the grid's largest may do better still beyond it: it gets that α."""
    return {"grow_by": args.alpha_grow_by, "grow_to": args.alpha_grow_to}


# -- the aiayn worker ----------------------------------------------------------------------------
def aiayn_config(
    args: argparse.Namespace, direction: str, run_dir: Path, seed: int | None = None
) -> Any:
    """configs/multi30k_small.yaml with the direction's data, the budget and the overrides (no
    test set: this script scores it), then the run's seed."""
    from aiayn.training.config import load_run_config

    (train_src, train_tgt), (valid_src, valid_tgt) = (
        files(args, direction, split) for split in ("train", "val")
    )
    budget = [f"train.max_minutes={args.minutes}"]
    if args.steps and "aiayn" in args.steps:  # (the peers read only the data rules here)
        budget = ["train.max_minutes=null", f"train.max_steps={args.steps['aiayn']}"]
    overrides = [
        f"run_dir={run_dir}",
        *budget,
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
        *([f"train.seed={seed}"] if seed is not None else []),
    ]
    return load_run_config(args.config, overrides)


def run_aiayn(args: argparse.Namespace, direction: str, seed: int, run_dir: Path) -> dict[str, Any]:
    """Train with ``aiayn train``'s trainer, score the last and the averaged checkpoint."""
    from aiayn.training.trainer import resolve_device, train

    config = aiayn_config(args, direction, run_dir, seed)
    result = train(config, force=args.force)
    device = resolve_device(args.device)
    weights: dict[str, Translate] = {}
    parameters = 0
    for label, path in (
        ("last", result.final_checkpoint),
        ("averaged", result.averaged_checkpoint),
    ):
        if path is None:
            continue
        weights[label], parameters = aiayn_translate(args, path, device)
    rows, outputs = scored_rows(args, direction, weights, tune=True)
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    rates = [m["tgt_tokens_per_s"] for m in metrics if m["kind"] == "train"]
    return {
        "steps": result.steps,
        "training_minutes": result.minutes,
        "median_tgt_tokens_per_s": statistics.median(rates) if rates else None,
        "averaged_steps": next(
            (m["averaged_steps"] for m in metrics if m["kind"] == "valid_averaged"), None
        ),
        "scores": rows,
        "outputs": outputs,
        "recipe": {**config.to_dict(), "parameters": parameters, "config_file": args.config},
    }


def aiayn_translate(
    args: argparse.Namespace, path: Path, device: torch.device
) -> tuple[Translate, int]:
    """The checkpoint at ``path`` as a :data:`Translate` (``--decode-tokens`` batches), and its
    parameter count."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.data import Tokenizer
    from aiayn.decoding.translate import DecodeOptions, translate_texts

    ckpt = load_checkpoint(path, map_location=device)
    tokenizer = Tokenizer.load(ckpt.tokenizer_path)

    def translate(sources: list[str], beam: int, alpha: float) -> list[str]:
        batch = {"max_tokens": args.decode_tokens} if args.decode_tokens else {}
        options = DecodeOptions(beam_size=beam, alpha=alpha, **batch)
        return translate_texts(ckpt.model, tokenizer, sources, options)

    return translate, sum(p.numel() for p in ckpt.model.parameters())


# -- the peer worker -----------------------------------------------------------------------------
def peer_recipe(args: argparse.Namespace, system: str, run: Any) -> protocol.PeerRecipe:
    """The recipe of ``peer-same`` (aiayn's, from its config) or ``peer-paper``."""
    from aiayn.training.translation import TRANSLATION_LABEL_SMOOTHING

    if system == "peer-same":
        return protocol.same_recipe(run, TRANSLATION_LABEL_SMOOTHING)
    return protocol.paper_recipe(
        run, warmup=args.peer_warmup, dropout=args.peer_dropout, norm_first=args.peer_norm_first
    )


def run_peer(args: argparse.Namespace, direction: str, system: str, seed: int) -> dict[str, Any]:
    """Train the peer (benchmarks/_peer_nmt.py) with its recipe on the same pairs for the same
    budget; save its weights in its run folder (``_peer_nmt.load_weights`` reads them); score
    its last and (with averaging) its averaged weights."""
    import _peer_nmt as peer
    from aiayn.data import filter_pairs, read_parallel

    run = aiayn_config(args, direction, Path("unused"), seed)  # the same data rules and sizes
    recipe = peer_recipe(args, system, run)
    device = _peer_device(args)
    pairs, _ = filter_pairs(
        read_parallel(*files(args, direction, "train")),
        max_words=run.data.max_words,
        max_ratio=run.data.max_ratio,
    )
    torch.manual_seed(seed)
    started = time.perf_counter()
    texts = [s for s, _ in pairs] + [t for _, t in pairs]
    tokenizer = peer.train_bpe(texts, recipe.vocab_size, recipe.min_frequency)
    data = peer.Encoded.of(tokenizer, pairs, run.data.max_tokens_per_sentence)
    seconds = time.perf_counter() - started
    print(f"{system}: {len(data.src)} pairs, BPE of {tokenizer.get_vocab_size()} ({seconds:.1f}s)")
    layers = protocol.peer_config(run, recipe, tokenizer.get_vocab_size())
    model = peer.TorchReference(layers).to(device)
    amp = _peer_amp(run.train.precision, device)
    settings = peer_settings(args, system, recipe, seed)
    log = peer.train_for(model, data, settings, device=device, amp=amp)
    saved = {"last": model.state_dict(), **({"averaged": log.averaged} if log.averaged else {})}
    peer.save_weights(work_path(args, direction, system, seed), layers, tokenizer, saved)
    rows, outputs = scored_rows(
        args,
        direction,
        peer_weights(peer, model, tokenizer, log, device, args.decode_tokens),
        recipe.tune_alpha,
    )
    return {
        "steps": log.steps,
        "training_minutes": log.seconds / 60,
        "median_tgt_tokens_per_s": statistics.median(log.window_rates)
        if log.window_rates
        else None,
        "epochs_completed": log.epochs,
        "averaged_steps": log.averaged_steps or None,
        "scores": rows,
        "outputs": outputs,
        "recipe": {
            **asdict(recipe),
            "parameters": sum(p.numel() for p in model.parameters()),
            "bpe": "tokenizers.SentencePieceBPETokenizer, joint",
            "precision": str(amp) if amp else "fp32",
            "process_settings": args.peer_settings,
        },
    }


def peer_settings(
    args: argparse.Namespace, system: str, recipe: protocol.PeerRecipe, seed: int
) -> Any:
    """The peer's training settings: each of its recipe fields taken from ``recipe`` by name
    (one the recipe lacks is a ValueError naming it, never the paper's default in silence), the
    budget (``--minutes`` or the system's ``--steps``) and the seed from this run."""
    import _peer_nmt as peer

    own = {"minutes", "steps", "seed"}
    names = [f.name for f in fields(peer.TrainSettings) if f.name not in own]
    missing = [n for n in names if not hasattr(recipe, n)]
    if missing:
        raise ValueError(f"the peer's recipe has no {', '.join(missing)}")
    steps = args.steps[system] if args.steps else None
    taken = {n: getattr(recipe, n) for n in names}
    return peer.TrainSettings(minutes=args.minutes, steps=steps, seed=seed, **taken)


def peer_weights(
    peer: Any, model: Any, tokenizer: Any, log: Any, device: torch.device, tokens: int | None
) -> dict[str, Translate]:
    """ "last" (the model as trained) and, when averaged, "averaged" (a copy with the average)."""
    import copy

    weights = {"last": peer_translate(peer, model, tokenizer, device, tokens)}
    if log.averaged is not None:
        averaged = copy.deepcopy(model)
        averaged.load_state_dict(log.averaged)
        weights["averaged"] = peer_translate(peer, averaged, tokenizer, device, tokens)
    return weights


def peer_translate(
    peer: Any, model: Any, tokenizer: Any, device: torch.device, tokens: int | None
) -> Translate:
    """A peer model as a :data:`Translate` (batches of ``tokens`` source tokens × beam, else
    of 64 sentences)."""

    def translate(sources: list[str], beam: int, alpha: float) -> list[str]:
        return peer.translate(
            model, tokenizer, sources, beam_size=beam, alpha=alpha, device=device, max_tokens=tokens
        )

    return translate


def _peer_amp(precision: str, device: torch.device) -> torch.dtype | None:
    """aiayn's train.precision: auto = bf16 autocast on CUDA, fp32 on CPU."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


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


# -- the report: from the results there are ------------------------------------------------------
def write_reports(
    args: argparse.Namespace,
    direction: str,
    seeds: list[int],
    results: dict[str, dict[int, dict[str, Any]]],
    missing: list[tuple[str, int]],
) -> None:
    """RUN_DIR/DIRECTION/report.{md,json.gz}; once nothing is missing, also
    multi30k_DIRECTION.md and .json.gz: in docs/results and results (``--results-dir``, for
    --smoke RUN_DIR/results: both there)."""
    if not any(results.values()):
        print(f"{direction}: no results yet")
        return
    refs = eval_set(args, direction, "test_2016_flickr")[1]
    report = {
        "benchmark": "train_multi30k",
        "command": command_line(),
        "machine": machine(),
        "trained_on": _trained_on(results),
        "direction": direction,
        "protocol": protocol_of(args),
        "seeds": seeds,
        "missing": [{"system": s, "seed": n} for s, n in missing],
        "test_sentences": len(refs),
        "signature": signature(),
        "comparison": {p: report_mod.comparison(results, p) for p in ("peer-same", "peer-paper")},
        "bootstrap": report_mod.bootstraps(results, refs),
        "results": {
            system: {
                seed: {k: v for k, v in r.items() if k != "outputs"} for seed, r in runs.items()
            }
            for system, runs in results.items()
        },
    }
    lines = markdown(direction, report, results)
    interim = Path(args.run_dir) / direction
    outputs: list[tuple[str, Path | None]] = [("report", interim)]
    if not missing:
        smoke = Path(args.run_dir) / "results"
        folder = Path(args.results_dir) if args.results_dir else smoke if args.smoke else None
        outputs.append((f"multi30k_{direction}", folder))  # None: docs/results and results
    for name, folder in outputs:
        path = write_report(name, report, lines, tables=folder, raw=folder)
        print(f"wrote {path} and {raw_path(name, folder)}")
    print("\n".join(lines))


def markdown(direction: str, report: dict[str, Any], results: Any) -> list[str]:
    """The report's text."""
    src, tgt = (x.upper() for x in direction.split("-"))
    missing = ", ".join(f"{r['system']} seed {r['seed']}" for r in report["missing"]) or "none"
    return [
        f"# Multi30k {src}→{tgt}: aiayn vs a plain torch.nn.Transformer, same recipe and budget",
        "",
        f"`{report['command']}`",
        "",
        f"{_budget(report['protocol'])} of training per run, seeds "
        f"{', '.join(map(str, report['seeds']))} per system, each run in its own process, "
        f"seed by seed (aiayn, peer-same, peer-paper); test_2016_flickr "
        f"({report['test_sentences']} sentences); trained on {'; '.join(report['trained_on'])}. "
        f"sacreBLEU `{report['signature']}`. Runs missing: {missing}.",
        "",
        _alpha_text(report["protocol"], results),
        "",
        *report_mod.score_table(results),
        "",
        *report_mod.training_table(results),
        "",
        "aiayn minus the peer with the same recipe (the primary comparison), then minus the "
        "paper-recipe peer; a difference counts only when it exceeds the larger min–max range "
        "of the two sides over the seeds:",
        "",
        *report_mod.comparison_table(report["comparison"]["peer-same"]),
        *report_mod.comparison_table(report["comparison"]["peer-paper"])[2:],
        "",
        "sacreBLEU's paired bootstrap (1,000 resamples, the peer as baseline) per seed:",
        "",
        *report_mod.bootstrap_table(report["bootstrap"]),
        "",
        *report_mod.recipe_lines(results),
    ]


def _alpha_text(protocol_: dict[str, Any], results: Any) -> str:
    """How the tuned rows' α was chosen, and which results were re-tuned after training."""
    text = f"The tuned rows' α: {alpha_rule(protocol_['alphas'], *protocol_['alpha_growth'])}."
    retuned = [
        f"{system} seed {seed}"
        for system, runs in results.items()
        for seed, result in runs.items()
        if "retuned" in result
    ]
    if retuned:
        text += (
            f" Re-tuned after training from the saved weights (benchmarks/multi30k_retune.py): "
            f"{', '.join(retuned)}."
        )
    return text


def alpha_rule(alphas: list[float], grow_by: float, grow_to: float) -> str:
    """The tuned α's rule in words: the validation set's best of the grid, and its growth."""
    grid = ", ".join(f"{a:g}" for a in alphas)
    grown = f", grown by {grow_by:g} while its largest α scores best (up to {grow_to:g})"
    return f"the best on the validation set of {grid}{grown if grow_by else ''}"


def _trained_on(results: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """The machines the runs were made on (each result records its own), in words, once each."""
    seen: list[str] = []
    for runs in results.values():
        for result in runs.values():
            m = result["machine"]
            words = f"{m.get('gpu', m['cpu'])}, torch {m['torch']}"
            if words not in seen:
                seen.append(words)
    return seen


def _budget(protocol_: dict[str, Any]) -> str:
    """The runs' budget in words: minutes, or steps (each system's)."""
    steps = protocol_.get("steps")
    if not steps:
        return f"{protocol_['minutes']:g} minutes"
    if len(set(steps.values())) == 1:
        return f"{next(iter(steps.values())):,} steps"
    return "steps (" + ", ".join(f"{s} {n:,}" for s, n in steps.items()) + ")"


# -- the parent: the missing runs, one process each; the report ----------------------------------
def work_path(args: argparse.Namespace, direction: str, system: str, seed: int) -> Path:
    """``RUN_DIR/DIRECTION/SYSTEM/seed_N/run``: one run's training folder (checkpoints)."""
    return protocol.result_path(Path(args.run_dir), direction, system, seed).parent / "run"


def spawn(args: argparse.Namespace, system: str, direction: str, seed: int) -> None:
    """Run one system's worker for one seed in a fresh process; it writes its result file last
    (a run stopped before that leaves no result and is run again)."""
    out = protocol.result_path(Path(args.results_store), direction, system, seed)
    work = work_path(args, direction, system, seed)
    if work.exists():
        if not args.force:
            raise SystemExit(
                f"{work} holds a run that left no result (stopped?): pass --force to run it again"
            )
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cmd = [sys.executable, __file__, *sys.argv[1:], "--direction", direction]
    cmd += ["--worker", system, "--seed", str(seed), "--out", str(out)]
    subprocess.run(cmd, check=True)


def worker(args: argparse.Namespace) -> None:
    """One system, one seed, one direction: its result file, written at the very end."""
    out = Path(args.out)
    if args.worker == "aiayn":
        work = work_path(args, args.direction, args.worker, args.seed)
        result = run_aiayn(args, args.direction, args.seed, work)
    else:
        result = run_peer(args, args.direction, args.worker, args.seed)
    result |= {"system": args.worker, "seed": args.seed, "protocol": protocol_of(args)}
    result["machine"] = machine()
    write_result(out, result)


def write_result(out: Path, result: dict[str, Any]) -> None:
    """``result`` as ``out``, gzipped JSON, whole or not at all (a stopped write leaves the old
    file, or none)."""
    write_json_gz(out, result)


def load_results(
    args: argparse.Namespace, direction: str, seeds: list[int]
) -> dict[str, dict[int, dict[str, Any]]]:
    """The results there are, by system and seed (checked to share this protocol)."""
    found: dict[str, dict[int, dict[str, Any]]] = {system: {} for system in protocol.SYSTEMS}
    expected = protocol_of(args)
    for system in protocol.SYSTEMS:
        for seed in seeds:
            path = protocol.stored_result(Path(args.results_store), direction, system, seed)
            if path is not None:
                result = read_json(path)
                protocol.check_protocol(
                    path,
                    protocol.own_budget(result["protocol"], system),
                    protocol.own_budget(expected, system),
                )
                found[system][seed] = result
    return found


Run = tuple[str, str, int]  # (direction, system, seed)


def runs_to_make(args: argparse.Namespace, direction: str, seeds: list[int]) -> list[Run]:
    """(direction, system, seed) of the missing runs of the systems asked for, at most
    ``--max-runs``; a result of another protocol there stops everything before training."""
    load_results(args, direction, seeds)
    if args.report_only:
        return []
    todo = protocol.missing_runs(Path(args.results_store), direction, args.systems, seeds)
    return [(direction, system, seed) for system, seed in todo[: args.max_runs]]


def make_runs(args: argparse.Namespace, runs: list[Run]) -> None:
    """Each run in its own process, ``--parallel`` of them at a time (one by default: on a CPU
    runs at the same time would share its cores and change each other's step counts)."""

    def one(run: Run) -> None:
        direction, system, seed = run
        print(f"== {direction}: {system}, seed {seed}", flush=True)
        spawn(args, system, direction, seed)

    if args.parallel == 1:
        for run in runs:
            one(run)
        return
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(one, runs))


def main() -> None:
    """Parent: each direction, each missing run in its own process; worker: one run."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        worker(args)
        return
    seeds = seeds_of(args)
    directions = DIRECTIONS if args.direction == "both" else (args.direction,)
    make_runs(args, [run for d in directions for run in runs_to_make(args, d, seeds)])
    for direction in directions:
        report_direction(args, direction, seeds)


def seeds_of(args: argparse.Namespace) -> list[int]:
    """The protocol's seeds: ``--seeds`` of them from the config's train.seed."""
    return protocol.seeds_of(
        aiayn_config(args, DIRECTIONS[0], Path("unused")).train.seed, args.seeds
    )


def report_direction(args: argparse.Namespace, direction: str, seeds: list[int]) -> None:
    """The direction's reports, from the results in the store (naming the missing runs)."""
    results = load_results(args, direction, seeds)
    missing = protocol.missing_runs(Path(args.results_store), direction, protocol.SYSTEMS, seeds)
    write_reports(args, direction, seeds, results, missing)


if __name__ == "__main__":
    main()
