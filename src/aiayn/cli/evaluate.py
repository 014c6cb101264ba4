"""``aiayn evaluate``: sacreBLEU BLEU (with its signature) and chrF of translations, or the
perplexity of a language-model (GPT-2) checkpoint on a text.

Perplexity (``--text``): the text's non-blank lines, each followed by the model's EOS, make one
token stream of n tokens (the tokenizer is the checkpoint's). It is cut into non-overlapping
windows of L = ``--block-size`` (default: the model's context, ``max_len``) predicted tokens:
window k is tokens k·L … k·L + L, and the model reads its first L tokens to predict its last L,
with no context from earlier windows (the last window is shorter). Every token but the first is
predicted exactly once: NLL per token = Σ −log p / (n − 1), perplexity = exp(NLL per token).
The same rule as the language-model task's validation (:mod:`aiayn.data.lm`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.cli.translate import add_decoding_arguments, load_for_decoding
from aiayn.validation import PositiveInt, flag_type


def register(subparsers: Any) -> None:
    """Add the ``evaluate`` sub-command."""
    p = add_command(
        subparsers,
        "evaluate",
        run,
        help="BLEU and chrF of translations, or a language model's perplexity on a text",
        description="Score hypotheses against references with sacreBLEU (detokenized, cased; "
        "the signature makes the number reproducible) and chrF. Either give --hyp, or give "
        "--checkpoint and --src to translate first. With --checkpoint (a GPT-2) and --text: "
        "the perplexity of the text, in non-overlapping windows of the model's context.",
    )
    p.add_argument("--ref", help="reference translations, one per line (BLEU and chrF)")
    p.add_argument("--hyp", help="hypotheses, one per line")
    p.add_argument("--src", help="source sentences to translate with --checkpoint")
    p.add_argument(
        "--hyp-out",
        metavar="FILE",
        help="with --src: where the translations go (default: SRC.hyp, beside the source)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing --hyp-out file")
    p.add_argument(
        "--paper-bleu",
        action="store_true",
        help="also print the paper-style tokenized BLEU with compound splitting "
        "(WMT EN-DE comparisons only; not comparable to sacreBLEU)",
    )
    p.add_argument(
        "--text",
        help="a UTF-8 text, one document per line: the perplexity of the --checkpoint "
        "language model on it",
    )
    p.add_argument(
        "--block-size",
        type=flag_type(PositiveInt),
        help="with --text: predicted tokens per window (default: the model's max_len)",
    )
    add_decoding_arguments(p, for_evaluate=True)


def run(args: argparse.Namespace) -> int:
    """Translate if asked, then score; or the perplexity of a text."""
    from aiayn.cli.outputs import check_file, write_text
    from aiayn.cli.translate import read_input
    from aiayn.decoding.translate import translate_texts
    from aiayn.errors import UserError
    from aiayn.evaluation import corpus_bleu, corpus_chrf, paper_bleu

    if args.text is not None:
        return perplexity(args)
    if args.block_size is not None:
        raise UserError("--block-size goes with --text (perplexity), not with BLEU")
    if args.ref is None:
        raise UserError(
            "give --ref FILE with --hyp or --checkpoint/--src (BLEU), or --checkpoint DIR with "
            "--text FILE (perplexity)"
        )
    if args.hyp is not None:
        if args.checkpoint or args.src or args.hyp_out:
            raise UserError("give either --hyp, or --checkpoint with --src, not both")
        refs = _references(args.ref)
        hyps = read_input(args.hyp)
    elif args.checkpoint and args.src:
        out = Path(args.hyp_out or args.src + ".hyp")
        check_file(out, force=args.force, flag="--hyp-out")  # before translating
        refs = _references(args.ref)
        sources = read_input(args.src)
        if len(sources) != len(refs):
            raise UserError(
                f"{len(sources)} source lines in {args.src} but {len(refs)} references in "
                f"{args.ref}: they must align"
            )
        model, tokenizer, options = load_for_decoding(args)
        hyps = translate_texts(
            model, tokenizer, sources, options, prefix=args.prefix, progress=sys.stderr.isatty()
        )
        write_text(out, "".join(h + "\n" for h in hyps))
        print(f"translations: {out}", file=sys.stderr)
    else:
        raise UserError("give --hyp FILE, or --checkpoint DIR with --src FILE")
    print(corpus_bleu(hyps, refs))
    print(corpus_chrf(hyps, refs))
    if args.paper_bleu:
        print(paper_bleu(hyps, refs))
    return 0


def _references(path: str) -> list[str]:
    """The reference lines; an empty file is an error (BLEU of nothing is undefined)."""
    from aiayn.cli.translate import read_input
    from aiayn.errors import UserError

    refs = read_input(path)
    if not refs:
        raise UserError(f"{path} is empty: no references, nothing to score")
    return refs


def perplexity(args: argparse.Namespace) -> int:
    """Tokens, NLL per token and perplexity of the --checkpoint language model on --text."""
    from aiayn.cli.commands import load_model_checkpoint
    from aiayn.data.lm import TextBlocks, read_documents, token_stream
    from aiayn.data.text_tokenizer import load_lm_tokenizer
    from aiayn.errors import UserError
    from aiayn.evaluation.perplexity import block_metrics
    from aiayn.models import GPT2

    given = [f"--{n}" for n in ("ref", "hyp", "src", "hyp_out") if getattr(args, n) is not None]
    given = [flag.replace("_", "-") for flag in given]
    if args.paper_bleu:
        given.append("--paper-bleu")
    if given:
        raise UserError(f"--text measures perplexity: leave out {', '.join(given)} (for BLEU)")
    if not args.checkpoint:
        raise UserError("--text needs --checkpoint DIR, a language-model (GPT-2) checkpoint")
    ckpt = load_model_checkpoint(args, GPT2, "generate")
    config = ckpt.model.config
    block = config.max_len if args.block_size is None else args.block_size
    if not 1 <= block <= config.max_len:
        raise UserError(f"--block-size must be in 1..{config.max_len} (the model's max_len)")
    tokenizer = load_lm_tokenizer(ckpt.path)
    stream = token_stream(read_documents(args.text), tokenizer, config.eos_id)
    blocks = TextBlocks(stream, block, keep_tail=True)
    if blocks.num_targets == 0:
        raise UserError(f"{args.text}: fewer than 2 tokens, nothing to predict")
    metrics = block_metrics(ckpt.model, blocks, args.max_tokens)
    print(
        f"tokens: {blocks.num_targets} predicted ({stream.size} in the stream, "
        f"{len(blocks)} windows of up to {block})"
    )
    print(f"NLL per token: {metrics['nll']:.4f} nats")
    print(f"perplexity: {metrics['ppl']:.4f}")
    return 0
