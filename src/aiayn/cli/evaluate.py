"""``aiayn evaluate``: sacreBLEU BLEU (with its signature) and chrF of translations."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.translate import add_decoding_arguments, load_for_decoding


def register(subparsers: Any) -> None:
    """Add the ``evaluate`` sub-command."""
    p = subparsers.add_parser(
        "evaluate",
        help="BLEU and chrF of translations (a file, or a checkpoint's translations)",
        description="Score hypotheses against references with sacreBLEU (detokenized, cased; "
        "the signature makes the number reproducible) and chrF. Either give --hyp, or give "
        "--checkpoint and --src to translate first.",
    )
    p.add_argument("--ref", required=True, help="reference translations, one per line")
    p.add_argument("--hyp", help="hypotheses, one per line")
    p.add_argument("--src", help="source sentences to translate with --checkpoint")
    p.add_argument(
        "--paper-bleu",
        action="store_true",
        help="also print the paper-style tokenized BLEU with compound splitting "
        "(WMT EN-DE comparisons only; not comparable to sacreBLEU)",
    )
    add_decoding_arguments(p, for_evaluate=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Translate if asked, then score."""
    from aiayn.cli.translate import read_input
    from aiayn.decoding.translate import translate_texts
    from aiayn.errors import UserError
    from aiayn.evaluation import corpus_bleu, corpus_chrf, paper_bleu

    refs = read_input(args.ref)
    if args.hyp is not None:
        if args.checkpoint or args.src:
            raise UserError("give either --hyp, or --checkpoint with --src, not both")
        hyps = read_input(args.hyp)
    elif args.checkpoint and args.src:
        model, tokenizer, options = load_for_decoding(args)
        sources = read_input(args.src)
        hyps = translate_texts(model, tokenizer, sources, options, progress=sys.stderr.isatty())
        out = Path(args.src).with_suffix(Path(args.src).suffix + ".hyp")
        print(f"translations: {out}", file=sys.stderr)
        out.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    else:
        raise UserError("give --hyp FILE, or --checkpoint DIR with --src FILE")
    print(corpus_bleu(hyps, refs))
    print(corpus_chrf(hyps, refs))
    if args.paper_bleu:
        print(paper_bleu(hyps, refs))
    return 0
