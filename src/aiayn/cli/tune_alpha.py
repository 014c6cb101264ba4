"""``aiayn tune-alpha``: choose beam search's length penalty α on the validation set.

Decodes the validation set at each α of a grid (grown past its largest α while that one scores
best, with ``--grow-by``), prints BLEU, brevity penalty and length ratio per α, and saves the
best (highest BLEU) as ``tuned_alpha.json`` in the checkpoint folder, where
``aiayn translate/evaluate --alpha auto`` reads it (:mod:`aiayn.evaluation.tuning`). The
validation set is the run's own (``data.valid_src``/``valid_tgt`` or ``data.valid`` of the
config the checkpoint was trained with) unless ``--src``/``--ref`` name one; the run's test set
is refused: α tuned on it would make its score optimistic.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command, add_device_option, add_max_tokens_option


def register(subparsers: Any) -> None:
    """Add the ``tune-alpha`` sub-command."""
    from aiayn.decoding.translate import DecodeOptions
    from aiayn.validation import choices_of, flag

    p = add_command(
        subparsers,
        "tune-alpha",
        run,
        help="choose the beam's length penalty alpha on the validation set",
        description="Beam-decode the validation set at each alpha of a grid, print BLEU, "
        "brevity penalty and hypothesis/reference length ratio per alpha, and save the alpha "
        "of the highest BLEU in the checkpoint folder (tuned_alpha.json) for "
        "'--alpha auto'. Validation set: the run's own, or --src/--ref; never its test set.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint folder")
    p.add_argument("--src", help="validation sources (default: the run's validation set)")
    p.add_argument("--ref", help="validation references, line-aligned with --src")
    p.add_argument(
        "--alphas",
        type=_alphas,
        help="comma-separated grid (default: 0,0.3,0.6,0.9,1.2,1.5,2)",
    )
    p.add_argument(
        "--grow-by",
        type=flag(DecodeOptions, "alpha"),
        default=0.0,
        help="while the grid's largest alpha scores best, try it plus this much (default 0: "
        "the grid as given)",
    )
    p.add_argument(
        "--grow-to",
        type=flag(DecodeOptions, "alpha"),
        default=4.0,
        help="the largest alpha grown to (default 4)",
    )
    p.add_argument(
        "--beam", type=flag(DecodeOptions, "beam_size"), default=4, help="beam size (default 4)"
    )
    p.add_argument(
        "--length-penalty",
        choices=choices_of(DecodeOptions, "length_penalty"),
        default="gnmt",
        help="the beam's rules (default: gnmt, the paper's)",
    )
    add_max_tokens_option(p)
    add_device_option(p)
    p.add_argument("--dry-run", action="store_true", help="print the table, save nothing")
    p.add_argument("--force", action="store_true", help="replace an existing tuned_alpha.json")


def _alphas(text: str) -> tuple[float, ...]:
    """``0.6,1,1.5`` -> (0.6, 1.0, 1.5); each a finite number >= 0."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas: {text!r}"
        ) from None
    if any(not 0 <= v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"each alpha must be a finite number >= 0: {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    """Tune, print the table, save the choice."""
    from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer
    from aiayn.data import normalize
    from aiayn.decoding.translate import DecodeOptions, translate_texts
    from aiayn.evaluation.tuning import DEFAULT_ALPHAS, LengthScore, tune_alpha, tuned_record
    from aiayn.models.transformer import EncoderDecoder
    from aiayn.validation import resolve_device

    _check_flags(args)
    ckpt = load_checkpoint(
        args.checkpoint,
        map_location=resolve_device(args.device),
        expect=EncoderDecoder,
        command="translate",
    )
    run_config = ckpt.state.get("run_config")
    pairs, source, reference = validation_pairs(run_config, args.src, args.ref)
    sources, references = [normalize(s) for s, _ in pairs], [normalize(t) for _, t in pairs]
    tokenizer = load_translation_tokenizer(ckpt.path)
    options = DecodeOptions(
        beam_size=args.beam, length_penalty=args.length_penalty, max_tokens=args.max_tokens
    )

    def decode(alpha: float) -> list[str]:
        return translate_texts(ckpt.model, tokenizer, sources, replace(options, alpha=alpha))

    def report(alpha: float, s: LengthScore) -> None:
        print(
            f"alpha {alpha:<5g} BLEU {s.bleu:6.2f}  BP {s.bp:.3f}  ratio {s.ratio:.3f}", flush=True
        )

    print(f"{len(sources)} validation sentences ({source}), beam {args.beam}", file=sys.stderr)
    alpha, scores = tune_alpha(
        decode,
        references,
        args.alphas or DEFAULT_ALPHAS,
        report=report,
        grow_by=args.grow_by,
        grow_to=args.grow_to,
    )
    best = scores[alpha]
    print(f"best: alpha {alpha:g} (BLEU {best.bleu:.2f}, BP {best.bp:.3f}, ratio {best.ratio:.3f})")
    if alpha == max(scores):
        print(_edge_note(alpha, args.grow_by), file=sys.stderr)
    if args.dry_run:
        return 0
    record = tuned_record(
        alpha,
        scores,
        beam_size=args.beam,
        length_penalty=args.length_penalty,
        source=source,
        reference=reference,
        sentences=len(sources),
    )
    print(f"saved: {record.save(Path(ckpt.path), force=args.force)}")
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """A UserError for flags that do not go together."""
    from aiayn.errors import UserError
    from aiayn.evaluation.tuning import DEFAULT_ALPHAS

    if args.beam == 1:
        raise UserError("--beam 1 is greedy search, which has no length penalty: give --beam >= 2")
    if (args.src is None) != (args.ref is None):
        raise UserError("give --src and --ref together (or neither: the run's validation set)")
    largest = max(args.alphas or DEFAULT_ALPHAS)
    if args.grow_by and args.grow_to < largest + args.grow_by:
        raise UserError(
            f"--grow-to {args.grow_to:g} leaves no room to grow past the grid's largest alpha "
            f"({largest:g}) by --grow-by {args.grow_by:g}"
        )


def _edge_note(alpha: float, grow_by: float) -> str:
    """The line for a best α that is the largest tried: BLEU may still rise beyond it."""
    further = "a larger --grow-to" if grow_by else "--grow-by 0.5"
    return f"note: alpha {alpha:g} is the largest tried, so BLEU may rise beyond it ({further})"


def validation_pairs(
    run_config: dict[str, Any] | None, src: str | None, ref: str | None
) -> tuple[list[tuple[str, str]], str, str]:
    """(pairs, source name, reference name) to tune on: ``src``/``ref`` if given, else the
    run's validation set. A file of the run's test set is refused."""
    from aiayn.data import read_parallel
    from aiayn.errors import UserError

    data = _run_data(run_config)
    if src is not None and ref is not None:
        if data is not None:
            _refuse_test_set(data, src, ref)
        return read_parallel(src, ref), src, ref
    if data is None:
        raise UserError("the checkpoint records no training run: give --src and --ref")
    if data.valid_src is not None and data.valid_tgt is not None:
        return read_parallel(data.valid_src, data.valid_tgt), data.valid_src, data.valid_tgt
    if data.valid is not None:
        return _eval_source_pairs(data), data.valid, data.valid
    raise UserError(
        "the run held out its validation pairs from the training data (no data.valid_src): "
        "give --src and --ref"
    )


def _run_data(run_config: dict[str, Any] | None) -> Any:
    """The data section (:class:`~aiayn.training.config.DataConfig`) of a translation run's
    recorded config, or None."""
    from aiayn.errors import UserError
    from aiayn.training.config import DataConfig, run_config_from_dict

    if not run_config:
        return None
    try:
        data = run_config_from_dict(run_config).data
    except UserError:
        return None
    return data if isinstance(data, DataConfig) else None


def _refuse_test_set(data: Any, src: str, ref: str) -> None:
    from aiayn.errors import UserError

    given = {Path(src).resolve(), Path(ref).resolve()}
    tests = {Path(p).resolve() for p in (data.test_src, data.test_tgt) if p is not None}
    if given & tests:
        raise UserError(
            f"{' / '.join(sorted(str(p) for p in given & tests))} is the run's test set: tune "
            "alpha on validation data, or its test score is no longer a test score"
        )


def _eval_source_pairs(data: Any) -> list[tuple[str, str]]:
    """The pairs of ``data.valid`` (a sacreBLEU test set or a split of the run's corpus)."""
    from aiayn.data.hf_datasets import HFCorpus, read_eval_source

    corpus = None
    if data.hf_dataset is not None:
        corpus = HFCorpus(data.hf_dataset, data.hf_config, data.src_lang, data.tgt_lang)
    return read_eval_source(data.valid, corpus, data.src_lang, data.tgt_lang)
