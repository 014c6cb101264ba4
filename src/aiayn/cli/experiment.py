"""``aiayn experiment NAME``: the paper's claims about attention, measured on this machine.

    aiayn experiment scaling      # why scale by √d_k (§3.2.1)
    aiayn experiment additive     # dot-product vs additive attention: time, memory (§3.2.1)
    aiayn experiment multihead    # 8 heads of 64 vs 1 head of 512 (§3.2.2)
    aiayn experiment positional   # sinusoidal encodings (§3.5)
    aiayn experiment --list

Each prints its table (Markdown) and writes ``NAME.png``, ``NAME.md`` and ``NAME.csv`` into
``--out``. See :mod:`aiayn.visualization.experiments`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``experiment`` sub-command."""
    p = subparsers.add_parser(
        "experiment",
        help="run one of the paper's claims about attention as an experiment (PNG + table)",
        description="The paper's claims about attention as small experiments: scaling "
        "(§3.2.1), additive (§3.2.1), multihead (§3.2.2), positional (§3.5). Each prints a "
        "Markdown table and writes a PNG plot.",
    )
    p.add_argument("name", nargs="?", help="the experiment (see --list)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--out", default="experiments", help="output folder (created)")
    p.add_argument("--quick", action="store_true", help="a tiny version that runs in seconds")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List the experiments, or run one and print its table."""
    from aiayn.errors import UserError
    from aiayn.visualization.experiments import EXPERIMENTS, format_table, run_experiment

    if args.list:
        for name, (_, description) in EXPERIMENTS.items():
            print(f"{name:<11} {description}")
        return 0
    if not args.name:
        raise UserError(f"name an experiment: one of {', '.join(EXPERIMENTS)} (or --list)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")
    result = run_experiment(args.name, out, quick=args.quick, seed=args.seed)
    print(f"## {result.title}\n")
    print(format_table(result.rows))
    print(result.summary)
    print(f"\nplot: {result.plot}")
    print(f"table: {result.table} (and {result.table.with_suffix('.csv')})")
    return 0
