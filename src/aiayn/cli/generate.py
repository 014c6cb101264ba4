"""``aiayn generate``: continue prompts with a GPT-2-family checkpoint (Radford et al. 2019)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiayn.cli.commands import add_device_option
from aiayn.errors import UserError

_TEMPERATURE_HELP = (
    "sampling: temperature (1.0); one so small that log-prob / T overflows float32 gives the "
    "top token (greedy search's)"
)
_TOP_P_HELP = (
    "sampling: keep the nucleus of probability p (always the top token; a p that is 0 in "
    "float32 keeps only it)"
)


def register(subparsers: Any) -> None:
    """Add the ``generate`` sub-command (each value checked by the rule of the
    :class:`~aiayn.decoding.generate.GenerateOptions` field it sets)."""
    from aiayn.decoding.generate import GenerateOptions as G
    from aiayn.validation import flag

    p = subparsers.add_parser(
        "generate",
        help="continue text prompts with a GPT-2-family checkpoint",
        description="Continue each prompt (the arguments, else one per line from --input or "
        "stdin; an empty prompt starts unconditional text) and print prompt + continuation, "
        "one per prompt, in input order. A continuation may itself contain newlines. Greedy "
        "search by default; --beam K or --sample (nucleus sampling: Holtzman et al. 2020).",
    )
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompts (default: read lines)")
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (or a run folder)")
    p.add_argument("--input", "-i", help="prompts file, one per line (default: standard input)")
    p.add_argument("--only-new", action="store_true", help="print only the continuations")
    p.add_argument(
        "--max-new-tokens",
        type=flag(G, "max_new_tokens"),
        default=50,
        help="tokens per prompt (50)",
    )
    p.add_argument(
        "--min-new-tokens",
        type=flag(G, "min_new_tokens"),
        default=0,
        help="no EOS before this many (0)",
    )
    method = p.add_mutually_exclusive_group()
    method.add_argument("--greedy", action="store_true", help="greedy search (the default)")
    method.add_argument(
        "--beam", type=flag(G, "beam_size"), metavar="K", help="beam search with K beams"
    )
    method.add_argument("--sample", action="store_true", help="sample from the model")
    p.add_argument(
        "--alpha", type=flag(G, "alpha"), help="beam search: GNMT length penalty alpha (0.6)"
    )
    p.add_argument("--temperature", type=flag(G, "temperature"), help=_TEMPERATURE_HELP)
    p.add_argument(
        "--top-k", type=flag(G, "top_k"), help="sampling: keep the k most probable tokens"
    )
    p.add_argument("--top-p", type=flag(G, "top_p"), help=_TOP_P_HELP)
    p.add_argument(
        "--seed", type=flag(G, "seed"), help="sampling: seed of every prompt's generator"
    )
    p.add_argument(
        "--batch-size", type=flag(G, "batch_size"), default=16, help="prompts decoded together (16)"
    )
    add_device_option(p, quantize=True, pack=True)
    p.set_defaults(func=run)


_SAMPLING = ("temperature", "top_k", "top_p", "seed")


def options_from(args: argparse.Namespace) -> Any:
    """The :class:`~aiayn.decoding.generate.GenerateOptions` the arguments ask for; an option
    of another method is a :class:`UserError` naming it."""
    from aiayn.decoding.generate import GenerateOptions

    method = "beam" if args.beam is not None else "sample" if args.sample else "greedy"
    given = [name for name in _SAMPLING if getattr(args, name) is not None]
    if given and method != "sample":
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} applies to --sample only")
    if args.alpha is not None and method != "beam":
        raise UserError("--alpha applies to --beam only")
    names = (*_SAMPLING, "alpha")
    extra = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return GenerateOptions(
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        method=method,
        beam_size=args.beam if args.beam is not None else 4,
        batch_size=args.batch_size,
        pack=args.pack,
        **extra,
    )


def run(args: argparse.Namespace) -> int:
    """Generate and print the results in input order."""
    from aiayn.cli.commands import load_model_checkpoint
    from aiayn.cli.translate import read_input
    from aiayn.data.text_tokenizer import load_lm_tokenizer
    from aiayn.decoding.generate import generate
    from aiayn.models.gpt2 import GPT2
    from aiayn.validation import resolve_device

    options = options_from(args)  # bad values fail before anything is loaded
    if args.prompts and args.input is not None:
        raise UserError("give prompts as arguments or with --input, not both")
    device = resolve_device(args.device)
    ckpt = load_model_checkpoint(args, GPT2, "generate", device=device)
    tokenizer = load_lm_tokenizer(ckpt.tokenizer_path)
    prompts = list(args.prompts) or read_input(args.input)
    texts = generate(ckpt.model, tokenizer, prompts, options) if prompts else []
    for prompt, text in zip(prompts, texts, strict=True):
        sys.stdout.write(text + "\n" if args.only_new else prompt + text + "\n")
    return 0
