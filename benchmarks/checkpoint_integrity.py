"""Benchmark: what checksums and syncing cost when checkpoints are saved and loaded.

    python benchmarks/checkpoint_integrity.py [--preset base] [--repeats 5]

A checkpoint of the paper's Transformer (``base``: 65M parameters, 0.25 GB of weights, 0.5 GB
of Adam moments) is written and read in a folder on the disk that holds ``--dir``:

* save: :func:`save_checkpoint` (files, each synced to disk, SHA-256 of each, ``SHA256SUMS``,
  rename), the same without syncing, and the same files written plainly (no checksums, no
  sync);
* load: :func:`load_checkpoint` (SHA-256 checked while the model is built) and
  :func:`read_optimizer_state`, each against the same call with the check switched off;
* the SHA-256 throughput alone.

The files stay in the page cache between reads (as after a save, or on a second load): the
figures are the cost of hashing, not of the disk. Median (min–max) of ``--repeats`` rounds,
interleaved. Writes docs/results/checkpoint_integrity.md and results/checkpoint_integrity.json.gz.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import aiayn.checkpoint as ck
import aiayn.checkpoint.checksums as ck_checksums
import aiayn.checkpoint.files as ck_files
import aiayn.checkpoint.load as ck_load
import aiayn.checkpoint.optimizer as ck_optimizer
from _common import command_line, fmt, machine, spread, time_interleaved, write_report
from aiayn.config import preset
from aiayn.models import Transformer


def _optimizer(model: Transformer) -> torch.optim.Optimizer:
    """AdamW after one step on a zero gradient: moments of every parameter's shape."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return opt


def _plain_save(folder: Path, model: Transformer, opt: torch.optim.Optimizer) -> None:
    """The files of a checkpoint, written as before checksums: no hash, no sync."""
    folder.mkdir()
    save_model(model, str(folder / ck.MODEL_FILE))
    flat = ck_optimizer._optimizer_to_flat(opt.state_dict())
    save_file(flat, str(folder / ck.OPTIMIZER_FILE))
    (folder / ck.STATE_FILE).write_text(json.dumps({"step": 1}), encoding="utf-8")


@contextmanager
def _unsynced() -> Iterator[None]:
    """Saving without syncing the files to disk (the checksums still computed)."""
    fsync, sync_dir = ck_files.os.fsync, ck_files.sync_dir
    ck_files.os.fsync = lambda fd: None
    ck_files.sync_dir = lambda folder: None
    try:
        yield
    finally:
        ck_files.os.fsync, ck_files.sync_dir = fsync, sync_dir


_CHECKS = [(ck_load, "verify_files"), (ck_load, "check_digest"), (ck_optimizer, "verify_files")]
"""Where loading calls the SHA-256 checks."""


@contextmanager
def _unchecked() -> Iterator[None]:
    """Loading with the SHA-256 checks switched off."""
    saved = [(m, n, getattr(m, n)) for m, n in _CHECKS]
    for module, name, _ in saved:
        setattr(module, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for module, name, real in saved:
            setattr(module, name, real)


def _saves(root: Path, model: Transformer, opt: torch.optim.Optimizer, tokenizer: Path) -> dict:
    counter = iter(range(10**6))

    def checked() -> None:
        folder = root / f"checked_{next(counter)}"
        ck.save_checkpoint(folder, model, {"step": 1}, tokenizer, opt)
        shutil.rmtree(folder)

    def unsynced() -> None:
        with _unsynced():
            checked()

    def plain() -> None:
        folder = root / f"plain_{next(counter)}"
        _plain_save(folder, model, opt)
        shutil.copyfile(tokenizer, folder / ck.TOKENIZER_FILE)
        shutil.rmtree(folder)

    return {"save_checked": checked, "save_unsynced": unsynced, "save_plain": plain}


def _loads(folder: Path) -> dict[str, Callable[[], object]]:
    state = json.loads((folder / ck.STATE_FILE).read_text(encoding="utf-8"))

    def model() -> object:
        return ck.load_checkpoint(folder)

    def optimizer() -> object:
        return ck.read_optimizer_state(folder, state)

    def unchecked(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with _unchecked():
                return fn()

        return run

    return {
        "load_model_checked": model,
        "load_model_unchecked": unchecked(model),
        "load_optimizer_checked": optimizer,
        "load_optimizer_unchecked": unchecked(optimizer),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Transformer(preset(args.preset)).eval()
    opt = _optimizer(model)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        tokenizer = root / "tokenizer.json"
        tokenizer.write_text(json.dumps({"model": {"vocab": {}}}), encoding="utf-8")
        folder = ck.save_checkpoint(root / "ckpt", model, {"step": 1}, tokenizer, opt)
        sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
        total = sum(sizes.values())
        fns: dict[str, Callable[[], object]] = {
            **_saves(root, model, opt, tokenizer),
            **_loads(folder),
            "sha256_all_files": lambda: [ck_checksums.sha256(p) for p in folder.iterdir()],
        }
        times = {name: spread(t) for name, t in time_interleaved(fns, args.repeats).items()}
    gb = total / 1e9
    data = {
        "command": command_line(),
        "machine": machine(),
        "preset": args.preset,
        "bytes": sizes,
        "seconds": times,
        "sha256_gb_per_s": gb / times["sha256_all_files"]["median"],
    }
    rows = [
        ("save_checkpoint (files synced to disk, SHA-256, SHA256SUMS)", "save_checked"),
        ("save_checkpoint without syncing", "save_unsynced"),
        ("the same files written plainly (no sync, no SHA-256)", "save_plain"),
        ("load_checkpoint (weights checked while the model is built)", "load_model_checked"),
        ("load_checkpoint, unchecked", "load_model_unchecked"),
        ("read_optimizer_state (checked)", "load_optimizer_checked"),
        ("read_optimizer_state, unchecked", "load_optimizer_unchecked"),
        ("SHA-256 of every file", "sha256_all_files"),
    ]
    md = [
        f"# Checkpoint integrity: cost ({args.preset}, {gb:.2f} GB per checkpoint)",
        "",
        f"`{command_line()}` on {data['machine']['cpu']} ({data['machine']['cpu_count']} "
        f"cores); median (min–max) of {args.repeats} rounds, seconds.",
        "",
        "| operation | seconds |",
        "|---|---|",
        *[f"| {label} | {fmt(times[key], digits=2)} |" for label, key in rows],
        "",
        f"SHA-256: {data['sha256_gb_per_s']:.2f} GB/s.",
    ]
    print("\n".join(md))
    write_report("checkpoint_integrity", data, md)


if __name__ == "__main__":
    main()
