"""A checkpoint's file names and writing its folder atomically: the ``NAME.tmp`` folder renamed
into place, the ``NAME.old`` that stands aside meanwhile, recovery after a crash, file modes
from the user's umask, and one-line reasons for I/O errors.

Writing and replacing: the files go into ``NAME.tmp`` (each synced to disk), ``SHA256SUMS``
last, then ``NAME.tmp`` is renamed to ``NAME`` (:func:`commit`). A ``NAME`` that already exists
(``best``, ``averaged``, a re-saved step) first steps aside as ``NAME.old``, is deleted once the
new ``NAME`` is in place, and stands in for ``NAME`` while ``NAME`` is missing: readers take it
then, and the next save of ``NAME`` puts it back (:func:`recover`). So a crash at any point
leaves a complete ``NAME`` or ``NAME.old``; a leftover ``NAME.tmp`` is never read and is deleted
next time.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from contextlib import suppress
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from aiayn.errors import UserError

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
CHECKSUM_FILE = "SHA256SUMS"

ADDED_FILES = ("tuned_alpha.json",)
"""Files a command adds to a checkpoint after it was written (``aiayn tune-alpha``'s result):
not in its manifest, and allowed unlisted in ``SHA256SUMS`` (older versions did not list them);
their reader checks them."""

TMP, OLD, CORRUPT = ".tmp", ".old", ".corrupt"
"""Suffixes of a checkpoint being written, one standing aside while it is replaced, and one that
``--resume`` found unusable and set aside."""

_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class CheckpointError(UserError):
    """A checkpoint file is missing, unreadable, corrupt (its SHA-256 differs from the recorded
    one) or does not fit the model: the checkpoint is unusable. ``--resume`` falls back to an
    older checkpoint on this error only."""


def regular_file(file: Path) -> os.stat_result:
    """``file``'s status, when it is a regular file itself: not a symbolic link (which could
    lead out of the checkpoint), a FIFO (whose reading would wait forever) or a device (such as
    ``/dev/zero``, endless). Checked with ``lstat``, before the file is opened.

    Raises:
        CheckpointError: ``file`` is missing or not a regular file, naming it.
    """
    try:
        status = os.lstat(file)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing from the checkpoint") from None
    except OSError as error:
        raise CheckpointError(f"{file}: cannot read it ({reason(error)})") from None
    if not stat.S_ISREG(status.st_mode):
        raise CheckpointError(
            f"{file}: {_kind(status.st_mode)}, not a regular file: aiayn "
            "reads only regular files inside a checkpoint folder"
        )
    return status


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a device or socket"


def open_regular(file: Path) -> int:
    """A read-only descriptor of ``file``, a regular file (:func:`regular_file`): opened without
    following a link and without waiting (``O_NOFOLLOW | O_NONBLOCK``), and checked again once
    open, so that a file swapped meanwhile is refused as well."""
    regular_file(file)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(file, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise CheckpointError(f"{file}: cannot read it ({reason(error)})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{file}: not a regular file")
    return fd


def read_small(file: Path, limit: int) -> bytes:
    """The bytes of ``file``, a regular file of at most ``limit`` bytes (``state.json``,
    ``SHA256SUMS``).

    Raises:
        CheckpointError: missing, not a regular file, unreadable or larger than ``limit``.
    """
    fd = open_regular(file)
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as error:
            raise CheckpointError(f"{file}: cannot read it ({reason(error)})") from None
    if len(data) > limit:
        raise CheckpointError(f"{file}: larger than {limit:,} bytes, more than aiayn writes")
    return data


def save_safetensors(
    tensors: dict[str, torch.Tensor], file: Path, metadata: dict[str, str] | None = None
) -> None:
    """``safetensors.torch.save_file``, leaving the file with the mode the user's umask gives
    (safetensors writes a private temporary file, mode 0600, and renames it into place)."""
    save_file(tensors, str(file), metadata=metadata)
    os.chmod(file, umask_mode())


def read_safetensors(file: Path, what: str) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint's safetensors ``file`` (``what`` it holds, for messages).

    Raises:
        CheckpointError: the file is missing or not a complete safetensors file, naming it.
    """
    regular_file(file)
    try:
        return load_file(str(file))
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing from the checkpoint") from None
    except (OSError, SafetensorError) as error:
        raise CheckpointError(
            f"{file}: cannot read the {what}: not a complete safetensors file ({reason(error)})"
        ) from None


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` less the process's umask: the mode :func:`open` gives a new file.

    Read from ``/proc/self/status`` on Linux; elsewhere by setting the umask and back (to the
    strictest value meanwhile, so that another thread's new file is never more open).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return mode & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return mode & ~umask


def commit(tmp: Path, path: Path) -> None:
    """Rename the complete ``tmp`` to ``path``. An existing ``path`` steps aside as
    ``path.old`` first and is deleted once the new one is in place (and on disk). Once ``tmp``
    is ``path`` the save has succeeded: what fails after that leaves a leftover at most."""
    sync_dir(tmp)
    old = beside(path, OLD)
    replacing = path.exists()
    if replacing:
        os.rename(path, old)  # from here until the next rename, readers take path.old
    try:
        os.rename(tmp, path)
    except OSError:
        if replacing:
            os.rename(old, path)
        raise
    with suppress(OSError):
        sync_dir(path.parent)
    if replacing:
        shutil.rmtree(old, ignore_errors=True)  # a leftover is deleted by the next save


def recover(path: Path) -> None:
    """Undo what a crash while writing ``path`` left: ``path.old`` back to ``path`` if
    ``path`` is missing (it is the last complete version), else deleted; ``path.tmp`` deleted.
    A folder there that is not a checkpoint's is refused, never deleted."""
    old, tmp = beside(path, OLD), beside(path, TMP)
    if old.exists():
        _refuse_foreign(old)
        if path.exists():
            shutil.rmtree(old)
        else:
            os.rename(old, path)
    if tmp.exists():
        _refuse_foreign(tmp)
        shutil.rmtree(tmp)


def _refuse_foreign(folder: Path) -> None:
    """``folder`` (a ``NAME.tmp`` or ``NAME.old``) must be one aiayn wrote: a folder of files,
    empty or holding weights."""
    entries = list(folder.iterdir()) if folder.is_dir() else None
    if (
        entries is None
        or any(not e.is_file() for e in entries)
        or (entries and not (folder / MODEL_FILE).is_file())
    ):
        raise UserError(f"{folder} is in the way and is not an aiayn checkpoint: move it away")


def beside(path: Path, suffix: str) -> Path:
    """``path`` with ``suffix`` added to its name (``best`` -> ``best.old``)."""
    return path.with_name(path.name + suffix)


def sync_dir(folder: Path) -> None:
    """Make renames and new entries in ``folder`` durable (POSIX; Windows has no such call)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def reason(error: OSError | SafetensorError) -> str:
    """What went wrong, in words: the system's message for an ``OSError`` or for the
    ``os error N`` safetensors reports (``No space left on device``), else the first line."""
    if isinstance(error, OSError) and error.strerror:
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror}{where}"
    text = str(error).strip()
    code = _OS_ERROR.search(text)
    if code is not None:
        return os.strerror(int(code[1]))
    return text.splitlines()[0] if text else type(error).__name__
