"""Building aiayn's own C++ kernels (``csrc/`` beside this module) with PyTorch's extension
builder: a C++ compiler and ninja are needed. A build is cached per machine in
``$TORCH_EXTENSIONS_DIR`` (by default under ``~/.cache/torch_extensions``), one build folder per
checkout, source contents, PyTorch and Python (:func:`build_name`): two checkouts or versions
used in turn on one machine do not rebuild each other's kernels.

The kernels are built ahead of use, by ``make install`` or ``aiayn kernels build``; a process
that needs one and finds none builds it then (the fallback), before its timed work where it can
(:func:`aiayn.kernels.prepare`). A build:

- runs only where a kernel could run: an x86-64 CPU of class ``avx2`` or higher
  (:mod:`aiayn.kernels.cpu`), with ``AIAYN_NATIVE`` not ``0``;
- runs in a child process bounded in time
  (:attr:`~aiayn.settings.PerformanceSettings.kernel_build_timeout_s`): a compiler that never
  returns is stopped, with everything it started; the compiler's own output (PyTorch's banners
  included) stays in the child, and aiayn says in one line what it falls back to;
- is trusted only once it succeeded: the child's library gets a digest file beside it
  (:data:`DIGEST`), and a library whose digest is missing or differs (cut short by a full disk,
  copied half) is never loaded but built again;
- takes turns with other processes through an operating-system lock (:func:`exclusive_build`),
  so a build killed halfway (Ctrl-C, a killed job) never leaves the next process waiting.

A kernel that does not build is never an error: its caller runs the library operations it is
held equal to, and :func:`build_extension` says why (and logs a WARNING, once).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiayn.kernels import cpu
from aiayn.settings import performance

_log = logging.getLogger(__name__)

SWITCH = "AIAYN_NATIVE"  # "0": no native kernel is built or run
FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")  # no fused multiply-adds the source does not ask
LOCK = "aiayn.flock"  # in the build folder: builders take turns on it (see exclusive_build)
DIGEST = ".sha256"  # suffix of the file holding a built library's SHA-256, written after success

_CHILD = """
import sys
from torch.utils import cpp_extension
name, folder, flags, *sources = sys.argv[1:]
cpp_extension.load(name=name, sources=sources, extra_cflags=flags.split(),
                   extra_ldflags=["-fopenmp"], build_directory=folder,
                   is_python_module=False, verbose=False)
"""
"""The child process that compiles: argv = name, folder, flags, sources."""


def build_name(name: str, sources: tuple[Path, ...]) -> str:
    """``name`` with a digest of the sources' paths and contents, the flags, the lock, and the
    PyTorch and Python versions: the build folder of this checkout's kernels."""
    import torch

    parts = (*FLAGS, LOCK, torch.__version__, sys.version)
    digest = hashlib.sha256(" ".join(parts).encode())  # a folder builders lock alike
    for source in sources:
        digest.update(str(source.resolve()).encode())
        digest.update(source.read_bytes())
    return f"{name}_{digest.hexdigest()[:12]}"


def build_folder(full_name: str) -> Path:
    """The folder PyTorch's builder uses for ``full_name`` (created)."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(full_name, False))


@contextmanager
def exclusive_build(directory: Path | None) -> Iterator[None]:
    """Build in ``directory`` alone: hold an operating-system lock on its :data:`LOCK` file.

    PyTorch's builder marks a build in progress with a ``lock`` file and makes other processes
    wait until that file is gone; a builder killed mid-build leaves it, and they wait forever.
    The operating system releases this lock when its holder exits, however it exits. So, while it
    is held, a ``lock`` file there was left by a builder that is gone, and it is removed.
    Where there is no such lock (not POSIX, or no folder), PyTorch's own waiting is all there is.
    """
    if os.name != "posix" or directory is None:
        yield
        return
    import fcntl

    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)  # never through a link
    fd = os.open(directory / LOCK, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits while a live process builds here
        stale = directory / "lock"
        if stale.is_file() and not stale.is_symlink():
            _log.warning("removing %s, left by a kernel build that was stopped", stale)
            stale.unlink()
        yield
    finally:
        os.close(fd)  # closing releases the lock


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def trusted(library: Path) -> bool:
    """Whether ``library`` is a regular file whose digest file says it is the one a build made."""
    mark = library.with_name(library.name + DIGEST)
    if not (library.is_file() and mark.is_file()) or library.is_symlink() or mark.is_symlink():
        return False
    return mark.read_text(errors="replace").strip() == file_digest(library)


def why_not_here() -> str | None:
    """Why no aiayn kernel is built or run in this process now, or None where they may be."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"turned off by {SWITCH}=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):  # not built where it cannot run
        return f"an x86-64 kernel; this machine is {platform.machine() or 'unknown'}"
    if not cpu.at_least("avx2"):
        capped = cpu.level() != cpu.detected()
        return f"the CPU class is generic ({'capped' if capped else 'no AVX2 and FMA'})"
    return None


def build_extension(name: str, sources: tuple[Path, ...]) -> str | None:
    """Load the extension ``name`` built from ``sources``, building it first where no trusted
    build is cached (once per process; its operators then live in ``torch.ops``). None when it
    is loaded, else one line saying why not."""
    why = why_not_here()
    return why if why is not None else _build_and_load(name, sources)


_failed: set[str] = set()  # the kernels whose build failed in this process


def failed_builds() -> frozenset[str]:
    """The kernels (by name) this process tried to build and could not."""
    return frozenset(_failed)


@functools.cache
def _build_and_load(name: str, sources: tuple[Path, ...]) -> str | None:
    """:func:`build_extension` past its checks: the result is kept for the process."""
    try:
        library = ensure_built(name, sources)
        import torch

        torch.ops.load_library(str(library))
    except (ImportError, OSError, RuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        why = f"could not be built: {first}"
        _failed.add(name)
        _log.warning("aiayn: kernel %s %s; running PyTorch's kernels instead", name, why)
        return why
    return None


def ensure_built(name: str, sources: tuple[Path, ...]) -> Path:
    """The trusted library of ``name`` built from ``sources``, built first where there is none
    (not loaded). RuntimeError or OSError where it cannot be built."""
    full_name = build_name(name, sources)
    folder = build_folder(full_name)
    library = folder / f"{full_name}.so"
    with exclusive_build(folder):
        if not trusted(library):
            _build(full_name, folder, library, sources)
    return library


def _build(full_name: str, folder: Path, library: Path, sources: tuple[Path, ...]) -> None:
    """Compile ``library`` in a child process within the time limit, then write its digest;
    an untrusted library left there is removed first (unlinked: a process that has the old one
    loaded keeps its copy, never a file rewritten under it). RuntimeError with the compiler's
    line that says why (or the time limit) where the build fails."""
    for stale in (library, library.with_name(library.name + DIGEST)):
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
    limit = performance().kernel_build_timeout_s
    _log.info("building aiayn's kernels %s (once per machine and checkout)", full_name)
    command = [sys.executable, "-c", _CHILD, full_name, str(folder), " ".join(FLAGS)]
    child = subprocess.Popen(
        [*command, *(str(s) for s in sources)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stopped whole at the time limit
        env=_ninja_env(),
    )
    try:
        output, _ = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _stop(child)
        raise RuntimeError(f"the compiler ran past {limit:g} s and was stopped") from None
    if child.returncode != 0 or not library.is_file():
        raise RuntimeError(_last_line(output.decode(errors="replace")))
    mark = library.with_name(library.name + DIGEST)
    mark.write_text(file_digest(library) + "\n")


def _stop(child: subprocess.Popen[bytes]) -> None:
    """Kill ``child`` and every process it started (its own session), and reap it."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()
    child.communicate()


CAUSES = ("error:", "not found", "No such file", "Permission denied", "Killed")
"""Phrases of the line that says why a build failed (a compiler error, a missing compiler)."""


def _last_line(output: str) -> str:
    """The line of a failed build's output that says why: the first that names a cause
    (:data:`CAUSES`), else the last error line, else the last line; PyTorch's banners and the
    compiler's command lines are left out.

    E.g. "…\n/bin/sh: 1: /usr/bin/c++: not found\nninja: build stopped…" -> "/bin/sh: 1:
    /usr/bin/c++: not found".
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if any(cause in line for cause in CAUSES):
            return line[:200]
    for line in reversed(lines):
        if "Error" in line:
            return line[:200]
    return lines[-1][:200] if lines else "the build failed with no output"


def _ninja_env() -> dict[str, str]:
    """The environment of the build: PyTorch's builder runs ``ninja`` from PATH, so where it is
    not there, the one the ``ninja`` package installed (a dependency) is put first on PATH (an
    unactivated virtual environment leaves it off)."""
    env = dict(os.environ)
    try:
        import ninja
    except ImportError:
        return env
    env["PATH"] = os.pathsep.join([str(ninja.BIN_DIR), env.get("PATH", "")])
    return env
