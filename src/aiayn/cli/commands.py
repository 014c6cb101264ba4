"""What the sub-commands' ``register(subparsers)`` functions share (:mod:`aiayn.cli.main`): adding
the sub-command's parser with its texts and the function it runs, and the options several
commands spell the same way."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from aiayn.validation import PositiveInt, device_flag, flag_type


def add_command(
    subparsers: Any,
    name: str,
    run: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """Add the sub-command ``name``, which calls ``run(args)`` for its exit status; ``help`` is
    its line in ``aiayn --help``, ``description`` the text of ``aiayn NAME --help``. Returns its
    parser, for the command's own options."""
    p: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=description)
    p.set_defaults(func=run)
    return p


def add_device_option(p: argparse.ArgumentParser) -> None:
    """``--device``: where the model runs (checked by :func:`~aiayn.validation.device_flag`)."""
    p.add_argument("--device", type=device_flag, default="auto", help="auto, cpu, cuda[:N] or mps")


def add_quantize_option(p: argparse.ArgumentParser) -> None:
    """``--quantize``: ``int8`` runs the model's linear layers with int8 weights
    (:mod:`aiayn.layers.quantized`, quantised as the checkpoint loads); ``none``: as stored."""
    from aiayn.layers.quantized import QUANTIZE_MODES

    p.add_argument(
        "--quantize",
        choices=QUANTIZE_MODES,
        default="none",
        help="int8: linear layers with int8 weights and per-row int8 activations, for CPU "
        "inference (docs/quantization.md); none (default): the checkpoint's weights as stored",
    )


def add_batch_size_option(p: argparse.ArgumentParser, default: int, items: str) -> None:
    """``--batch-size``: how many ``items`` ("texts") go through the model at once."""
    p.add_argument(
        "--batch-size",
        type=flag_type(PositiveInt),
        default=default,
        help=f"{items} per batch ({default})",
    )


def add_texts_input_option(p: argparse.ArgumentParser) -> None:
    """``--input``/``-i``: the file of texts a BERT command reads, one per line."""
    p.add_argument("--input", "-i", help="texts file, one per line (default: standard input)")
