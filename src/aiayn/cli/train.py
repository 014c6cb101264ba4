"""``aiayn train``: train a translation model (§5); with no config, the built-in demo."""

from __future__ import annotations

import argparse
from typing import Any

DEMO_SENTENCES = (
    "I love you.",
    "Where is the train station?",
    "Tom doesn't like cheese.",
    "We have to go home now.",
    "The weather is nice today.",
    "Can you help me, please?",
)


def register(subparsers: Any) -> None:
    """Add the ``train`` sub-command."""
    p = subparsers.add_parser(
        "train",
        help="train an encoder-decoder Transformer for translation (default: built-in demo)",
        description="Train a translation model as in §5 of the paper. With no --config, trains "
        "a small model on the built-in Tatoeba EN-DE demo corpus (a few minutes on a CPU), "
        "then translates a few sentences and reports BLEU on held-out pairs.",
    )
    p.add_argument("--config", help="YAML run config (see configs/); default: the built-in demo")
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
        "--resume", action="store_true", help="continue the run in run_dir exactly where it stopped"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train, then print the result (and demo translations for the built-in demo)."""
    from aiayn.decoding.translate import translate_texts
    from aiayn.training.config import load_run_config
    from aiayn.training.distributed import is_main_process
    from aiayn.training.trainer import train

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    config = load_run_config(args.config, overrides)
    result = train(config, resume=args.resume)
    if not is_main_process():  # under torchrun only rank 0 reports
        return 0
    print(
        f"\ntrained {result.steps} steps ({result.epochs_completed} full epochs) in "
        f"{result.minutes:.1f} min; run folder: {result.run_dir}"
    )
    print(
        f"validation: BLEU {result.valid['bleu']:.2f}, perplexity {result.valid['ppl']:.2f} "
        f"({result.final_checkpoint.name})"
    )
    best = result.averaged_valid or result.valid
    if result.averaged_valid is not None and result.averaged_checkpoint is not None:
        print(
            f"averaged checkpoint: BLEU {result.averaged_valid['bleu']:.2f} "
            f"({result.averaged_checkpoint})"
        )
    if config.data.train_src is None:  # the built-in demo: show it works
        from aiayn.data import Tokenizer
        from aiayn.training.checkpoint import load_checkpoint

        ckpt = load_checkpoint(result.averaged_checkpoint or result.final_checkpoint)
        tokenizer = Tokenizer.load(ckpt.tokenizer_path)
        print("\ndemo translations (English -> German, greedy):")
        for src, hyp in zip(
            DEMO_SENTENCES, translate_texts(ckpt.model, tokenizer, DEMO_SENTENCES), strict=True
        ):
            print(f"  {src:<32} -> {hyp}")
        print(
            f"\nBLEU on {int(best['bleu_sentences'])} held-out pairs: {best['bleu']:.2f} "
            "(sacreBLEU, detokenized, cased)"
        )
    return 0
