"""``aiayn attention``: attention maps of a trained model for one sentence pair.

    aiayn attention --checkpoint DIR --src "The cat sat on the mat." [--tgt "..."] --out DIR

Writes one PNG per (kind, layer, head), e.g. ``encoder_self_L1_H2.png``, an overview PNG per
kind (``cross_all.png``) and ``attention.html``, a self-contained page to pick the kind, layer
and head. See :mod:`aiayn.visualization.attention_maps` and :mod:`aiayn.visualization.html_report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``attention`` sub-command."""
    p = subparsers.add_parser(
        "attention",
        help="draw every layer's and head's attention for one sentence pair (PNG + HTML)",
        description="Attention maps (§3.2.3: encoder self-attention, masked decoder "
        "self-attention, encoder–decoder attention) of a trained model for one sentence pair, "
        "as PNG heatmaps and one self-contained HTML page.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint folder, or a run folder (its latest checkpoint)",
    )
    p.add_argument("--src", required=True, help="the source sentence")
    p.add_argument(
        "--tgt",
        default=None,
        help="the target sentence (default: the model's own greedy translation)",
    )
    p.add_argument("--out", default="attention_maps", help="output folder (created)")
    p.add_argument("--no-png", action="store_true", help="write only the HTML page")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint, collect the maps, write the PNGs and the HTML page."""
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.errors import UserError
    from aiayn.training.checkpoint import load_checkpoint
    from aiayn.visualization.attention_maps import collect_attention, write_attention_pngs
    from aiayn.visualization.html_report import write_attention_html

    if not args.src.strip():
        raise UserError("--src is empty: give a source sentence")
    if args.tgt is not None and not args.tgt.strip():
        raise UserError("--tgt is empty: give a target sentence, or leave --tgt out")
    if not Path(args.checkpoint).exists():
        raise UserError(f"checkpoint not found: {args.checkpoint}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")

    checkpoint = load_checkpoint(args.checkpoint)
    tokenizer = Tokenizer.load(checkpoint.tokenizer_path)
    maps = collect_attention(checkpoint.model, tokenizer, args.src, args.tgt)
    print(f"source: {maps.source}")
    print(f"target ({'model translation' if maps.target_from_model else 'given'}): {maps.target}")
    print(f"tokens: {len(maps.source_labels)} source, {len(maps.target_labels)} decoder input")
    pngs = [] if args.no_png else write_attention_pngs(maps, out)
    page = write_attention_html(
        maps, out / "attention.html", title=f"Attention maps: {maps.source}"
    )
    layers = f"{len(maps.encoder_self)}+{len(maps.decoder_self)} layers × {maps.num_heads} heads"
    if pngs:
        print(f"wrote {len(pngs)} PNG files ({layers}) to {out}/")
    print(f"wrote {page}")
    return 0
