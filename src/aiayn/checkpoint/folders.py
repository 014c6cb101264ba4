"""Where checkpoints are: the folder a path names (a checkpoint, its stand-in ``NAME.old``, or a
run folder's latest step), a run's ``checkpoints/step_*`` folders, and keeping that folder tidy
(leftovers of crashes, old steps pruned, unusable checkpoints set aside)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from aiayn.checkpoint.files import CORRUPT, OLD, STATE_FILE, TMP, beside, recover
from aiayn.errors import UserError

_STEP = re.compile(r"step_\d+")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder itself (or its ``NAME.old`` while a crash left ``NAME`` missing), or
    the latest ``checkpoints/step_*`` of a run folder."""
    folder = Path(path)
    if os.path.lexists(folder / STATE_FILE):  # whatever it is: the loader checks it
        return folder
    stand_in = beside(folder, OLD)
    if not folder.exists() and (stand_in / STATE_FILE).is_file():
        return stand_in
    steps = list_checkpoints(folder)
    if steps:
        return steps[-1]
    if (folder / "config.json").is_file():  # a Hugging Face model folder
        raise UserError(
            f"{folder} is a Hugging Face model folder, not an aiayn checkpoint: convert it "
            f"first: aiayn convert --from-hf {folder} --to DIR"
        )
    raise UserError(f"no checkpoint found at {folder} (expected {STATE_FILE} or checkpoints/)")


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's ``checkpoints/step_*`` folders, oldest first; ``step_X.old`` stands in for a
    ``step_X`` that a crash left missing; ``.tmp`` and ``.corrupt`` folders are left out."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found: dict[str, Path] = {}
    for folder in root.glob("step_*"):
        name = folder.name.removesuffix(OLD)
        if not folder.is_dir() or not _STEP.fullmatch(name):
            continue
        if folder.name == name or not (root / name).exists():
            found[name] = folder
    return [found[name] for name in sorted(found)]


def tidy_checkpoints(folder: Path) -> None:
    """Clean up after crashes in a folder of checkpoints (a run's ``checkpoints/``): every
    ``NAME.old`` whose ``NAME`` is missing goes back to ``NAME``; other ``NAME.old`` and
    ``NAME.tmp`` folders are deleted."""
    if not folder.is_dir():
        return
    for leftover in sorted(folder.iterdir()):
        if leftover.is_dir() and leftover.name.endswith((TMP, OLD)):
            recover(leftover.with_name(leftover.name[:-4]))


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (``best`` is elsewhere). Each
    goes at once (renamed to ``NAME.tmp``, then deleted): a crash never leaves half of one."""
    for old in list_checkpoints(run_dir)[:-keep_last]:
        garbage = beside(old.with_name(old.name.removesuffix(OLD)), TMP)
        shutil.rmtree(garbage, ignore_errors=True)
        os.rename(old, garbage)
        shutil.rmtree(garbage)


def set_aside(path: Path) -> Path:
    """Rename an unusable checkpoint ``NAME`` to ``NAME.corrupt`` (replacing an older one of
    that name), so that it is kept for inspection but no longer listed."""
    aside = beside(path, CORRUPT)
    if aside.is_dir():
        shutil.rmtree(aside)
    os.rename(path, aside)
    return aside
