"""``aiayn export``: an aiayn checkpoint -> a folder another inference engine runs.

    aiayn export --checkpoint runs/wmt/best --to ct2 out/wmt-ct2 [--quantization int8]
    aiayn export --checkpoint runs/bert --to onnx out/bert-onnx

What exports where comes from the family registry (:mod:`aiayn.convert.export`). The output
folder must not exist: nothing is replaced. It is written beside its place and renamed into it
when complete (:mod:`aiayn.cli.outputs`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.convert.export import export_formats
from aiayn.convert.formats import FORMATS, QUANTIZATIONS


def register(subparsers: Any) -> None:
    """Add the ``export`` sub-command."""
    p = add_command(
        subparsers,
        "export",
        run,
        help="export a checkpoint for CTranslate2 or ONNX Runtime",
        description="Write a checkpoint's model for another inference engine, with its "
        f"tokenizer. {export_formats()} The output folder must not exist.",
    )
    p.add_argument("--checkpoint", metavar="DIR", required=True, help="aiayn checkpoint folder")
    p.add_argument("--to", choices=tuple(FORMATS), required=True, help="the format")
    p.add_argument("out", metavar="OUT", help="folder to write (must not exist)")
    p.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="ct2 only: the weights' type (float32, the default; int8_float32; int8)",
    )


def run(args: argparse.Namespace) -> int:
    """Export and print one summary line (and, on standard error, what stays behind)."""
    from torch import nn

    from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint, read_checkpoint_config
    from aiayn.checkpoint.load import quantization_of
    from aiayn.cli.outputs import check_writable, exists, given_path, staged_tree
    from aiayn.convert.export import (
        export_ct2,
        export_onnx,
        exporter,
        left_behind,
        refuse_int8_checkpoint,
        require_extra,
    )
    from aiayn.errors import UserError

    out = given_path(args.out, flag="OUT", what="the folder to create")
    if args.quantization is not None and args.to != "ct2":
        raise UserError(f"--quantization is for --to ct2, not --to {args.to}")
    if exists(out):
        raise UserError(f"{out} exists: aiayn export never replaces anything; choose another OUT")
    check_writable(out.parent, flag="OUT", target=out)
    folder, family, _, state = read_checkpoint_config(Path(args.checkpoint))
    exporter(family, args.to)  # refused by name before any loading
    refuse_int8_checkpoint(folder, quantization_of(state), state.get("quantized_from"), args.to)
    require_extra(args.to)
    loaded = load_checkpoint(args.checkpoint, expect=nn.Module)
    tokenizer = checkpoint_tokenizer(loaded.path)
    with staged_tree(out) as staged:
        if args.to == "ct2":
            export_ct2(loaded.model, tokenizer, staged, args.quantization or "float32")
        else:
            export_onnx(loaded.model, tokenizer, staged)
    for part in left_behind(loaded.model, args.to):
        print(f"aiayn export: note: the model's {part} is not part of the export", file=sys.stderr)
    kind = FORMATS[args.to] + (f" ({args.quantization or 'float32'})" if args.to == "ct2" else "")
    print(f"exported {loaded.path} -> {out}: {family.name}, {kind}")
    return 0
