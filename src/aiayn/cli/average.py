"""``aiayn average``: average the parameters of the last N checkpoints (§6.1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.validation import PositiveInt, flag_type


def register(subparsers: Any) -> None:
    """Add the ``average`` sub-command."""
    p = add_command(
        subparsers,
        "average",
        run,
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


def run(args: argparse.Namespace) -> int:
    """Average and report which checkpoints went in."""
    from aiayn.checkpoint import average_checkpoints, list_checkpoints
    from aiayn.cli.outputs import check_checkpoint_out, staged_tree
    from aiayn.errors import UserError

    if args.checkpoints and args.run_dir:
        raise UserError("give checkpoint folders or --run-dir, not both")
    if args.checkpoints:
        paths = [Path(p) for p in args.checkpoints]
        _refuse_repeats(paths)
    elif args.run_dir:
        found = list_checkpoints(args.run_dir)
        if not found:
            raise UserError(f"no checkpoints under {args.run_dir}/checkpoints")
        if len(found) < args.last:
            print(
                f"aiayn average: warning: {args.run_dir} holds {len(found)} checkpoint(s); "
                f"averaging all of them (--last {args.last})",
                file=sys.stderr,
            )
        paths = found[-args.last :]
    else:
        raise UserError("give checkpoint folders or --run-dir")
    out = check_checkpoint_out(args.out, force=args.force, flag="--out")
    with staged_tree(out) as staged:  # the old --out stays until the new one is complete
        average_checkpoints(paths, staged)
    n = f"{len(paths)} checkpoint{'s' if len(paths) > 1 else ''}"
    print(f"averaged {n} ({', '.join(p.name for p in paths)}) -> {out}")
    return 0


def _refuse_repeats(paths: list[Path]) -> None:
    """Refuse a checkpoint given twice (it would count twice in the average)."""
    from aiayn.errors import UserError

    seen: dict[Path, Path] = {}
    for path in paths:
        key = path.resolve()
        if key in seen:
            raise UserError(
                f"{path} is given twice (as {seen[key]} before): each checkpoint counts once"
            )
        seen[key] = path
