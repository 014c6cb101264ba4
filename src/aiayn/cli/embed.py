"""``aiayn embed``: sentence embeddings with a BERT checkpoint (mean pooling over the real tokens,
then L2 normalisation, as sentence-transformers models do), or the cosine similarity of two
files' lines."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from aiayn.cli.commands import (
    add_batch_size_option,
    add_command,
    add_device_option,
    add_texts_input_option,
)


def register(subparsers: Any) -> None:
    """Add the ``embed`` sub-command."""
    p = add_command(
        subparsers,
        "embed",
        run,
        help="sentence embeddings (or cosine similarities) with a BERT checkpoint",
        description="One line in, one vector out, in input order: a JSON list per line on "
        "standard output, or an (N, D) float32 .npy file with --out. With --similarity A B: the "
        "cosine similarity of line i of A and line i of B, one number per line.",
    )
    p.add_argument("--checkpoint", required=True, help="a BERT checkpoint")
    add_texts_input_option(p)
    p.add_argument("--out", "-o", help="write an .npy file instead of JSON lines")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--similarity", nargs=2, metavar=("A", "B"), help="two files of lines")
    p.add_argument("--no-normalize", dest="normalize", action="store_false", help="keep norms")
    add_batch_size_option(p, 32, "texts")
    add_device_option(p, quantize=True)


def run(args: argparse.Namespace) -> int:
    """Embed the input lines, or compare two files line by line."""
    from aiayn.cli.fill_mask import load_bert
    from aiayn.cli.outputs import atomic_file, check_file
    from aiayn.cli.translate import read_input
    from aiayn.errors import UserError
    from aiayn.inference.encoder_tasks import cosine_similarities, sentence_embeddings

    if args.similarity and (args.input or args.out):
        raise UserError("--similarity reads its two files: leave out --input and --out")
    if args.out:
        check_file(args.out, force=args.force, flag="--out")
    model, tokenizer = load_bert(args.checkpoint, args.device, "embed", quantize=args.quantize)

    def embed(lines: list[str]) -> Any:
        return sentence_embeddings(
            model, tokenizer, lines, batch_size=args.batch_size, normalize=args.normalize
        )

    if args.similarity:
        a, b = (embed(read_input(path)) for path in args.similarity)
        sys.stdout.write("".join(f"{s:.6f}\n" for s in cosine_similarities(a, b).tolist()))
        return 0
    vectors = embed(read_input(args.input))
    if args.out:
        import io

        import numpy as np

        npy = io.BytesIO()  # np.save to a real file seeks, which a pipe or FIFO cannot
        np.save(npy, vectors.numpy())
        with atomic_file(args.out, "wb") as handle:  # exactly --out (np.save adds .npy to a name)
            handle.write(npy.getbuffer())
        print(f"wrote {tuple(vectors.shape)} embeddings to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write("".join(json.dumps(v) + "\n" for v in vectors.tolist()))
    return 0
