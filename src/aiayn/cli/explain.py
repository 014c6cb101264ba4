"""``aiayn explain``: self-attention of a small example, step by step and with the numbers.

The logic lives in :mod:`aiayn.visualization.explain`; this module parses the options and prints.
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


def run(args: argparse.Namespace) -> int:
    """Build the trace, check it against the library's SelfAttention, print it.

    Returns 0, or 1 if the library disagrees with the explicit arithmetic (a bug, not bad input).
    """
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
