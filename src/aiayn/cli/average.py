"""``aiayn average``: average the parameters of the last N checkpoints (§6.1)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aiayn.validation import PositiveInt, flag_type


def register(subparsers: Any) -> None:
    """Add the ``average`` sub-command."""
    p = subparsers.add_parser(
        "average",
        help="average the parameters of the last N checkpoints into a new one (§6.1)",
        description="Average checkpoints as in §6.1 (the paper: last 5 for base, last 20 for "
        "big). Give a run folder and --last N, or explicit checkpoint folders.",
    )
    p.add_argument("checkpoints", nargs="*", help="checkpoint folders (default: from --run-dir)")
    p.add_argument("--run-dir", help="run folder whose checkpoints/step_* are averaged")
    p.add_argument(
        "--last", type=flag_type(PositiveInt), default=5, help="how many of the newest to average"
    )
    p.add_argument("--out", required=True, help="folder for the averaged checkpoint")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --out checkpoint (never another kind of folder), or write "
        "into a run's checkpoints/ under a name training uses (step_*, best, averaged)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Average and report which checkpoints went in."""
    from aiayn.cli.outputs import check_checkpoint_out, staged_tree
    from aiayn.errors import UserError
    from aiayn.training.checkpoint import average_checkpoints, list_checkpoints

    if args.checkpoints:
        paths = [Path(p) for p in args.checkpoints]
    elif args.run_dir:
        paths = list_checkpoints(args.run_dir)[-args.last :]
        if not paths:
            raise UserError(f"no checkpoints under {args.run_dir}/checkpoints")
    else:
        raise UserError("give checkpoint folders or --run-dir")
    out = check_checkpoint_out(args.out, force=args.force, flag="--out")
    with staged_tree(out) as staged:  # the old --out stays until the new one is complete
        average_checkpoints(paths, staged)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {out}")
    return 0
