"""``aiayn attention``: attention maps of a trained model for one sentence pair, or of a Vision
Transformer for one image.

    aiayn attention --checkpoint DIR --src "The cat sat on the mat." [--tgt "..."] --out DIR
    aiayn attention --checkpoint VIT_DIR --image cat.png --out DIR

For a translation checkpoint: one PNG per (kind, layer, head), e.g. ``encoder_self_L1_H2.png``,
an overview PNG per kind (``cross_all.png``) and ``attention.html``, a self-contained page to pick
the kind, layer and head. See :mod:`aiayn.visualization.attention_maps` and
:mod:`aiayn.visualization.html_report`.

For a ViT checkpoint: the class token's attention over the patches overlaid on the image, one PNG
per layer and head (``cls_L1_H2.png``), an overview per layer (``cls_L1_all.png``), the attention
rollout (``rollout.png``) and ``attention.html`` with the top predicted labels. See
:mod:`aiayn.visualization.image_attention`.

The checkpoint's family decides the input: ``--image`` for a ViT, ``--src`` for the others.

    aiayn attention --checkpoint T5_DIR --bias OUT.png [--bias-reach N]

draws instead the checkpoint's learned relative position bias (a family whose registry entry
names its ``position_bias``: T5), every head against key − query, its buckets marked
(:mod:`aiayn.visualization.position_bias`); an existing OUT.png is replaced only with ``--force``.

An ``--out`` folder that already holds files of these names (``attention.html``, the PNG names
above) is refused before any work unless ``--force``; other files in it are left alone. The files
are drawn into a temporary folder inside ``--out`` and moved into place when all are complete
(:mod:`aiayn.cli.outputs`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.validation import PositiveInt, flag_type

MAX_TOKENS = 160
"""The default ``--max-tokens``: the most tokens a side of a map (source with EOS, decoder input
with BOS). Labelled maps beyond it are unreadable, and their figures, which grow with the square
of the tokens, take minutes and gigabytes to draw."""


def register(subparsers: Any) -> None:
    """Add the ``attention`` sub-command."""
    p = add_command(
        subparsers,
        "attention",
        run,
        help="draw every layer's and head's attention for one sentence pair or one image "
        "(PNG + HTML)",
        description="Attention maps (§3.2.3: encoder self-attention, masked decoder "
        "self-attention, encoder–decoder attention) of a trained model for one sentence pair, "
        "as PNG heatmaps and one self-contained HTML page; for a ViT checkpoint and --image, "
        "the class token's attention over the image patches per layer and head and the "
        "attention rollout, overlaid on the image.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint folder, or a run folder (its latest checkpoint)",
    )
    given = p.add_mutually_exclusive_group()
    given.add_argument("--src", default=None, help="the source sentence (translation models)")
    given.add_argument("--image", default=None, help="an image file (ViT checkpoints)")
    p.add_argument(
        "--tgt",
        default=None,
        help="the target sentence, with --src (default: the model's own greedy translation)",
    )
    p.add_argument(
        "--max-tokens",
        type=flag_type(PositiveInt),
        default=MAX_TOKENS,
        help="refuse sentences of more tokens than this a side (with EOS or BOS): larger maps "
        f"are unreadable and slow to draw (default {MAX_TOKENS})",
    )
    p.add_argument(
        "--bias",
        default=None,
        metavar="OUT.png",
        help="instead of maps: draw the checkpoint's learned relative position bias (T5) per "
        "head against key − query, its buckets marked, into this PNG",
    )
    p.add_argument(
        "--bias-reach",
        type=flag_type(PositiveInt),
        default=None,
        metavar="N",
        help="with --bias: draw relative positions -N .. N (default: max_distance × 1.25)",
    )
    p.add_argument("--out", default="attention_maps", help="output folder (created)")
    p.add_argument("--no-png", action="store_true", help="write only the HTML page")
    p.add_argument("--force", action="store_true", help="replace attention maps already in --out")


def run(args: argparse.Namespace) -> int:
    """Check the arguments against the checkpoint's family and draw its attention."""
    from aiayn.checkpoint import read_checkpoint_config
    from aiayn.errors import UserError
    from aiayn.models.families import refuse_unless_serving

    if not Path(args.checkpoint).exists():
        raise UserError(f"checkpoint not found: {args.checkpoint}")
    if args.bias is not None or args.bias_reach is not None:
        return _run_bias(args)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")
    folder, family, _, _ = read_checkpoint_config(args.checkpoint)
    refuse_unless_serving(family, "attention", folder)
    if family.reads == "image":
        if args.src is not None or args.tgt is not None:
            flag = "--src" if args.src is not None else "--tgt"
            raise UserError(f"{flag} is for translation models; {folder} holds a ViT: give --image")
        if args.image is None:
            raise UserError(f"{folder} holds a ViT: give --image IMAGE")
        return _run_image(args, out)
    if args.image is not None:
        raise UserError(
            f"--image needs a ViT checkpoint; {folder} holds a {family.name} model: give --src"
        )
    if args.src is None:
        raise UserError(f"{folder} holds a {family.name} model: give --src SENTENCE")
    return _run_translation(args, out)


def _check_out(args: argparse.Namespace, out: Path, png_patterns: Sequence[str]) -> None:
    """Refuse an --out that cannot be written or that holds maps of these names (no --force)."""
    from aiayn.cli.outputs import check_folder

    patterns = () if args.no_png else png_patterns
    check_folder(out, force=args.force, flag="--out", names=["attention.html"], patterns=patterns)


def _run_translation(args: argparse.Namespace, out: Path) -> int:
    """Load the checkpoint, collect the maps, write the PNGs and the HTML page."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.cli.outputs import staged_files
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.errors import UserError
    from aiayn.visualization.attention_maps import (
        KINDS,
        collect_attention,
        write_attention_pngs,
    )
    from aiayn.visualization.html_report import write_attention_html

    if not args.src.strip():
        raise UserError("--src is empty: give a source sentence")
    if args.tgt is not None and not args.tgt.strip():
        raise UserError("--tgt is empty: give a target sentence, or leave --tgt out")
    _check_out(args, out, [f"{kind}_{rest}" for kind in KINDS for rest in ("L*_H*.png", "all.png")])

    checkpoint = load_checkpoint(args.checkpoint)
    tokenizer = Tokenizer.load(checkpoint.tokenizer_path)
    maps = collect_attention(
        checkpoint.model, tokenizer, args.src, args.tgt, max_tokens=args.max_tokens
    )
    print(f"source: {maps.source}")
    print(f"target ({'model translation' if maps.target_from_model else 'given'}): {maps.target}")
    print(f"tokens: {len(maps.source_labels)} source, {len(maps.target_labels)} decoder input")
    with staged_files(out) as stage:
        pngs = [] if args.no_png else write_attention_pngs(maps, stage)
        write_attention_html(maps, stage / "attention.html", title=f"Attention maps: {maps.source}")
    page = out / "attention.html"
    layers = f"{len(maps.encoder_self)}+{len(maps.decoder_self)} layers × {maps.num_heads} heads"
    if pngs:
        print(f"wrote {len(pngs)} PNG files ({layers}) to {out}/")
    print(f"wrote {page}")
    return 0


def _run_image(args: argparse.Namespace, out: Path) -> int:
    """Load the ViT and its preprocessing, draw the class token's attention and the rollout."""
    from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint
    from aiayn.cli.outputs import staged_files
    from aiayn.data.images import ImagePreprocessor
    from aiayn.errors import UserError
    from aiayn.models.vit import ViT
    from aiayn.visualization.image_attention import (
        collect_image_attention,
        draw_overlays,
        write_image_attention_html,
        write_image_attention_pngs,
    )

    _check_out(args, out, ("cls_L*_H*.png", "cls_L*_all.png", "rollout.png"))
    checkpoint = load_checkpoint(args.checkpoint, expect=ViT)
    preprocessor = checkpoint_tokenizer(checkpoint.path)
    if not isinstance(preprocessor, ImagePreprocessor):
        raise UserError(f"{checkpoint.path} has no image preprocessing (preprocessor_config.json)")
    attention = collect_image_attention(checkpoint.model, preprocessor, args.image)
    (height, width), (g_h, g_w) = attention.input_size, attention.grid
    p = attention.patch_size
    print(f"image: {args.image} ({attention.image.width}×{attention.image.height} pixels)")
    print(f"read as {width}×{height} pixels: a {g_h}×{g_w} grid of {p}×{p} patches")
    for label, probability in attention.predictions():
        print(f"{probability:.4f}\t{label}")
    overlays = draw_overlays(attention)
    title = f"Attention maps: {attention.name}"
    with staged_files(out) as stage:
        pngs = [] if args.no_png else write_image_attention_pngs(attention, stage, overlays)
        write_image_attention_html(attention, stage / "attention.html", overlays, title=title)
    page = out / "attention.html"
    if pngs:
        layers = f"{attention.num_layers} layers × {attention.num_heads} heads, rollout"
        print(f"wrote {len(pngs)} PNG files ({layers}) to {out}/")
    print(f"wrote {page}")
    return 0


def _run_bias(args: argparse.Namespace) -> int:
    """Draw the checkpoint's relative position biases (the family's ``position_bias``)."""
    from torch import nn

    from aiayn.checkpoint import load_checkpoint, read_checkpoint_config
    from aiayn.cli.outputs import atomic_file, check_file
    from aiayn.errors import UserError
    from aiayn.limits import MAX_POSITION_BIAS_REACH
    from aiayn.models.families import FAMILIES, resolve
    from aiayn.visualization.position_bias import (
        bias_by_distance,
        default_reach,
        draw_position_bias,
    )

    if args.bias is None:
        raise UserError("--bias-reach needs --bias OUT.png")
    for flag in ("src", "tgt", "image"):
        if getattr(args, flag) is not None:
            raise UserError(
                f"--bias draws the checkpoint's position bias: give it without --{flag}"
            )
    reach = args.bias_reach
    if reach is not None and reach > MAX_POSITION_BIAS_REACH:
        raise UserError(
            f"--bias-reach {reach} is more than {MAX_POSITION_BIAS_REACH} "
            "(aiayn.limits.MAX_POSITION_BIAS_REACH)"
        )
    folder, family, _, _ = read_checkpoint_config(args.checkpoint)
    if family.position_bias is None:
        having = " or ".join(f.title for f in FAMILIES.values() if f.position_bias is not None)
        raise UserError(
            f"{folder} holds a {family.name} model, which has no learned relative position bias "
            f"(--bias needs a checkpoint of {having})"
        )
    path = check_file(args.bias, force=args.force, flag="--bias")
    model = load_checkpoint(folder, expect=nn.Module).model
    biases = resolve(family.position_bias)(model)
    curves = [
        bias_by_distance(name, bias, reach or default_reach(bias.max_distance))
        for name, bias in biases.items()
    ]
    title = f"{family.title} relative position bias of {folder}, per head"
    figure = draw_position_bias(curves, title)
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=110)
    for curve in curves:
        low, high = int(curve.distances[0]), int(curve.distances[-1])
        heads, buckets = curve.values.shape[0], curve.num_buckets
        print(f"{curve.stack}: {heads} heads, relative positions {low}..{high}, {buckets} buckets")
    print(f"wrote {path}")
    return 0
