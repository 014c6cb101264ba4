"""aiayn.kernels.build: one build folder per checkout and source contents; builders take turns,
and a build killed halfway never leaves the next process waiting forever; a library is loaded
only with the digest of a successful build; a build is bounded in time, keeps the compiler's
output to itself and says in one line why it failed; nothing is built where nothing can run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torch.utils.file_baton import FileBaton

from aiayn.kernels import build as native_build
from aiayn.kernels import cpu
from aiayn.kernels.build import build_name, exclusive_build
from aiayn.settings import performance_settings

posix_only = pytest.mark.skipif(os.name != "posix", reason="the build lock is a POSIX lock")

# A builder that takes the lock, marks its build as PyTorch's builder does, and then waits to be
# killed: argv[1] is the build folder.
_BUILDER = """
import sys, time
from pathlib import Path
from aiayn.kernels.build import exclusive_build
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


TINY = 'extern "C" int aiayn_tiny_kernel() { return 7; }\n'
"""A source that builds in about a second (no PyTorch headers) and loads as a library."""


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A tiny source and its build root (``TORCH_EXTENSIONS_DIR``), with the kernels allowed."""
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY)
    root = tmp_path / "extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    monkeypatch.setenv(native_build.SWITCH, "1")
    monkeypatch.setattr(native_build.platform, "machine", lambda: "x86_64")
    return source, root


def _library(root: Path, source: Path) -> Path:
    name = build_name("aiayn_tiny", (source,))
    return root / name / f"{name}.so"


def _build(source: Path) -> str | None:
    """A fresh build of ``source`` (not the process's cached result), loaded: None, or why not."""
    return native_build._build_and_load.__wrapped__("aiayn_tiny", (source,))


needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler here")


@posix_only
@needs_compiler
def test_a_build_is_trusted_by_its_digest_and_a_cut_library_is_built_again(
    tiny: tuple[Path, Path],
) -> None:
    """A library cut short (a full disk, a copy stopped halfway) is never loaded: its digest
    does not match, so it is built again, and the digest written after that build matches."""
    source, root = tiny
    library = native_build.ensure_built("aiayn_tiny", (source,))  # not loaded here: this test
    assert library == _library(root, source)  # cuts it, which a process that mapped it dies of
    assert native_build.trusted(library)
    whole = library.read_bytes()
    library.write_bytes(whole[: len(whole) // 2])
    assert not native_build.trusted(library)
    with library.open("rb") as cut:  # as a process that has it loaded holds it
        assert native_build.ensure_built("aiayn_tiny", (source,)) == library  # built again
        assert len(cut.read()) == len(whole) // 2  # a new file, not the old one rewritten
    assert native_build.trusted(library) and len(library.read_bytes()) == len(whole)
    library.with_name(library.name + native_build.DIGEST).unlink()  # no digest: not trusted
    assert not native_build.trusted(library)


@posix_only
def test_a_compiler_that_never_returns_is_stopped_at_the_limit(
    tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, root = tiny
    hang = tmp_path / "hang-c++"
    hang.write_text("#!/bin/sh\nsleep 600\n")
    hang.chmod(0o755)
    monkeypatch.setenv("CXX", str(hang))
    start = time.monotonic()
    with performance_settings(kernel_build_timeout_s=3):
        why = _build(source)
    assert why == "could not be built: the compiler ran past 3 s and was stopped"
    assert time.monotonic() - start < 30
    assert not _library(root, source).exists()


@posix_only
def test_no_compiler_is_one_line_and_no_banner(
    tiny: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PyTorch's compiler banner stays in the build's own process: aiayn says one line, a
    WARNING naming the missing compiler and what runs instead."""
    source, _ = tiny
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    why = _build(source)
    assert why is not None and why.startswith("could not be built: ") and "\n" not in why
    assert "/nonexistent/c++" in why and ("not found" in why or "No such file" in why)
    out, err = capfd.readouterr()
    assert "WARNING" not in out + err  # nothing of PyTorch's on this process's streams
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "PyTorch's kernels instead" in warnings[0].getMessage()


def test_nothing_is_built_on_a_generic_cpu_class(
    tiny: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, root = tiny
    monkeypatch.setattr(native_build, "_build_and_load", lambda *a: pytest.fail("built"))
    with cpu.capped("generic"):
        why = native_build.build_extension("aiayn_tiny", (source,))
    assert why == "the CPU class is generic (capped)"
    assert not root.exists()
