"""``aiayn explain`` (placeholder until the explain module lands)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``explain`` sub-command."""
    p = subparsers.add_parser("explain", help="step-by-step trace of self-attention")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the trace."""
    raise NotImplementedError
