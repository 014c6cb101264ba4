"""Where the commands write: checked before any work, written atomically, never clobbered.

Every command that writes files uses this module for its output paths, in two steps:

1. Before any work (loading a model, translating), :func:`check_file`, :func:`check_folder` or
   :func:`check_tree` refuses an output that cannot be written — its folder is read-only or
   missing under a file, the path is a folder where a file goes or the reverse — and one that
   exists, unless ``--force``. ``--force`` replaces only what the command itself writes: a file,
   the files a folder output would hold, or a folder of the kind written (an aiayn checkpoint,
   a Hugging Face folder) or an empty one; never an unrelated folder, which it would delete.
2. The writes go through :func:`atomic_file`, :func:`staged_files` or :func:`staged_tree`: into a
   temporary file or folder beside the target (same file system), moved into place with
   :func:`os.replace` / :func:`os.rename` only when complete. On any error the temporary is
   removed, so are the folders created for the output, and the old output is untouched; a full
   disk or a read-only folder is a :class:`~aiayn.errors.UserError` naming the output.
   A staging folder is named for its process (``.NAME.PID-HOST-RANDOM.tmp``): one that a killed
   process (``kill -9``) left behind is removed by the next staged write into the same folder
   (:func:`sweep_stale_stages`), and nothing else is.

Files are created with mode ``0o666`` less the umask, as :func:`open` creates them (not the
``0o600`` of :func:`tempfile.mkstemp`); a replaced file keeps its permission bits.

What is not a regular file is never replaced (:func:`write_target`). A file output named by a
symbolic link to a regular file replaces that file (atomically; the link stays); one naming a
stream — a character device such as ``/dev/null``, a FIFO, or one of the process's own
descriptors (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``) — is written through in
place, without ``--force`` (nothing stored is replaced) and without a temporary. A block device,
a socket or a dangling link is refused. Among the files a folder output would replace, and for
a folder written as a whole, a symbolic link or a special file is refused even with ``--force``.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path
from typing import IO, Any, NamedTuple, NoReturn

from aiayn.errors import UserError

# errnos of a write that fails because of where it writes, not because of aiayn
_WRITE_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EFBIG,
    errno.EACCES,
    errno.EPERM,
    errno.EIO,
}


def exists(path: Path) -> bool:
    """Whether anything is at ``path``, a dangling symbolic link included."""
    return path.exists() or path.is_symlink()


# -- 1. checks before any work -----------------------------------------------------------------


def given_path(value: str | Path, *, flag: str, what: str) -> Path:
    """``value`` as a path; an empty one, which :class:`~pathlib.Path` would read as ``.`` (the
    current folder, which then "exists"), is refused naming ``flag`` and ``what`` it takes.

    Raises:
        UserError: ``value`` is the empty string.
    """
    if isinstance(value, str) and not value:
        raise UserError(f"{flag} is empty: give {what}")
    return Path(value)


def check_file(path: str | Path, *, force: bool, flag: str) -> Path:
    """Check a file output: not a folder, absent unless ``force``, its folder writable (or
    creatable). Returns the path.

    Raises:
        UserError: naming ``flag`` and the path.
    """
    path = given_path(path, flag=flag, what="a file name")
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder: give a file name")
    target = write_target(path, flag=flag)
    if target.kind != "file":
        return path  # a stream: written through, nothing stored is replaced
    if exists(path) and not force:
        raise UserError(f"{path} exists: pass --force to replace it")
    check_writable(target.path.parent, flag=flag, target=path)
    return path


class WriteTarget(NamedTuple):
    """Where a file output goes: ``kind`` "file" (written to a temporary beside ``path`` and
    renamed over it: the path itself, or the regular file a symbolic link leads to), "stream"
    (a character device or FIFO, opened at ``path`` and written in place) or "descriptor"
    (``fd``, one of the process's own open files)."""

    kind: str
    path: Path
    fd: int | None = None


_OWN_DESCRIPTOR = re.compile(r"/(?:proc/(?:self|(\d+))/fd|dev/fd)/(\d+)")
_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS


def write_target(path: str | Path, *, flag: str = "the output") -> WriteTarget:
    """Where writing the file output ``path`` goes; never a replacement of what is not a
    regular file (see the module's docstring).

    Raises:
        UserError: a block device, socket or other special file; a dangling or looping link.
    """
    path = Path(path)
    fd = _own_descriptor(path)
    if fd is not None:
        return WriteTarget("descriptor", path, fd)
    try:
        mode = os.stat(path).st_mode  # through links
    except (FileNotFoundError, NotADirectoryError):  # a new file (its folder checked apart)
        if path.is_symlink():
            raise UserError(
                f"{flag} {path} is a symbolic link to nothing: name a file, or remove the link"
            ) from None
        return WriteTarget("file", path)
    except OSError as error:
        raise UserError(f"{flag} {path}: {error.strerror}") from None
    if stat.S_ISREG(mode):
        return WriteTarget("file", path.resolve() if path.is_symlink() else path)
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return WriteTarget("stream", path)
    if stat.S_ISDIR(mode):
        raise UserError(f"{flag} {path} is a folder: give a file name")
    raise UserError(
        f"{flag} {path} is a {_kind(mode)}: aiayn writes regular files, FIFOs and character "
        "devices only"
    )


def _own_descriptor(path: Path) -> int | None:
    """The descriptor number when ``path`` (or a link it goes through) names one of this
    process's open files (``/dev/stdout`` -> ``/proc/self/fd/1``), else None."""
    current = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        match = _OWN_DESCRIPTOR.fullmatch(current)
        if match is not None and match.group(1) in (None, str(os.getpid())):
            return int(match.group(2))
        if not os.path.islink(current):
            return None
        link = os.readlink(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), link))
    return None


def _kind(mode: int) -> str:
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def check_folder(
    path: str | Path,
    *,
    force: bool,
    flag: str,
    names: Iterable[str] = (),
    patterns: Iterable[str] = (),
) -> Path:
    """Check a folder that receives files: not a file, writable (or creatable), and holding none
    of the files the command writes (``names``, or names matching the glob ``patterns``) unless
    ``force``. Other files in it are left alone. Returns the path.

    Raises:
        UserError: naming ``flag``, the path and the files in the way.
    """
    path = given_path(path, flag=flag, what="a folder")
    if exists(path) and not path.is_dir():
        raise UserError(f"{flag} {path} exists and is not a folder")
    check_writable(path, flag=flag, target=path)
    if not path.is_dir():
        return path
    names, patterns = set(names), tuple(patterns)
    clash = sorted(
        p.name
        for p in path.iterdir()
        if p.name in names or any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)
    )
    if clash and not force:
        raise UserError(
            f"{flag} {path} already holds {_some(clash)}: pass --force to replace them, or "
            "choose another folder"
        )
    for name in clash:
        entry = path / name
        if entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
            raise UserError(
                f"{flag} {entry} is {'a symbolic link' if entry.is_symlink() else 'a special file'}"
                ": --force replaces only regular files; remove it, or choose another folder"
            )
        if entry.is_dir():
            raise UserError(f"{flag} {entry} is a folder where a file goes: remove it")
    return path


def check_tree(
    path: str | Path,
    *,
    force: bool,
    flag: str,
    what: str,
    is_what: Callable[[Path], bool],
    reserved: str | None = None,
) -> Path:
    """Check a folder written as a whole (a checkpoint, a Hugging Face folder): absent, or with
    ``force`` a folder that ``is_what`` accepts or an empty one — never another folder or a file,
    which replacing would delete. ``reserved``: a reason to refuse ``path`` without ``force`` even
    when it does not exist yet. Returns the path.

    Raises:
        UserError: naming ``flag``, the path and ``what`` it would have to be.
    """
    path = given_path(path, flag=flag, what="a folder")
    if reserved is not None and not force:
        raise UserError(f"{flag} {path}: {reserved}: choose another folder, or pass --force")
    if exists(path):
        if not force:
            raise UserError(f"{path} exists: pass --force to replace it")
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            kind = "a symbolic link" if path.is_symlink() else "not a folder"
            raise UserError(
                f"{flag} {path} is {kind}: --force replaces only {what} (a folder) or an empty "
                "folder; name the folder itself"
            )
        if not path.is_dir():
            raise UserError(f"{flag} {path} is a file, not {what}: --force replaces only {what}")
        if any(path.iterdir()) and not is_what(path):
            raise UserError(
                f"{flag} {path} is a folder that is not {what}: --force replaces only {what} "
                "or an empty folder; choose another folder"
            )
    check_writable(path.parent, flag=flag, target=path)
    return path


TRAINING_NAMES = ("step_*", "best", "averaged")
"""The names training gives the folders in a run's ``checkpoints/``."""


def check_checkpoint_out(path: str | Path, *, force: bool, flag: str) -> Path:
    """:func:`check_tree` for an aiayn checkpoint folder: ``force`` replaces only a checkpoint
    (a folder with ``state.json``) or an empty folder, and a name training writes in a run's
    ``checkpoints/`` (``step_*``, ``best``, ``averaged``) needs ``force`` even when free — resume
    and pruning would take the folder for training's own."""
    from aiayn.checkpoint import STATE_FILE

    path = given_path(path, flag=flag, what="a folder for the checkpoint")
    reserved = None
    if path.parent.name == "checkpoints" and any(
        fnmatch.fnmatchcase(path.name, pattern) for pattern in TRAINING_NAMES
    ):
        reserved = (
            f"{path.name} is a name training gives its own checkpoints in a run's "
            "checkpoints/ folder (resume and pruning would take it for one)"
        )
    return check_tree(
        path,
        force=force,
        flag=flag,
        what="an aiayn checkpoint",
        is_what=lambda folder: (folder / STATE_FILE).is_file(),
        reserved=reserved,
    )


def check_writable(folder: Path, *, flag: str, target: Path) -> None:
    """``folder`` is a writable folder, or can be created (its nearest existing ancestor is a
    writable folder).

    Raises:
        UserError: naming ``flag``, ``target`` and the folder in the way.
    """
    ancestor = Path(folder)
    while not exists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{flag} {target}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {target}: cannot write in {ancestor} ({_why_not(ancestor)})")


def _why_not(folder: Path) -> str:
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "read-only file system" if read_only else "permission denied"


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


# -- 2. atomic writes ----------------------------------------------------------------------------


@contextmanager
def atomic_file(
    path: str | Path, mode: str = "w", *, encoding: str | None = "utf-8", newline: str | None = None
) -> Iterator[IO[Any]]:
    """An open file whose contents replace ``path`` only when the ``with`` block completes.

    The data go to a hidden temporary file in the same folder (created with the umask's mode,
    synced to disk), renamed over ``path`` at the end; on any error it is removed and ``path``
    keeps its old contents. ``mode``: ``"w"`` (text) or ``"wb"``.

    Raises:
        UserError: the disk is full, the folder is read-only… (naming ``path``).
    """
    path = Path(path)
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    target = write_target(path)
    if target.kind != "file":
        with _written_through(target, mode, encoding=encoding, newline=newline) as handle:
            yield handle
        return
    user_path, path = path, target.path  # a link to a regular file: that file is replaced
    created = _make_folders(path.parent, path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        binary = mode == "wb"
        with os.fdopen(
            fd, mode, encoding=None if binary else encoding, newline=None if binary else newline
        ) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        _keep_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException as error:
        _remove(tmp)
        _raise_failed(error, created, user_path, tmp)


@contextmanager
def _written_through(
    target: WriteTarget, mode: str, *, encoding: str | None, newline: str | None
) -> Iterator[IO[Any]]:
    """An open file writing in place to a stream (:func:`write_target`): no temporary, no
    rename, no sync; a write the device refuses (``/dev/full``) names the output."""
    binary = mode == "wb"
    try:
        if target.fd is not None:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # what was printed before comes first
            fd = os.dup(target.fd)
        else:
            fd = os.open(target.path, os.O_WRONLY)
        with os.fdopen(
            fd, mode, encoding=None if binary else encoding, newline=None if binary else newline
        ) as handle:
            yield handle
    except OSError as error:
        named = None if error.filename is None else Path(os.fsdecode(error.filename))
        ours = error.errno in _WRITE_ERRNOS if named is None else named == target.path
        if not ours or isinstance(error, BrokenPipeError):
            raise  # the writer's own error, or a closed pipe (the caller ends quietly)
        raise UserError(f"cannot write {target.path}: {error.strerror or error}") from None


def write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically (:func:`atomic_file`); returns ``path``."""
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)


@contextmanager
def staged_files(folder: str | Path) -> Iterator[Path]:
    """A temporary folder inside ``folder`` (created) to write files into; when the ``with``
    block completes, each file is synced and moved into ``folder`` with :func:`os.replace`.

    On any error the temporary folder and the folders created for ``folder`` are removed and
    ``folder`` is as it was.

    Raises:
        UserError: the disk is full, the folder is read-only… (naming ``folder``).
    """
    folder = Path(folder)
    created = _make_folders(folder, folder)
    sweep_stale_stages(folder)
    stage = folder
    try:
        stage = make_stage(folder, "aiayn")
        yield stage
        entries = sorted(stage.iterdir())
        for entry in entries:
            _sync(entry)
        for entry in entries:
            os.replace(entry, folder / entry.name)
        stage.rmdir()
    except BaseException as error:
        if stage != folder:
            shutil.rmtree(stage, ignore_errors=True)
        _raise_failed(error, created, folder, stage)


@contextmanager
def staged_tree(path: str | Path) -> Iterator[Path]:
    """A path to write the folder ``path`` into as a whole, inside a temporary folder beside it;
    when the ``with`` block completes it is renamed to ``path``, replacing an old folder there
    (checked by :func:`check_tree`), which is deleted only then.

    On any error the temporary folder is removed and ``path`` is as it was.

    Raises:
        UserError: the disk is full, the folder is read-only… (naming ``path``).
    """
    path = Path(path)
    created = _make_folders(path.parent, path)
    sweep_stale_stages(path.parent)
    stage = path.parent
    try:
        stage = make_stage(path.parent, path.name)
        new = stage / path.name
        yield new
        if not new.is_dir():
            raise RuntimeError(f"nothing was written to {new}")
        if exists(path):
            old = stage / ".replaced"
            os.rename(path, old)
            try:
                os.rename(new, path)
            except BaseException:
                os.rename(old, path)
                raise
        else:
            os.rename(new, path)
        shutil.rmtree(stage, ignore_errors=True)
    except BaseException as error:
        if stage != path.parent:
            shutil.rmtree(stage, ignore_errors=True)
        _raise_failed(error, created, path, stage)


STALE_STAGE_SECONDS = 24 * 3600
"""A staging folder untouched this long is stale whoever made it (a process on another machine
sharing the folder, or a pid since reused): no write takes a day."""

_STAGE = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]+)-(?P<host>[0-9a-f]{6})-[0-9a-f]{8}\.tmp")
"""The name of a staging folder (:func:`make_stage`): ``.NAME.PID-HOST-RANDOM.tmp``."""


@cache
def _host() -> str:
    """This machine, in six hex digits (a staging folder's owner is a pid on a machine)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def make_stage(parent: Path, name: str) -> Path:
    """A new, empty staging folder for ``name`` in ``parent`` (mode 0o700), named for this
    process: ``.NAME.PID-HOST-RANDOM.tmp``, so that :func:`sweep_stale_stages` can tell whether
    the process that made it is gone."""
    while True:
        stage = parent / f".{name}.{os.getpid()}-{_host()}-{secrets.token_hex(4)}.tmp"
        try:
            stage.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return stage


def sweep_stale_stages(parent: Path, *, now: float | None = None) -> list[Path]:
    """Remove the staging folders in ``parent`` that a killed process left: folders (not links)
    named as :func:`make_stage` names them, owned by this user, whose process on this machine is
    gone or which nobody touched for :data:`STALE_STAGE_SECONDS`. Nothing else is touched, and a
    folder that cannot be read or removed is left as it is. Returns the folders removed."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = _STAGE.fullmatch(entry.name)
        try:
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            continue  # another user's
        if now - info.st_mtime > STALE_STAGE_SECONDS or _owner_gone(match):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _owner_gone(stage: re.Match[str]) -> bool:
    """Whether the process that made the staging folder named ``stage`` is known to be gone: it
    was made on this machine and its pid runs no process (never this process's own)."""
    pid = int(stage["pid"])
    if stage["host"] != _host() or pid == os.getpid() or pid <= 0 or sys.platform == "win32":
        return False  # another machine's, ours, or no safe probe (os.kill ends it on Windows)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it runs, as another user
        return False
    return False


def _make_folders(folder: Path, target: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those created, deepest first."""
    missing = []
    while not exists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for index, item in enumerate(reversed(missing)):
        try:
            item.mkdir(exist_ok=True)
        except OSError as error:
            _remove_empty(missing[len(missing) - index :])
            what = item if item == target else f"{item} for {target}"
            raise UserError(f"cannot create {what}: {error.strerror}") from None
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:
            return


def _remove(path: Path) -> None:
    with suppress(OSError):  # absent, or on a file system that refuses even this
        path.unlink()


def _keep_mode(path: Path, tmp: Path) -> None:
    """Give a replacing file the permission bits of the file it replaces."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    os.chmod(tmp, mode)


def _sync(path: Path) -> None:
    if path.is_file():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _raise_failed(
    error: BaseException, created: list[Path], target: Path, temporary: Path
) -> NoReturn:
    """After a failed write whose temporary is gone: the folders it created removed (deepest
    first), then ``error`` raised again, as :func:`_write_error`'s :class:`UserError` where it
    is one."""
    _remove_empty(created)
    converted = _write_error(error, target, temporary)
    if converted is None:
        raise error
    raise converted from None


def _write_error(error: BaseException, target: Path, temporary: Path) -> UserError | None:
    """A :class:`UserError` naming ``target`` for a write that the file system refused: any
    :class:`OSError` on the temporary file or folder, or one naming no file whose errno says
    full, read-only or no permission; else None (the error stays as it is)."""
    if not isinstance(error, OSError):
        return None
    if error.filename is None:
        ours = error.errno in _WRITE_ERRNOS
    else:
        ours = Path(os.fsdecode(error.filename)).is_relative_to(temporary)
    return UserError(f"cannot write {target}: {error.strerror or error}") if ours else None


def silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
