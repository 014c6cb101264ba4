"""``aiayn attention``: attention maps of a checkpoint of any family for one input.

    aiayn attention --checkpoint DIR --src "The cat sat on the mat." [--tgt "..."] --out DIR
    aiayn attention --checkpoint GPT2_DIR --text "The cat" [--continue 8] --out DIR
    aiayn attention --checkpoint BERT_DIR --text "The cat [MASK] on the mat." --out DIR
    aiayn attention --checkpoint VIT_DIR --image cat.png --out DIR

The checkpoint's family decides the input and the maps, through the family registry
(``Family.attention``: :mod:`aiayn.visualization.capture`):

- encoder–decoders (the paper's model, converted T5 and Marian): ``--src`` and optionally
  ``--tgt`` (default: the model's own greedy translation); encoder self-attention, masked
  decoder self-attention and encoder–decoder attention (:mod:`aiayn.visualization.attention_maps`);
- GPT-2: ``--text``, the prompt, and optionally ``--continue N``, N tokens of its greedy
  continuation; causal self-attention (:mod:`aiayn.visualization.lm_attention`);
- BERT: ``--text`` with its [CLS] and [SEP]; bidirectional self-attention, and with [MASK] in
  the text the masked positions' attention (:mod:`aiayn.visualization.bert_attention`);
- ViT: ``--image``; the class token's attention over the patches and the attention rollout,
  overlaid on the image (:mod:`aiayn.visualization.image_attention`), and ``head_view.html``.

For text: one PNG per (kind, layer, head), e.g. ``encoder_self_L1_H2.png``, an overview PNG per
kind (``cross_all.png``) and ``attention.html``, a self-contained page with a heatmap of one
head and the head view of every head of a layer (:mod:`aiayn.visualization.html_report`,
:mod:`aiayn.visualization.head_view`).

    aiayn attention --checkpoint T5_DIR --bias OUT.png [--bias-reach N]

draws instead the checkpoint's learned relative position bias (a family whose registry entry
names its ``position_bias``: T5), every head against key − query, its buckets marked
(:mod:`aiayn.visualization.position_bias`); an existing OUT.png is replaced only with ``--force``.

An ``--out`` folder that already holds files of these names is refused before any work unless
``--force``; other files in it are left alone. The files are drawn into a temporary folder
inside ``--out`` and moved into place when all are complete (:mod:`aiayn.cli.outputs`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.limits import MAX_ATTENTION_TOKENS
from aiayn.validation import NonNegativeInt, PositiveInt, flag_type

MAX_TOKENS = MAX_ATTENTION_TOKENS
"""The default ``--max-tokens``: the most tokens a side of a map (source with EOS, decoder input
with BOS). Labelled maps beyond it are unreadable, and their figures, which grow with the square
of the tokens, take minutes and gigabytes to draw."""


def register(subparsers: Any) -> None:
    """Add the ``attention`` sub-command."""
    p = add_command(
        subparsers,
        "attention",
        run,
        help="draw every layer's and head's attention for one input of any family "
        "(PNG + HTML with a head view)",
        description="Attention maps of a checkpoint for one input, as PNG heatmaps and one "
        "self-contained HTML page with a heatmap per head and a head view (every head of a "
        "layer at once). The family decides the input: --src [--tgt] for encoder-decoders "
        "(the paper's model, T5, Marian: encoder self-attention, masked decoder "
        "self-attention, encoder-decoder attention, §3.2.3); --text [--continue N] for GPT-2 "
        "(causal self-attention of a prompt and its greedy continuation); --text for BERT "
        "(bidirectional, [CLS] and [SEP] shown; with [MASK], the masked positions' attention); "
        "--image for a ViT (the class token's attention over the patches per layer and head "
        "and the attention rollout, overlaid on the image).",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint folder, or a run folder (its latest checkpoint)",
    )
    given = p.add_mutually_exclusive_group()
    given.add_argument("--src", default=None, help="the source sentence (translation models)")
    given.add_argument(
        "--text", default=None, help="the text (GPT-2: the prompt; BERT: a text, [MASK] allowed)"
    )
    given.add_argument("--image", default=None, help="an image file (ViT checkpoints)")
    p.add_argument(
        "--tgt",
        default=None,
        help="the target sentence, with --src (default: the model's own greedy translation)",
    )
    p.add_argument(
        "--continue",
        dest="continuation",
        type=flag_type(NonNegativeInt),
        default=0,
        metavar="N",
        help="GPT-2: append N tokens of the model's greedy continuation to the prompt (0)",
    )
    p.add_argument(
        "--max-tokens",
        type=flag_type(PositiveInt),
        default=MAX_TOKENS,
        help="refuse sentences of more tokens than this a side (with EOS or BOS): larger maps "
        f"are unreadable and slow to draw (default {MAX_TOKENS})",
    )
    _add_bias_arguments(p)
    p.add_argument("--out", default="attention_maps", help="output folder (created)")
    p.add_argument("--no-png", action="store_true", help="write only the HTML page")
    p.add_argument("--force", action="store_true", help="replace attention maps already in --out")


def _add_bias_arguments(p: argparse.ArgumentParser) -> None:
    """``--bias OUT.png`` and ``--bias-reach N``: the relative position bias instead of maps."""
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


def run(args: argparse.Namespace) -> int:
    """Check the arguments against the checkpoint's family, capture its attention, write it."""
    from aiayn.checkpoint import read_checkpoint_config
    from aiayn.cli.outputs import check_folder, given_path, staged_files
    from aiayn.errors import UserError
    from aiayn.models.families import refuse_unless_serving
    from aiayn.visualization.capture import (
        check_request,
        given_flags,
        run_capture,
        write_capture,
    )
    from aiayn.visualization.token_attention import AttentionRequest

    if not Path(args.checkpoint).exists():
        raise UserError(f"checkpoint not found: {args.checkpoint}")
    if args.bias is not None or args.bias_reach is not None:
        return _run_bias(args)
    out = given_path(args.out, flag="--out", what="a folder")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")
    folder, family, _, _ = read_checkpoint_config(args.checkpoint)
    refuse_unless_serving(family, "attention", folder)
    request = AttentionRequest(
        args.src if args.src is not None else args.text,
        args.tgt,
        args.continuation,
        args.image,
        args.max_tokens,
    )
    capture = check_request(family, given_flags(request, source=args.src is not None), folder)
    _check_texts(args)
    patterns = () if args.no_png else capture.files
    check_folder(out, force=args.force, flag="--out", names=capture.pages, patterns=patterns)
    result = run_capture(capture, folder, request)
    for line in result.summary():
        print(line)
    with staged_files(out) as stage:
        written = write_capture(result, stage, png=not args.no_png)
    pngs = [p for p in written if p.suffix == ".png"]
    if pngs:
        print(f"wrote {len(pngs)} PNG files to {out}/")
    for page in written:
        if page.suffix == ".html":
            print(f"wrote {out / page.name}")
    return 0


def _check_texts(args: argparse.Namespace) -> None:
    """Refuse an empty --src, --text or --tgt before anything is loaded."""
    from aiayn.errors import UserError

    for flag in ("src", "text"):
        value = getattr(args, flag)
        if value is not None and not value.strip():
            raise UserError(
                f"--{flag} is empty: give a {'source sentence' if flag == 'src' else 'text'}"
            )
    if args.tgt is not None and not args.tgt.strip():
        raise UserError("--tgt is empty: give a target sentence, or leave --tgt out")


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
    for flag in ("src", "tgt", "text", "image"):
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
