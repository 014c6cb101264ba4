"""``aiayn attention``: placeholder, being written."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``attention`` sub-command."""
    p = subparsers.add_parser("attention", help="(not ready yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Not ready yet."""
    from aiayn.errors import UserError

    raise UserError("'attention' is not implemented yet")
