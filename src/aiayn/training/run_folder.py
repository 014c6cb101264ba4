"""A run folder belongs to one run: what the trainer checks before it writes into ``run_dir``.

* A fresh run refuses a folder that already holds a run's files (:data:`RUN_FILES`), unless
  told to delete them first (``aiayn train --force``): two runs never mix their tokenizer,
  checkpoints and metrics.
* ``--resume`` refuses a run config that differs from the one the folder's newest checkpoint
  was trained with (its ``state.json`` ``run_config``) in anything but the options of
  :data:`RESUMABLE`, naming every difference.
* A resumed run drops the ``metrics.jsonl`` entries written after its checkpoint (atomically)
  before it appends, so that no step is recorded twice.
* One run at a time: a run holds an OS lock (``flock``; on Windows, where there is no
  :mod:`fcntl`, a byte-range lock through :mod:`msvcrt`) on ``run_dir/run.lock`` for its whole
  life (:func:`hold_run_folder`, rank 0 under torchrun), taken before the folder is checked or
  written; a second run is refused naming the holder's pid. The lock dies with its process, so
  a crashed run leaves no stale lock. A run that fails before its first checkpoint removes what
  it created (its files, the lock file, the folders it made).

docs/reliability.md states these rules and names the tests that prove them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from aiayn.checkpoint import STATE_FILE, list_checkpoints
from aiayn.checkpoint.files import read_small
from aiayn.errors import UserError
from aiayn.limits import MAX_CHECKPOINT_JSON_BYTES
from aiayn.training.config import RunConfig, run_config_from_dict

try:
    import fcntl
except ImportError:  # Windows: the run's lock goes through msvcrt (_try_lock)
    fcntl = None  # type: ignore[assignment]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer")
"""Where a run keeps its tokenizer: aiayn's own file, or the subfolder of a converted model's
tokenizer files (a fine-tuned Marian or T5: :mod:`aiayn.training.translation_start`)."""

RUN_FILES = ("checkpoints", *TOKENIZER_FILES, "metrics.jsonl", "curves.png", "test.hyp.txt")
"""What a training run writes into its ``run_dir`` (``--force`` deletes these, nothing else)."""

METRICS_FILE = "metrics.jsonl"

LOCK_FILE = "run.lock"
"""The file a running run holds its lock on (it records the holder's pid; not a run file)."""

RESUMABLE = frozenset(
    {
        "run_dir",  # the folder may have moved
        # how long: a resume that trains further
        "train.max_steps",
        "train.max_epochs",
        "train.max_minutes",
        # bookkeeping: what is logged, validated and kept, not what is learnt
        "train.log_every",
        "train.eval_every",
        "train.save_every",
        "train.keep_last",
        "train.average_last",
        "train.average_window",
        # where and how fast it runs, not what it computes
        "train.device",
        "train.precision",
        "train.threads",
        "train.progress",
        "train.distributed",
        "train.compile",
        "train.keep_freed_memory",
        # the remedies after a run stopped on non-finite steps
        "train.max_bad_steps",
        "train.lr_scale",
        "train.clip_norm",
    }
)
"""The run-config keys ``--resume`` may change; any other difference is refused."""


def run_files(run_dir: Path) -> list[str]:
    """The :data:`RUN_FILES` present in ``run_dir`` (``checkpoints`` when not empty)."""
    found = []
    for name in RUN_FILES:
        path = run_dir / name
        if (path.is_dir() and any(path.iterdir())) or path.is_file():
            found.append(name)
    return found


def claim_fresh(run_dir: Path, *, force: bool, is_main: bool, log: Callable[[str], None]) -> None:
    """Make ``run_dir`` ready for a new run: refuse another run's files, or (``force``) delete
    them first (on rank 0, ``is_main``: the other ranks only wait for it)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run_dir {run_dir} exists and is not a folder")
    found = run_files(run_dir) if run_dir.is_dir() else []
    if not found:
        return
    if not force:
        raise UserError(
            f"{run_dir} already holds a run ({', '.join(found)}): pass --resume to continue "
            "it, --force to delete it and start over, or choose another run_dir"
        )
    if is_main:
        for name in found:
            path = run_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        log(f"--force: deleted the previous run's {', '.join(found)} from {run_dir}")


def check_resume(run_dir: Path, run: RunConfig) -> None:
    """Refuse to resume the run in ``run_dir`` with ``run`` if their configs differ in anything
    but :data:`RESUMABLE` (compared with the newest checkpoint whose state can be read)."""
    saved = _saved_run_config(run_dir)
    if saved is None:
        return
    name, values = saved
    changes = config_changes(values, run)
    if changes:
        raise UserError(
            f"cannot resume the run in {run_dir}: its config differs from the one {name} was "
            f"trained with: {'; '.join(changes)} (a resume may change only "
            f"{', '.join(sorted(RESUMABLE))}); to train with this config, choose another "
            "run_dir, or pass --force instead of --resume to delete this run and start over"
        )


def config_changes(saved: Mapping[str, Any], run: RunConfig) -> list[str]:
    """``"key: old -> new"`` for each key outside :data:`RESUMABLE` in which ``run`` differs
    from ``saved`` (a :meth:`RunConfig.to_dict`), compared field by field (the model's fields
    in full, however its preset is spelt)."""
    new = flat_run_config(run)
    try:
        old = flat_run_config(run_config_from_dict(saved))
    except UserError:  # a key this version no longer reads: compare what both still name
        old = {f"{s}.{k}": v for s in ("data", "train") for k, v in (saved.get(s) or {}).items()}
    keys = sorted(k for k in old.keys() & new.keys() if k not in RESUMABLE and old[k] != new[k])
    return [f"{key}: {_show(old[key])} -> {_show(new[key])}" for key in keys]


def flat_run_config(run: RunConfig) -> dict[str, Any]:
    """``run`` as one flat mapping ``section.key -> value`` (``run_dir`` alone)."""
    sections = run.to_dict()
    flat: dict[str, Any] = {
        "run_dir": run.run_dir,
        "model.family": run.family,
        "model.init_from": run.init_from,
    }
    flat.update((f"model.{k}", v) for k, v in run.model.to_dict().items())
    for name in ("data", "train"):
        flat.update((f"{name}.{k}", v) for k, v in sections[name].items())
    return flat


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, tuple)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _saved_run_config(run_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """(name, run config) of the newest checkpoint whose ``state.json`` can be read."""
    for path in reversed(list_checkpoints(run_dir)):
        try:  # a regular file only (never a FIFO that would hang), of bounded size
            state = json.loads(read_small(path / STATE_FILE, MAX_CHECKPOINT_JSON_BYTES))
        except (UserError, ValueError):
            continue  # unreadable: the checkpoint loader reports it (or falls back)
        if isinstance(state, dict) and isinstance(state.get("run_config"), dict):
            return path.name, state["run_config"]
    return None


def resume_metrics(run_dir: Path, step: int, *, validated: bool) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` entries a run resumed at ``step`` keeps, the file rewritten
    atomically without the others (those written after the checkpoint, and a last line cut
    short by a crash).

    Kept: every entry of an earlier step, and of ``step`` itself the ones written before its
    checkpoint: ``train`` and (``validated``: the checkpoint holds validation metrics)
    ``valid``. The end of a run (``valid_averaged``, ``test``) comes after its last checkpoint,
    and the resumed run writes its own.
    """
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [e for e in map(_entry, lines) if e is not None and _before(e, step, validated)]
    if len(kept) < len(lines):
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(e) + "\n" for e in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return kept


def _entry(line: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _before(entry: dict[str, Any], step: int, validated: bool) -> bool:
    """The entry was written before the checkpoint of ``step``."""
    at, kind = entry.get("step"), entry.get("kind")
    if not isinstance(at, int) or at > step:
        return False
    return at < step or kind == "train" or (validated and kind == "valid")


@contextmanager
def hold_run_folder(run_dir: Path, *, is_main: bool) -> Iterator[None]:
    """Hold ``run_dir`` for one run while the block runs (``is_main``: rank 0; the other ranks
    of a torchrun job take nothing): the missing folders are made, the lock is taken (another
    run holding it is a :class:`UserError` naming its pid), and released at the end, the lock
    file removed. If the block fails before the folder holds a checkpoint, what it created is
    removed: the run's files that were not there before, then the folders made here (when
    empty). Nothing that was there before is touched."""
    if not is_main:
        yield
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run_dir {run_dir} exists and is not a folder")
    made = _make_folders(run_dir)
    try:
        fd = _take_lock(run_dir)
    except BaseException:
        _remove_empty(made)
        raise
    before = _identities(run_dir)
    failed = True
    try:
        yield
        failed = False
    finally:
        if failed and not _holds_checkpoint(run_dir):
            _remove_created(run_dir, before)
        _release_lock(run_dir, fd)
        if failed:
            _remove_empty(made)


def _holds_checkpoint(run_dir: Path) -> bool:
    """``run_dir/checkpoints`` holds a checkpoint (a step's, ``best``…: a folder that is not a
    half-written ``.tmp``)."""
    root = run_dir / "checkpoints"
    with suppress(OSError):
        return any(p.is_dir() and not p.name.endswith(".tmp") for p in root.iterdir())
    return False


def _make_folders(run_dir: Path) -> list[Path]:
    """Create ``run_dir`` and its missing parents; the ones created, innermost first."""
    missing = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (innermost first) that is empty; stop at the first that is
    not (another process may have put something there)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _take_lock(run_dir: Path) -> int:
    """Lock ``run_dir/run.lock`` (created if missing) and write this process's pid into it; the
    descriptor holds the lock. A file the holder removed meanwhile is opened again."""
    if fcntl is None and sys.platform != "win32":
        raise UserError(
            f"aiayn train cannot lock its run folder on {sys.platform}: it needs fcntl (POSIX) "
            "or msvcrt (Windows), and this Python has neither"
        )
    path = run_dir / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT
    for name in ("O_NOFOLLOW", "O_NONBLOCK", "O_CLOEXEC"):  # POSIX's; Windows has none of them
        flags |= getattr(os, name, 0)
    while True:
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as error:
            raise UserError(f"{path}: cannot take the run's lock ({error.strerror})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UserError(f"{path} is in the way of the run's lock: it is not a regular file")
        if not _try_lock(fd):
            holder = _holder(fd)
            os.close(fd)
            raise UserError(
                f"{run_dir} is in use by another aiayn train ({holder}, which holds {path}): "
                "two runs never share a run folder; wait for it to end, stop it, or choose "
                "another run_dir"
            ) from None
        with suppress(FileNotFoundError):
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # the holder removed the file as it ended: lock the new one
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    return fd


_MSVCRT_LOCK_OFFSET = 1024
"""Where the Windows lock's one byte lies: past the pid, which other runs read (Windows' locks
bar reading the locked bytes)."""


def _try_lock(fd: int) -> bool:
    """Take the run's exclusive lock on ``fd`` without waiting: True when taken, False when
    another process holds it. The lock dies with its process: POSIX ``flock`` or, on Windows
    (no :mod:`fcntl`), a byte-range lock (:func:`msvcrt.locking`)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    assert sys.platform == "win32", sys.platform  # _take_lock refused the others
    import msvcrt  # Windows' lock, imported where it exists: this branch runs there only

    os.lseek(fd, _MSVCRT_LOCK_OFFSET, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def _holder(fd: int) -> str:
    """``pid N`` of the lock's holder, as it wrote it (waiting briefly for a holder that has
    just taken the lock to write it)."""
    for _ in range(50):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
        if text.isdigit():
            return f"pid {text}"
        time.sleep(0.02)
    return "pid unknown"


def _release_lock(run_dir: Path, fd: int) -> None:
    """Remove the lock file (still holding the lock, so no other run can have taken it), then
    release the lock."""
    with suppress(OSError):
        path = run_dir / LOCK_FILE
        if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    os.close(fd)


def _identities(run_dir: Path) -> dict[str, tuple[int, ...]]:
    """Which of :data:`RUN_FILES` are in ``run_dir`` now, and how to recognise each (a folder
    by its inode, a file by its inode, size and time of change)."""
    found: dict[str, tuple[int, ...]] = {}
    for name in RUN_FILES:
        with suppress(OSError):
            s = os.stat(run_dir / name, follow_symlinks=False)
            found[name] = (
                (s.st_ino,) if stat.S_ISDIR(s.st_mode) else (s.st_ino, s.st_size, s.st_mtime_ns)
            )
    return found


def _remove_created(run_dir: Path, before: dict[str, tuple[int, ...]]) -> None:
    """Remove the :data:`RUN_FILES` of ``run_dir`` that are not those ``before`` found."""
    after = _identities(run_dir)
    for name, identity in after.items():
        if before.get(name) == identity:
            continue
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with suppress(OSError):
                path.unlink()
