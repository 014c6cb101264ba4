"""``aiayn train``: train a translation model (§5) or a language model (GPT-2's architecture);
with no config, the built-in translation demo."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiayn.cli.commands import add_command


def register(subparsers: Any) -> None:
    """Add the ``train`` sub-command."""
    from aiayn.models.families import demo_runs

    p = add_command(
        subparsers,
        "train",
        run,
        help="train a translation Transformer or a GPT-2 language model (default: built-in demo)",
        description="Train a model with the training loop of §5 of the paper. With no --config, "
        "trains a small translation model on the built-in Tatoeba EN-DE demo corpus (a few "
        "minutes on a CPU), then translates a few sentences and reports BLEU on held-out pairs. "
        "A config whose model section says family: gpt2 trains a language model instead "
        "(configs/lm_demo.yaml: on the demo corpus's English side) and reports perplexity; "
        "family: bert trains BERT, by masked-LM pre-training or as a text classifier as "
        "data.task says (configs/bert_mlm.yaml, configs/bert_classify.yaml).",
    )
    p.add_argument("--config", help="YAML run config (see configs/); default: the built-in demo")
    demos = list(demo_runs())
    p.add_argument(
        "--demo",
        choices=demos,
        default=demos[0],
        help="the built-in run without --config: the EN-DE translation demo (default), a "
        "GPT-2-architecture language model on the demo corpus's English side (lm, as "
        "configs/lm_demo.yaml), which prints samples, or a ViT on scikit-learn's digits (vit)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.max_steps=1000 (repeatable)",
    )
    p.add_argument("--run-dir", help="where checkpoints, metrics and plots go (overrides run_dir)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in run_dir exactly where it stopped; a config that differs from "
        "the run's is refused, except in how long it trains, its bookkeeping (log/eval/save "
        "intervals, checkpoints kept), where it runs, and train.lr_scale, clip_norm and "
        "max_bad_steps (the list: docs/reliability.md)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="delete the run already in run_dir (its checkpoints, tokenizer, metrics, plots) "
        "and start over; without it, a run_dir holding a run is refused",
    )


def run(args: argparse.Namespace) -> int:
    """Train, then print the result and the task's report (demo translations, samples…)."""
    from aiayn.errors import UserError
    from aiayn.models.families import demo_runs
    from aiayn.training.config import load_run_config
    from aiayn.training.distributed import is_main_process
    from aiayn.training.task import make_task
    from aiayn.training.trainer import DIVERGED_EXIT_STATUS, TrainingDiverged, train

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    if args.config is not None and args.demo != next(iter(demo_runs())):
        raise UserError(f"give --config FILE or --demo {args.demo}, not both")
    config = load_run_config(args.config, overrides, demo=args.demo)
    try:
        result = train(config, resume=args.resume, force=args.force)
    except TrainingDiverged as error:  # every rank stopped at the same step; rank 0 says why
        if is_main_process():
            print(f"aiayn train: error: {error}", file=sys.stderr)
        return DIVERGED_EXIT_STATUS
    if not is_main_process():  # under torchrun only rank 0 reports
        return 0
    print(
        f"\ntrained {result.steps} steps ({result.epochs_completed} full epochs) in "
        f"{result.minutes:.1f} min; run folder: {result.run_dir}"
    )
    make_task(config).report(result)
    return 0
