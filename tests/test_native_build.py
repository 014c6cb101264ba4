"""aiayn.native_build: one build folder per checkout and source contents; builders take turns,
and a build killed halfway never leaves the next process waiting forever."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from torch.utils import cpp_extension
from torch.utils.file_baton import FileBaton

from aiayn import native_build
from aiayn.native_build import build_name, exclusive_build

posix_only = pytest.mark.skipif(os.name != "posix", reason="the build lock is a POSIX lock")

# A builder that takes the lock, marks its build as PyTorch's builder does, and then waits to be
# killed: argv[1] is the build folder.
_BUILDER = """
import sys, time
from pathlib import Path
from aiayn.native_build import exclusive_build
folder = Path(sys.argv[1])
with exclusive_build(folder):
    (folder / "lock").touch()
    print("building", flush=True)
    time.sleep(120)
"""


def test_build_name_follows_the_checkout_and_the_contents(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"
    for source in (a, b):
        source.parent.mkdir()
        source.write_text("int x;")
    name = build_name("aiayn_k", (a,))
    assert re.fullmatch(r"aiayn_k_[0-9a-f]{12}", name)
    assert build_name("aiayn_k", (a,)) == name  # the same checkout reuses its build
    assert build_name("aiayn_k", (b,)) != name  # another checkout of the same source: its own
    a.write_text("int y;")
    assert build_name("aiayn_k", (a,)) != name  # edited sources: a new build


def _start_builder(folder: Path) -> subprocess.Popen[str]:
    builder = subprocess.Popen(
        [sys.executable, "-c", _BUILDER, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert builder.stdout is not None and builder.stdout.readline().strip() == "building"
    return builder


def _kill(builder: subprocess.Popen[str]) -> None:
    builder.send_signal(signal.SIGKILL)  # no clean-up runs: as a killed job or a lost machine
    builder.wait(timeout=30)


@posix_only
def test_a_build_killed_halfway_does_not_stop_the_next(tmp_path: Path) -> None:
    _kill(_start_builder(tmp_path))
    assert (tmp_path / "lock").exists()  # what PyTorch's builder would wait on forever
    with exclusive_build(tmp_path):
        assert FileBaton(str(tmp_path / "lock")).try_acquire()  # the next build may start


@posix_only
def test_builders_take_turns_and_a_live_build_keeps_its_mark(tmp_path: Path) -> None:
    builder = _start_builder(tmp_path)
    entered = threading.Event()

    def build() -> None:
        with exclusive_build(tmp_path):
            entered.set()

    waiter = threading.Thread(target=build, daemon=True)
    try:
        waiter.start()
        assert not entered.wait(timeout=1.0)  # the live builder holds the folder
        assert (tmp_path / "lock").exists()  # and its mark is left alone
    finally:
        _kill(builder)
    assert entered.wait(timeout=30)  # its end hands the folder on
    waiter.join(timeout=30)


@posix_only
def test_a_lock_that_is_not_a_regular_file_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("not ours")
    (tmp_path / "lock").symlink_to(target)
    with exclusive_build(tmp_path):
        pass
    assert (tmp_path / "lock").is_symlink() and target.read_text() == "not ours"


@posix_only
def test_build_extension_clears_a_stale_mark_in_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "k.cpp"
    source.write_text("int x;")
    root = tmp_path / "extensions"
    folder = root / build_name("aiayn_k", (source,))
    folder.mkdir(parents=True)
    (folder / "lock").touch()  # left by a build that was killed
    seen: list[bool] = []

    def load(name: str, **_: object) -> None:  # PyTorch's builder, as far as the lock goes
        baton = FileBaton(str(root / name / "lock"))
        seen.append(bool(baton.try_acquire()))
        baton.release()

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    monkeypatch.setenv(native_build.SWITCH, "1")
    monkeypatch.setattr(native_build.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpp_extension, "load", load)
    assert native_build.build_extension.__wrapped__("aiayn_k", (source,)) is None
    assert seen == [True]
