"""``aiayn params``: parameter count of a preset, with a per-component breakdown."""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.config import PRESETS, preset
from aiayn.models import (
    Transformer,
    count_parameters,
    expected_parameter_count,
    parameter_breakdown,
)

# Table 3 of the paper, for comparison.
PAPER_COUNTS = {"base": 65_000_000, "big": 213_000_000}


def register(subparsers: Any) -> None:
    """Add the ``params`` sub-command."""
    p = subparsers.add_parser(
        "params",
        help="print a preset's parameter count with a per-component breakdown",
        description="Parameter count of a model preset (Table 3), component by component.",
    )
    p.add_argument("--preset", default="base", choices=sorted(PRESETS), help="model preset")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=37000,
        help="shared source/target vocabulary (the paper's WMT EN-DE BPE: 37000)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the model on the meta device (no memory) and print its counts."""
    import torch

    config = preset(args.preset, vocab_size=args.vocab_size)
    with torch.device("meta"):
        model = Transformer(config)
    total = count_parameters(model)
    print(
        f"preset {args.preset}: N={config.num_encoder_layers}+{config.num_decoder_layers} "
        f"d_model={config.d_model} d_ff={config.d_ff} h={config.num_heads} d_k={config.d_k} "
        f"vocab={config.vocab_size} shared={config.share_embeddings} tied={config.tie_output}"
    )
    for name, count in parameter_breakdown(model).items():
        print(f"  {name:<26} {count:>13,}  {100 * count / total:5.1f}%")
    print(f"  {'total':<26} {total:>13,}  ({total / 1e6:.1f}M)")
    assert total == expected_parameter_count(config), "closed-form count disagrees with the model"
    if args.preset in PAPER_COUNTS:
        paper = PAPER_COUNTS[args.preset]
        diff = 100 * (total - paper) / paper
        print(f"  {'paper (Table 3)':<26} {paper / 1e6:.0f}M; difference {diff:+.1f}%")
    return 0
