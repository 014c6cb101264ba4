"""``aiayn.training.run_folder`` where :mod:`fcntl` is missing (Windows): the module imports,
the run's lock goes through :func:`msvcrt.locking` where that is (a stand-in here, recording
what it is asked), and a platform with neither lock is refused by name."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

import aiayn.training
import aiayn.training.run_folder as run_folder
from aiayn.errors import UserError


def _imported_without_fcntl(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh import of run_folder while ``import fcntl`` fails (the original is put back
    afterwards, in ``sys.modules`` and on its package)."""
    monkeypatch.setitem(sys.modules, "fcntl", None)  # None in sys.modules: ImportError
    monkeypatch.delitem(sys.modules, run_folder.__name__)
    monkeypatch.setattr(aiayn.training, "run_folder", run_folder)
    module = importlib.import_module(run_folder.__name__)
    assert module is not run_folder
    assert module.fcntl is None
    return module


class _Msvcrt(SimpleNamespace):
    """Windows' msvcrt as the lock uses it: a non-blocking one-byte lock that fails while
    another descriptor of the file holds it."""

    LK_NBLCK = 2

    def __init__(self, offset: int) -> None:
        super().__init__(held=set(), offset=offset)

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        assert (mode, nbytes) == (self.LK_NBLCK, 1)
        assert os.lseek(fd, 0, os.SEEK_CUR) == self.offset  # past the pid others read
        inode = os.fstat(fd).st_ino
        if inode in self.held:
            raise PermissionError(13, "Permission denied")
        self.held.add(inode)


def test_without_fcntl_it_imports_and_locks_through_msvcrt_on_windows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = _imported_without_fcntl(monkeypatch)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setitem(sys.modules, "msvcrt", _Msvcrt(module._MSVCRT_LOCK_OFFSET))
    fd = module._take_lock(tmp_path)
    lock = tmp_path / module.LOCK_FILE
    assert lock.read_text(encoding="ascii") == f"{os.getpid()}\n"
    with pytest.raises(UserError, match=rf"in use by another aiayn train \(pid {os.getpid()},"):
        module._take_lock(tmp_path)
    module._release_lock(tmp_path, fd)
    assert not lock.exists()


def test_without_fcntl_or_msvcrt_the_lock_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = _imported_without_fcntl(monkeypatch)
    monkeypatch.setattr(sys, "platform", "plan9")
    with pytest.raises(UserError, match=r"cannot lock its run folder on plan9: it needs fcntl"):
        module._take_lock(tmp_path)
    assert not (tmp_path / module.LOCK_FILE).exists()  # refused before anything was opened


def test_with_fcntl_the_module_uses_it() -> None:
    assert run_folder.fcntl is not None and run_folder.fcntl.flock is not None
