"""The ``aiayn`` command: one sub-command per module in :mod:`aiayn.cli`.

Each sub-command module exposes ``register(subparsers)`` which adds its parser and sets
``func`` (args -> exit code). Bad user input (:class:`~aiayn.errors.UserError`) is printed as
``aiayn: error: …`` without a traceback, with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aiayn import __version__
from aiayn.cli import (
    attention,
    average,
    classify_image,
    convert,
    embed,
    evaluate,
    experiment,
    explain,
    fill_mask,
    generate,
    params,
    train,
    translate,
)
from aiayn.errors import UserError

COMMANDS = (
    train,
    translate,
    generate,
    fill_mask,
    embed,
    classify_image,
    evaluate,
    average,
    attention,
    experiment,
    explain,
    params,
    convert,
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need': "
        "build, train, decode, inspect.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m aiayn``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except UserError as error:
        print(f"aiayn {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aiayn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
