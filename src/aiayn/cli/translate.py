"""``aiayn translate``: placeholder, being written."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``translate`` sub-command."""
    p = subparsers.add_parser("translate", help="(not ready yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Not ready yet."""
    from aiayn.errors import UserError

    raise UserError("'translate' is not implemented yet")
