"""``aiayn fill-mask``: the most probable tokens at each [MASK] of a text, with a BERT checkpoint
that has its masked-LM head (e.g. one converted from ``bert-base-uncased``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiayn.cli.commands import (
    add_command,
    add_device_option,
    add_texts_input_option,
)
from aiayn.validation import PositiveInt, flag_type


def register(subparsers: Any) -> None:
    """Add the ``fill-mask`` sub-command."""
    p = add_command(
        subparsers,
        "fill-mask",
        run,
        help="predict the tokens at [MASK] with a BERT checkpoint",
        description="For each text (the arguments, else one per line from --input or stdin; "
        "blank lines are skipped), print the --top-k most probable tokens at each mask token, "
        "one line each: probability, token and the text with it filled in; a blank line "
        "between texts.",
    )
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts with [MASK] (default: read)")
    p.add_argument("--checkpoint", required=True, help="a BERT checkpoint with its MLM head")
    add_texts_input_option(p)
    p.add_argument(
        "--top-k", type=flag_type(PositiveInt), default=5, help="predictions per mask (5)"
    )
    add_device_option(p, quantize=True)


def run(args: argparse.Namespace) -> int:
    """Print the predictions of every text."""
    from aiayn.errors import UserError
    from aiayn.inference.encoder_tasks import fill_mask

    model, tokenizer = load_bert(
        args.checkpoint, args.device, "fill-mask", head="mlm", quantize=args.quantize
    )
    blocks = []
    for where, text in _texts(args):
        lines = []
        try:
            filled = fill_mask(model, tokenizer, text, top_k=args.top_k)
        except UserError as error:
            raise UserError(f"{where}: {error}") from None
        for predictions in filled:
            for p in predictions:
                lines.append(f"{p.probability:.4f}\t{p.token}\t{p.sequence}")
        blocks.append("\n".join(lines))
    sys.stdout.write("".join(block + "\n\n" for block in blocks).rstrip("\n") + "\n")
    return 0


def _texts(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(where, text) of each text to fill: the arguments (``text N``), else the non-blank lines
    of --input or standard input (``FILE, line N``; a blank line is skipped, as in ``evaluate
    --text`` and the masked-LM training data, since it holds no mask to fill)."""
    from aiayn.cli.translate import read_input

    if args.texts:
        return [(f"text {number}", text) for number, text in enumerate(args.texts, start=1)]
    name = args.input if args.input is not None else "standard input"
    lines = enumerate(read_input(args.input), start=1)
    return [(f"{name}, line {number}", line) for number, line in lines if line.strip()]


def load_bert(
    checkpoint: str, device: str, command: str, *, head: str | None = None, quantize: str = "none"
) -> tuple[Any, Any]:
    """(model, tokenizer) of a BERT checkpoint for ``command``; ``head`` ("mlm"), when given,
    must be its own; ``quantize``: as ``--quantize``.

    Raises:
        UserError: another family, another head, or a checkpoint without BERT's vocabulary.
    """
    from aiayn.checkpoint import checkpoint_bert_tokenizer, load_checkpoint
    from aiayn.errors import UserError
    from aiayn.models.bert import BERT
    from aiayn.validation import resolve_device

    ckpt = load_checkpoint(
        checkpoint,
        map_location=resolve_device(device),
        expect=BERT,
        command=command,
        quantize=quantize,
    )
    if head is not None and ckpt.model.config.head != head:
        raise UserError(
            f"{ckpt.path} holds a BERT with head {ckpt.model.config.head!r}; this needs {head!r}"
        )
    tokenizer = checkpoint_bert_tokenizer(ckpt.path)
    return ckpt.model, tokenizer
