"""``aiayn params``: parameter count of a preset, with a per-component breakdown."""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.config import TransformerConfig
from aiayn.models.families import DEFAULT_FAMILY, family_of_preset, preset_names
from aiayn.validation import flag


def register(subparsers: Any) -> None:
    """Add the ``params`` sub-command."""
    p = add_command(
        subparsers,
        "params",
        run,
        help="print a preset's parameter count with a per-component breakdown",
        description="Parameter count of a model preset (Table 3, or the published sizes of "
        "GPT-2, T5, BERT and ViT), component by component.",
    )
    p.add_argument(
        "--preset",
        default="base",
        choices=preset_names(),
        help="model preset",
    )
    p.add_argument(
        "--vocab-size",
        type=flag(TransformerConfig, "vocab_size"),
        help="vocabulary size (default: the preset's own: 37000, the paper's WMT EN-DE BPE, for "
        "base and big)",
    )


def run(args: argparse.Namespace) -> int:
    """Build the model on the meta device (no memory) and print its counts."""
    import torch

    from aiayn.models import count_parameters, parameter_breakdown

    family = family_of_preset(args.preset)
    config = family.presets[args.preset]
    if args.vocab_size is not None:
        config = config.with_vocab_size(args.vocab_size)
    with torch.device("meta"):
        model = family.build(config)
    total = count_parameters(model)
    title = "" if family.name == DEFAULT_FAMILY else f"{family.title}, "
    print(f"preset {args.preset}: {title}{config.summary()}")
    for name, count in parameter_breakdown(model).items():
        print(f"  {name:<26} {count:>13,}  {100 * count / total:5.1f}%")
    print(f"  {'total':<26} {total:>13,}  ({total / 1e6:.1f}M)")
    assert total == family.count(config), "closed-form count disagrees with the model"
    published = family.presets.published.get(args.preset)
    if published is not None and getattr(config, "vocab_size", 0) == published.vocab_size:
        diff = 100 * (total - published.count) / published.count
        print(f"  {published.source:<26} {published.count / 1e6:.0f}M; difference {diff:+.1f}%")
    return 0
