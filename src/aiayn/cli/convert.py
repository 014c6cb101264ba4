"""``aiayn convert``: a Hugging Face model folder (or Hub name) -> an aiayn checkpoint, and back.

    aiayn convert --from-hf gpt2 --to runs/gpt2            Hugging Face -> aiayn checkpoint
    aiayn convert --checkpoint runs/gpt2 --to-hf out/gpt2  aiayn checkpoint -> Hugging Face

An existing destination is refused unless ``--force``; then it is replaced if it is of the kind
written (an aiayn checkpoint for ``--to``, a Hugging Face folder with ``config.json`` for
``--to-hf``) or empty, and never otherwise: replacing would delete an unrelated folder. The
destination is written beside it and renamed into place when complete
(:mod:`aiayn.cli.outputs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiayn.cli.commands import add_command
from aiayn.models.families import conversion_directions


def register(subparsers: Any) -> None:
    """Add the ``convert`` sub-command."""
    p = add_command(
        subparsers,
        "convert",
        run,
        help="convert a Hugging Face model (folder or Hub name) to an aiayn checkpoint, or back",
        description="Convert pretrained weights exactly: every tensor is used, shapes are "
        f"checked, unsupported options are refused by name. {conversion_directions()}",
    )
    p.add_argument("--from-hf", metavar="DIR_OR_NAME", help="Hugging Face folder or Hub name")
    p.add_argument("--to", metavar="DIR", help="aiayn checkpoint folder to write (with --from-hf)")
    p.add_argument("--checkpoint", metavar="DIR", help="aiayn checkpoint to write back")
    p.add_argument(
        "--to-hf", metavar="OUT", help="Hugging Face folder to write (with --checkpoint)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing destination of the kind written (an aiayn checkpoint, a "
        "Hugging Face folder) or an empty folder; never another folder",
    )


def run(args: argparse.Namespace) -> int:
    """Convert in the direction the arguments give and print one summary line."""
    from aiayn.errors import UserError

    if args.from_hf and args.to and not (args.checkpoint or args.to_hf):
        return _from_hf(args.from_hf, Path(args.to), args.force)
    if args.checkpoint and args.to_hf and not (args.from_hf or args.to):
        return _to_hf(Path(args.checkpoint), Path(args.to_hf), args.force)
    raise UserError("give --from-hf DIR_OR_NAME --to DIR, or --checkpoint DIR --to-hf OUT")


def _from_hf(source: str, out: Path, force: bool) -> int:
    from aiayn.checkpoint import TOKENIZER_FILE, save_checkpoint
    from aiayn.cli.outputs import check_checkpoint_out, staged_tree
    from aiayn.convert import from_hf
    from aiayn.data.text_tokenizer import TextTokenizer
    from aiayn.errors import UserError
    from aiayn.models import count_parameters
    from aiayn.models.families import family_of

    check_checkpoint_out(out, force=force, flag="--to")
    converted = from_hf(source)
    if converted.tokenizer is None:
        raise UserError(
            f"{converted.folder} has no tokenizer (tokenizer.json, vocab.json + merges.txt, "
            "spiece.model, source.spm + target.spm + vocab.json, vocab.txt, or an image "
            "model's preprocessor_config.json): an aiayn checkpoint needs one"
        )
    state: dict[str, object] = {"converted_from": str(source), "hf_config": converted.hf_config}
    if converted.generation is not None:
        state["generation"] = dataclasses.asdict(converted.generation)
    for setting in converted.unapplied:
        print(
            f"aiayn convert: warning: {setting} of the generation config is not applied by "
            "aiayn's searches (outputs may differ from Hugging Face generate)",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory() as tmp, staged_tree(out) as staged:
        if isinstance(converted.tokenizer, TextTokenizer):
            converted.tokenizer.save(Path(tmp) / TOKENIZER_FILE)
            save_checkpoint(staged, converted.model, state, Path(tmp) / TOKENIZER_FILE)
        else:
            save_checkpoint(staged, converted.model, state, converted.tokenizer)
    family = family_of(converted.model).name
    print(
        f"converted {source} -> {out}: {family}, {count_parameters(converted.model):,} "
        f"parameters, {converted.tensors_mapped} tensors mapped"
    )
    return 0


def _to_hf(checkpoint: Path, out: Path, force: bool) -> int:
    from torch import nn

    from aiayn.checkpoint import load_checkpoint
    from aiayn.cli.outputs import check_tree, staged_tree
    from aiayn.convert import to_hf
    from aiayn.data.text_tokenizer import TextTokenizer
    from aiayn.models import count_parameters

    check_tree(
        out,
        force=force,
        flag="--to-hf",
        what="a Hugging Face model folder",
        is_what=lambda folder: (folder / "config.json").is_file(),
    )
    loaded = load_checkpoint(checkpoint, expect=nn.Module, fp32_for="convert --to-hf")
    tokenizer = TextTokenizer.load(loaded.tokenizer_path)
    with staged_tree(out) as staged:
        to_hf(loaded.model, staged, tokenizer)
    print(
        f"wrote {loaded.path} -> {out}: {loaded.family}, "
        f"{count_parameters(loaded.model):,} parameters, Hugging Face format"
    )
    return 0
