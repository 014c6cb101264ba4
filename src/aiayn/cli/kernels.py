"""``aiayn kernels``: which of aiayn's CPU kernels run on this machine and why; ``aiayn kernels
build`` builds them ahead of use (``make install`` runs it)."""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.cli.commands import add_command


def register(subparsers: Any) -> None:
    """Add the ``kernels`` sub-command."""
    p = add_command(
        subparsers,
        "kernels",
        run,
        help="show which CPU kernels run here and why; 'build' builds them ahead of use",
        description="The CPU, its instruction-set class (capped by AIAYN_CPU_CAP), the library "
        "caps in force, and for each operation and size the kernel that runs "
        "(docs/performance.md). 'aiayn kernels build' builds aiayn's C++ kernels where they "
        "can run, so that no later command compiles; it exits 1 if one that should run here "
        "failed to build.",
    )
    p.add_argument("action", nargs="?", choices=("show", "build"), default="show")


def run(args: argparse.Namespace) -> int:
    """Print the report, building first for ``build``."""
    from aiayn.kernels import prepare
    from aiayn.kernels.build import failed_builds, why_not_here
    from aiayn.kernels.dispatch import report

    if args.action == "build":
        for line in prepare():
            print(line)
        if why_not_here() is not None:
            print(f"nothing to build: {why_not_here()}")
    for line in report():
        print(line)
    return 1 if args.action == "build" and failed_builds() else 0
