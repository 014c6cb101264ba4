"""``aiayn explain``: self-attention of a small example, step by step and with the numbers; with
``--checkpoint``, the first self-attention layer of a real checkpoint of any family on the
user's sentence (or image), with its own tokenizer.

The logic lives in :mod:`aiayn.visualization.explain` and :mod:`aiayn.visualization.first_layer`
(the family's inputs through the registry's ``first_layer``); this module parses the options and
prints.
"""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.validation import NonNegativeInt, PositiveInt, Seed, flag_type
from aiayn.visualization.explain import (
    DEFAULT_TOKENS,
    build_trace,
    check_trace,
    format_trace,
    load_weights,
)


def register(subparsers: Any) -> None:
    """Add the ``explain`` sub-command."""
    p = subparsers.add_parser(
        "explain",
        help="step-by-step trace of self-attention, with the numbers",
        description=(
            "Print, step by step and with the numbers, the multi-head self-attention of a small "
            "example: token embeddings (§3.4), positional encodings (§3.5), Q, K, V, the scores "
            "Q Kᵀ, the scaling by √d_k, the softmax and the weighted sum of V (§3.2.1, eq. 1) per "
            "head, then the concatenation and W_O (§3.2.2). Defaults are hand-checkable: "
            "one-hot embeddings and identity weight matrices."
        ),
    )
    _add_example_options(p)
    _add_step_options(p)
    _add_checkpoint_options(p)
    p.set_defaults(func=run)


def _add_example_options(p: argparse.ArgumentParser) -> None:
    """The example: its tokens, sizes and matrices (default, seeded or from a file)."""
    p.add_argument(
        "--tokens",
        default=" ".join(DEFAULT_TOKENS),
        help="the example sentence, split on whitespace (default: %(default)r)",
    )
    p.add_argument(
        "--d-model",
        type=flag_type(PositiveInt),
        default=None,
        metavar="D",
        help="model size d_model (default: from --weights if it gives a matrix, else 4)",
    )
    p.add_argument(
        "--heads",
        type=flag_type(PositiveInt),
        default=2,
        metavar="H",
        help="number of attention heads; must divide d_model (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=flag_type(Seed),
        default=None,
        help="random normal embeddings and W_Q, W_K, W_V, W_O (std 1/√d_model) from this seed "
        "instead of one-hot embeddings and identities",
    )
    p.add_argument(
        "--weights",
        default=None,
        metavar="FILE.json",
        help='explicit matrices: a JSON object with any of "embeddings" (a list of rows, one '
        'per token, or an object token -> row), "W_Q", "W_K", "W_V", "W_O" (d_model×d_model, '
        "used as x @ W); missing keys keep their default",
    )


def _add_step_options(p: argparse.ArgumentParser) -> None:
    """Which optional steps run (positions, scaling, mask) and how numbers are printed."""
    p.add_argument(
        "--no-positional",
        dest="positional",
        action="store_false",
        help="do not add the sinusoidal positional encodings (§3.5)",
    )
    p.add_argument(
        "--no-scale",
        dest="scale",
        action="store_false",
        help="do not multiply the embeddings by √d_model (§3.4)",
    )
    p.add_argument(
        "--causal",
        action="store_true",
        help="apply the decoder's causal mask: token i attends to tokens 0..i (§3.2.3)",
    )
    p.add_argument(
        "--decimals",
        type=flag_type(NonNegativeInt),
        default=4,
        help="digits after the decimal point (default: %(default)s)",
    )


def _add_checkpoint_options(p: argparse.ArgumentParser) -> None:
    """A real checkpoint's first layer instead of the small example."""
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="walk through the first self-attention layer of this checkpoint (or run folder) "
        "on --text (or --image for a ViT), with its own tokenizer and weights",
    )
    p.add_argument(
        "--text",
        default=None,
        help="with --checkpoint: the sentence (default: the tokens of --tokens' default, "
        f"{' '.join(DEFAULT_TOKENS)!r})",
    )
    p.add_argument("--image", default=None, help="with --checkpoint of a ViT: an image file")
    p.add_argument(
        "--head",
        type=flag_type(PositiveInt),
        default=1,
        help="with --checkpoint: the head to show, from 1 (default: %(default)s)",
    )
    p.add_argument(
        "--columns",
        type=flag_type(PositiveInt),
        default=8,
        help="with --checkpoint: columns shown of the d_model- and d_k-wide matrices "
        "(default: %(default)s)",
    )


_TOY_ONLY = ("d_model", "seed", "weights")
_TOY_OFF = (("positional", "--no-positional"), ("scale", "--no-scale"))


def _run_checkpoint(args: argparse.Namespace) -> int:
    """Walk through a checkpoint's first layer; the family gives its inputs (the registry)."""
    from pathlib import Path

    from torch import nn

    from aiayn.checkpoint import load_checkpoint, read_checkpoint_config
    from aiayn.errors import UserError
    from aiayn.models.families import resolve
    from aiayn.visualization.first_layer import (
        check_first_layer,
        format_first_layer,
        trace_first_layer,
    )

    given = [f"--{n.replace('_', '-')}" for n in _TOY_ONLY if getattr(args, n) is not None]
    given += [flag for name, flag in _TOY_OFF if not getattr(args, name)]
    given += ["--causal"] if args.causal else []
    given += ["--tokens"] if args.tokens != " ".join(DEFAULT_TOKENS) else []
    if given:
        raise UserError(f"{given[0]} is for the small example; with --checkpoint give --text")
    if not Path(args.checkpoint).exists():
        raise UserError(f"checkpoint not found: {args.checkpoint}")
    folder, family, _, _ = read_checkpoint_config(args.checkpoint)
    if family.first_layer is None:
        raise UserError(f"{folder} holds a {family.name} model, which explain cannot walk through")
    if family.reads == "image":
        if args.image is None or args.text is not None:
            raise UserError(f"{folder} holds a {family.title}: give --image IMAGE (not --text)")
        source = args.image
    else:
        if args.image is not None:
            raise UserError(f"--image needs a ViT checkpoint; {folder} holds a {family.title}")
        source = " ".join(DEFAULT_TOKENS) if args.text is None else args.text
    checkpoint = load_checkpoint(args.checkpoint, expect=nn.Module)
    inputs = resolve(family.first_layer)(checkpoint.model.eval(), checkpoint.path, source)
    trace = trace_first_layer(inputs, args.head)
    check = check_first_layer(trace)
    text = format_first_layer(
        trace,
        source=source,
        where=f"the {family.title} checkpoint {checkpoint.path}",
        columns=args.columns,
        decimals=args.decimals,
        check=check,
    )
    print(text, end="")
    return 0 if check.passed else 1


def run(args: argparse.Namespace) -> int:
    """Build the trace, check it against the library's SelfAttention, print it.

    Returns 0, or 1 if the library disagrees with the explicit arithmetic (a bug, not bad input).
    With ``--checkpoint``: the checkpoint's first layer instead (:func:`_run_checkpoint`).
    """
    if args.checkpoint is not None:
        return _run_checkpoint(args)
    for flag in ("text", "image"):
        if getattr(args, flag) is not None:
            from aiayn.errors import UserError

            raise UserError(f"--{flag} needs --checkpoint (the small example takes --tokens)")
    weights = None if args.weights is None else load_weights(args.weights)
    trace = build_trace(
        args.tokens.split(),
        d_model=args.d_model,
        num_heads=args.heads,
        seed=args.seed,
        weights=weights,
        positional=args.positional,
        scale_embeddings=args.scale,
        causal=args.causal,
    )
    check = check_trace(trace)
    print(format_trace(trace, decimals=args.decimals, check=check), end="")
    return 0 if check.passed else 1
