"""``aiayn classify-text``: the most probable labels of texts with a BERT sequence classifier
(Devlin et al. 2019, §4.1), e.g. one fine-tuned by ``aiayn train`` (``data.task:
classification``) or converted from a Hugging Face ``BertForSequenceClassification``.

One line in, one line out: each input line is a text (a tab separates a pair's two texts, as in
the training files without their label), and each output line holds the ``--top-k`` labels with
their probabilities, most probable first: ``label<TAB>probability`` (repeated). Labels are the
config's ``id2label``, else the class indices.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiayn.cli.commands import (
    add_batch_size_option,
    add_command,
    add_device_option,
)
from aiayn.validation import PositiveInt, flag_type

DEFAULT_BATCH = 32


def register(subparsers: Any) -> None:
    """Add the ``classify-text`` sub-command."""
    p = add_command(
        subparsers,
        "classify-text",
        run,
        help="the most probable labels of texts with a BERT classifier checkpoint",
        description="Classify each line of FILE (default: standard input) and print one line "
        "per input line: the --top-k labels, most probable first, each as "
        "label<TAB>probability. A tab in an input line separates a pair's two texts.",
    )
    p.add_argument("file", nargs="?", metavar="FILE", help="texts, one per line (default: stdin)")
    p.add_argument("--checkpoint", required=True, help="a BERT checkpoint with a classifier")
    p.add_argument("--top-k", type=flag_type(PositiveInt), default=1, help="labels per line (1)")
    add_batch_size_option(p, DEFAULT_BATCH, "texts")
    add_device_option(p, quantize=True)


def run(args: argparse.Namespace) -> int:
    """Classify every line and print its top labels."""
    from aiayn.cli.fill_mask import load_bert
    from aiayn.cli.translate import read_input
    from aiayn.errors import UserError
    from aiayn.inference.classify_text import classify_texts

    model, tokenizer = load_bert(
        args.checkpoint,
        args.device,
        "classify-text",
        head="classification",
        quantize=args.quantize,
    )
    labels = model.config.num_labels
    if args.top_k > labels:
        raise UserError(f"--top-k must be in 1..{labels} (the model's labels), got {args.top_k}")
    lines = read_input(args.file)
    texts, pairs = _split_pairs(lines)
    top = classify_texts(
        model, tokenizer, texts, pairs, top_k=args.top_k, batch_size=args.batch_size
    )
    names = model.config.id2label or tuple(str(i) for i in range(labels))
    out = ["\t".join(f"{names[i]}\t{p:.4f}" for i, p in row) for row in top]
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


def _split_pairs(lines: list[str]) -> tuple[list[str], list[str] | None]:
    """(texts, second texts or None): lines ``a<TAB>b`` are pairs; all lines or none.

    Raises:
        UserError: naming a line with two tabs, or a single text among pairs (or the reverse).
    """
    from aiayn.errors import UserError

    split = [line.split("\t") for line in lines]
    for number, fields in enumerate(split, start=1):
        if len(fields) > 2:
            raise UserError(f"line {number}: more than one tab (a text, or two texts of a pair)")
        if len(fields) != len(split[0]):
            raise UserError(
                f"line {number}: {'a pair' if len(fields) == 2 else 'one text'} where line 1 "
                f"has {'a pair' if len(split[0]) == 2 else 'one text'}: give texts or pairs"
            )
    if not split or len(split[0]) == 1:
        return lines, None
    return [f[0] for f in split], [f[1] for f in split]
