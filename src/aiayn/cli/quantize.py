"""``aiayn quantize``: write an int8 copy of a checkpoint (its linear layers with int8 weights
and per-output-channel scales, :mod:`aiayn.layers.quantized`), which loads without quantising
again. Converted Hugging Face folders are checkpoints too."""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.cli.commands import add_command


def register(subparsers: Any) -> None:
    """Add the ``quantize`` sub-command."""
    p = add_command(
        subparsers,
        "quantize",
        run,
        help="write an int8-quantised copy of a checkpoint, for CPU inference",
        description="Quantise a checkpoint's linear layers to int8 weights with one scale per "
        "output channel (activations are quantised per row as it runs) and write it as a new "
        "checkpoint: safetensors with the int8 tensors and their scales, checksummed, "
        "state.json marking the quantisation. Commands that run a model load it as it is; "
        "those that need fp32 weights (training, average, convert --to-hf) refuse it. See "
        "docs/quantization.md.",
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (or a run folder)")
    p.add_argument("--out", required=True, help="folder for the quantised checkpoint")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --out checkpoint (never another kind of folder)",
    )


def run(args: argparse.Namespace) -> int:
    """Quantise and save; report the sizes."""
    from torch import nn

    from aiayn.checkpoint import MODEL_FILE, checkpoint_tokenizer, load_checkpoint, save_checkpoint
    from aiayn.cli.outputs import check_checkpoint_out, staged_tree
    from aiayn.errors import UserError

    out = check_checkpoint_out(args.out, force=args.force, flag="--out")
    ckpt = load_checkpoint(args.checkpoint, expect=nn.Module, quantize="int8")
    if ckpt.quantization != "none":
        raise UserError(f"{ckpt.path} is already {ckpt.quantization}-quantised")
    if ckpt.path.resolve() == out.resolve():
        raise UserError(f"--out {out} is the checkpoint itself: give another folder")
    state = {key: value for key, value in ckpt.state.items() if key not in _NOT_COPIED}
    state["quantized_from"] = str(ckpt.path)
    with staged_tree(out) as staged:  # an old --out (with --force) stays until this is complete
        save_checkpoint(staged, ckpt.model, state, checkpoint_tokenizer(ckpt.path))
    before, after = ((p / MODEL_FILE).stat().st_size for p in (ckpt.path, out))
    print(
        f"quantised {ckpt.path} -> {out}: {ckpt.family}, int8 "
        f"({MODEL_FILE}: {before:,} -> {after:,} bytes)"
    )
    return 0


_NOT_COPIED = ("optimizer", "files", "checksums")
"""What of the source's state.json the quantised checkpoint does not carry over: no optimizer
moments (it does not train); the manifest and checksum file are its own."""
