"""``aiayn experiment NAME``: the paper's claims about attention, measured on this machine.

    aiayn experiment scaling      # why scale by √d_k (§3.2.1)
    aiayn experiment additive     # dot-product vs additive attention: time, memory (§3.2.1)
    aiayn experiment multihead    # 8 heads of 64 vs 1 head of 512 (§3.2.2)
    aiayn experiment positional   # sinusoidal encodings (§3.5)
    aiayn experiment --list

Each prints its table (Markdown) and writes ``NAME.png``, ``NAME.md`` and ``NAME.csv`` into
``--out``: refused before the run if one of them is there, unless ``--force``; written into a
temporary folder inside ``--out`` and moved into place when complete (:mod:`aiayn.cli.outputs`).
See :mod:`aiayn.visualization.experiments`.
"""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.validation import Seed, flag_type


def register(subparsers: Any) -> None:
    """Add the ``experiment`` sub-command."""
    p = add_command(
        subparsers,
        "experiment",
        run,
        help="run one of the paper's claims about attention as an experiment (PNG + table)",
        description="The paper's claims about attention as small experiments: scaling "
        "(§3.2.1), additive (§3.2.1), multihead (§3.2.2), positional (§3.5). Each prints a "
        "Markdown table and writes a PNG plot.",
    )
    p.add_argument("name", nargs="?", help="the experiment (see --list)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--out", default="experiments", help="output folder (created)")
    p.add_argument("--quick", action="store_true", help="a tiny version that runs in seconds")
    p.add_argument("--seed", type=flag_type(Seed), default=0, help="random seed (default 0)")
    p.add_argument("--force", action="store_true", help="replace this experiment's files in --out")


def run(args: argparse.Namespace) -> int:
    """List the experiments, or run one and print its table."""
    from aiayn.cli.outputs import check_folder, staged_files
    from aiayn.errors import UserError
    from aiayn.visualization.experiments import EXPERIMENTS, format_table, run_experiment

    if args.list:
        for name, (_, description) in EXPERIMENTS.items():
            print(f"{name:<11} {description}")
        return 0
    if not args.name:
        raise UserError(f"name an experiment: one of {', '.join(EXPERIMENTS)} (or --list)")
    if args.name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {args.name!r}; choose from: {', '.join(EXPERIMENTS)}")
    names = [f"{args.name}{suffix}" for suffix in (".png", ".md", ".csv")]
    out = check_folder(args.out, force=args.force, flag="--out", names=names)
    with staged_files(out) as stage:
        result = run_experiment(args.name, stage, quick=args.quick, seed=args.seed)
    print(f"## {result.title}\n")
    print(format_table(result.rows))
    print(result.summary)
    table = out / result.table.name
    print(f"\nplot: {out / result.plot.name}")
    print(f"table: {table} (and {table.with_suffix('.csv')})")
    return 0
