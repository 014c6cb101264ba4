"""``aiayn translate``: translate lines from a file or stdin with a trained checkpoint."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``translate`` sub-command."""
    p = subparsers.add_parser(
        "translate",
        help="translate sentences, one per line, with a trained checkpoint",
        description="Translate one sentence per line (file or stdin), writing one translation "
        "per line in the input order. aiayn's own models: beam search with the GNMT length "
        "penalty by default (§6.1: beam 4, alpha 0.6, output length <= input length + 50). "
        "Converted T5 and Marian (OPUS-MT) models: the decoding settings of their Hugging Face "
        "folder (beams, alpha, Hugging Face's length normalisation and stopping rule, banned "
        "and forced tokens), as transformers' generate applies them.",
    )
    add_decoding_arguments(p)
    p.add_argument("--input", "-i", help="input file (default: standard input)")
    p.add_argument("--output", "-o", help="output file (default: standard output)")
    p.add_argument("--force", action="store_true", help="replace an existing --output file")
    p.set_defaults(func=run)


def add_decoding_arguments(p: argparse.ArgumentParser, *, for_evaluate: bool = False) -> None:
    """Options shared by ``translate`` and ``evaluate --checkpoint`` (where the checkpoint is
    optional and there is no n-best output); each value is checked by the rule of the
    :class:`~aiayn.decoding.translate.DecodeOptions` field it sets."""
    from aiayn.cli.commands import add_device_option, add_max_tokens_option
    from aiayn.decoding.translate import DecodeOptions
    from aiayn.validation import choices_of, flag

    p.add_argument(
        "--checkpoint",
        required=not for_evaluate,
        help="checkpoint folder (or a run folder: its latest checkpoint)",
    )
    p.add_argument(
        "--beam",
        type=flag(DecodeOptions, "beam_size"),
        help="beam size; 1 = greedy (default: 4, or a converted model's num_beams)",
    )
    p.add_argument(
        "--alpha",
        type=_alpha_flag(flag(DecodeOptions, "alpha")),
        help="alpha of the length penalty (default: 0.6, or a converted model's "
        "length_penalty), or 'auto': the alpha 'aiayn tune-alpha' chose on the validation set "
        "for this checkpoint (with its beam and rules unless given)",
    )
    p.add_argument(
        "--length-penalty",
        choices=choices_of(DecodeOptions, "length_penalty"),
        help="the beam's rules: gnmt (the paper's, default for aiayn's models) or hf "
        "(transformers' generate: log P / length^alpha; default for converted models)",
    )
    p.add_argument(
        "--prefix",
        default="",
        help="text put before every input line, e.g. T5's 'translate English to German: '",
    )
    add_max_tokens_option(p)
    if not for_evaluate:
        p.add_argument(
            "--n-best",
            type=flag(DecodeOptions, "n_best"),
            help="write the n best hypotheses per line, tab-separated with scores",
        )
    add_device_option(p, quantize=True, pack=True)


def _alpha_flag(number: Callable[[str], float]) -> Callable[[str], float | str]:
    """``--alpha``'s type: ``auto``, or a number by the rule of ``DecodeOptions.alpha``."""

    def parse(text: str) -> float | str:
        return "auto" if text == "auto" else number(text)

    return parse


def load_for_decoding(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, tokenizer, options) from the shared options: an encoder–decoder checkpoint (the
    paper's model, or a converted T5 or Marian), its tokenizer, and the decoding options —
    those given, else the checkpoint's recorded generation settings, else the paper's."""
    from aiayn.checkpoint import load_translation_tokenizer
    from aiayn.cli.commands import load_model_checkpoint
    from aiayn.decoding.translate import options_for_checkpoint
    from aiayn.models.transformer import EncoderDecoder
    from aiayn.performance import keep_freed_memory
    from aiayn.validation import resolve_device

    device = resolve_device(args.device)
    if device.type == "cpu":
        keep_freed_memory()  # beam search reallocates its caches every step: keep them mapped
    ckpt = load_model_checkpoint(args, EncoderDecoder, "translate", device=device)
    beam, alpha, length_penalty = args.beam, args.alpha, args.length_penalty
    if alpha == "auto":  # tuned on the validation set (aiayn tune-alpha)
        from aiayn.evaluation.tuning import read_tuned_alpha

        tuned = read_tuned_alpha(ckpt.path)
        alpha = tuned.alpha
        beam = tuned.beam_size if beam is None else beam
        length_penalty = length_penalty or tuned.length_penalty
    options = options_for_checkpoint(
        ckpt.state.get("generation"),
        beam_size=beam,
        alpha=alpha,
        length_penalty=length_penalty,
        max_tokens=args.max_tokens,
        n_best=getattr(args, "n_best", None),
        pack=args.pack,
    )
    return ckpt.model, load_translation_tokenizer(ckpt.path), options


def read_input(path: str | None) -> list[str]:
    """Lines of a file or of stdin, split alike (an empty input gives no lines)."""
    from aiayn.data.corpus import decode_lines, read_lines

    if path is None:
        return decode_lines(sys.stdin.buffer.read(), "standard input", allow_empty=True)
    return read_lines(path, allow_empty=True)


def run(args: argparse.Namespace) -> int:
    """Translate and write the results in input order: to standard output as each is ready (a
    reader that stops early, ``| head -1``, ends the command quietly), or to ``--output``
    atomically once all are done."""
    from aiayn.cli.outputs import check_file, write_text
    from aiayn.data import normalize
    from aiayn.decoding.translate import translate_stream, with_prefix

    if args.output:
        check_file(args.output, force=args.force, flag="--output")
    model, tokenizer, options = load_for_decoding(args)
    lines = read_input(args.input)
    ids = tokenizer.encode_batch([with_prefix(args.prefix, normalize(line)) for line in lines])
    out_lines: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = translate_stream(model, ids, tokenizer, options, progress=args.input is not None)
        for hyps in stream:
            _print_warnings(caught)
            line = _output_line(tokenizer, hyps, options.n_best)
            if args.output:
                out_lines.append(line)
            else:  # now: a reader that closes the pipe ends the run (main: BrokenPipeError)
                sys.stdout.write(line)
                sys.stdout.flush()
        _print_warnings(caught)
    if args.output:
        write_text(args.output, "".join(out_lines))
    return 0


def _output_line(tokenizer: Any, hyps: list[Any], n_best: int) -> str:
    """One sentence's output line: its translation, or its n best with scores, tab-separated."""
    texts = tokenizer.decode_batch([h.tokens for h in hyps])
    if n_best == 1:
        return texts[0] + "\n"
    return "\t".join(f"{t}\t{h.score:.4f}" for t, h in zip(texts, hyps, strict=True)) + "\n"


def _print_warnings(caught: list[warnings.WarningMessage]) -> None:
    """Print the warnings recorded so far (and forget them)."""
    for w in caught:
        print(f"aiayn translate: warning: {w.message}", file=sys.stderr)
    caught.clear()
