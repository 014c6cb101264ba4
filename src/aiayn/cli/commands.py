"""What the sub-commands' ``register(subparsers)`` functions share (:mod:`aiayn.cli.main`): adding
the sub-command's parser with its texts and the function it runs, and the options several
commands spell the same way."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiayn.validation import PositiveInt, device_flag, flag_type

if TYPE_CHECKING:
    import torch
    from torch import nn

    from aiayn.checkpoint import Checkpoint

M = TypeVar("M", bound="nn.Module")


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


def load_model_checkpoint(
    args: argparse.Namespace,
    expect: type[M],
    command: str,
    *,
    device: torch.device | None = None,
) -> Checkpoint[M]:
    """``--checkpoint``, whose model must be an ``expect`` whose family serves ``command``, on
    ``--device`` (or ``device``, resolved already) and quantised as ``--quantize`` says."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.validation import resolve_device

    return load_checkpoint(
        args.checkpoint,
        map_location=resolve_device(args.device) if device is None else device,
        expect=expect,
        command=command,
        quantize=args.quantize,
    )


def add_device_option(
    p: argparse.ArgumentParser, *, quantize: bool = False, pack: bool = False
) -> None:
    """``--device``: where the model runs (checked by :func:`~aiayn.validation.device_flag`);
    with ``quantize``, ``--quantize`` too (:func:`add_quantize_option`); with ``pack``,
    ``--no-pack`` (``args.pack``): on CPU, PyTorch's own linear kernels rather than
    oneDNN-packed weights."""
    p.add_argument("--device", type=device_flag, default="auto", help="auto, cpu, cuda[:N] or mps")
    if quantize:
        add_quantize_option(p)
    if pack:
        p.add_argument(
            "--no-pack",
            dest="pack",
            action="store_false",
            help="on CPU, keep PyTorch's own linear kernels instead of oneDNN-packed weights",
        )


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


def add_max_tokens_option(p: argparse.ArgumentParser) -> None:
    """``--max-tokens``: a beam-search batch's budget (checked by the rule of
    :class:`~aiayn.decoding.translate.DecodeOptions`'s ``max_tokens``)."""
    from aiayn.decoding.translate import DecodeOptions
    from aiayn.validation import flag

    p.add_argument(
        "--max-tokens",
        type=flag(DecodeOptions, "max_tokens"),
        default=4096,
        help="source tokens x beams per batch (default 4096)",
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
