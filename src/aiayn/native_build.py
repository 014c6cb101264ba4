"""Building aiayn's own C++ kernels (the ``csrc/`` folders beside the modules that use them) on
first use, with PyTorch's extension builder: a C++ compiler and ninja are needed, the build is
cached per machine in ``$TORCH_EXTENSIONS_DIR`` (by default under ``~/.cache/torch_extensions``),
one build folder per checkout and source contents (:func:`build_name`): two checkouts or versions
used in turn on one machine do not rebuild each other's kernels. Processes that build at once
take turns through an operating-system lock (:func:`exclusive_build`), so a build killed halfway
(Ctrl-C, a killed job) never leaves the next process waiting forever.

They are x86-64 kernels (AVX-512), so nothing is built elsewhere. ``AIAYN_NATIVE=0`` turns every
one of them off. A kernel that does not build or run here is never an error: its caller runs
the library operations it is held equal to, and :func:`build_extension` says why.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_log = logging.getLogger(__name__)

SWITCH = "AIAYN_NATIVE"  # "0": no native kernel is built or run
FLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")  # no fused multiply-adds the source does not ask
LOCK = "aiayn.flock"  # in the build folder: builders take turns on it (see exclusive_build)


@contextmanager
def _ninja_on_path() -> Iterator[None]:
    """PyTorch's builder runs ``ninja`` from PATH: where it is not there, the one the ``ninja``
    package installed (a dependency) is put on PATH for the build, as an unactivated virtual
    environment leaves it off."""
    if shutil.which("ninja") is not None:
        yield
        return
    try:
        import ninja
    except ImportError:
        yield
        return
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(ninja.BIN_DIR), before])
    try:
        yield
    finally:
        os.environ["PATH"] = before


def build_name(name: str, sources: tuple[Path, ...]) -> str:
    """``name`` with a digest of the sources' paths and contents, the flags and the lock: the build
    folder of this checkout's kernels (PyTorch's builder keeps one build per name, and rebuilds
    when another checkout's sources, or other contents, come under the same name)."""
    digest = hashlib.sha256(" ".join((*FLAGS, LOCK)).encode())  # a folder builders lock alike
    for source in sources:
        digest.update(str(source.resolve()).encode())
        digest.update(source.read_bytes())
    return f"{name}_{digest.hexdigest()[:12]}"


def _build_directory(name: str) -> Path | None:
    """The folder PyTorch's builder uses for ``name`` (created), or None where this PyTorch does
    not say."""
    from torch.utils import cpp_extension

    where = getattr(cpp_extension, "_get_build_directory", None)
    return None if where is None else Path(where(name, False))


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


@functools.cache
def build_extension(name: str, sources: tuple[Path, ...]) -> str | None:
    """Compile and load the extension ``name`` from ``sources`` (once per process; its operators
    then live in ``torch.ops``). None when it is loaded, else one line saying why not."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"turned off by {SWITCH}=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):  # not built where it cannot run
        return f"an x86-64 kernel; this machine is {platform.machine() or 'unknown'}"
    try:
        with _ninja_on_path():
            from torch.utils import cpp_extension

            _log.info("building aiayn's kernels %s (once per machine and checkout)", name)
            full_name = build_name(name, sources)
            with exclusive_build(_build_directory(full_name)):
                cpp_extension.load(
                    name=full_name,
                    sources=[str(s) for s in sources],
                    extra_cflags=list(FLAGS),
                    extra_ldflags=["-fopenmp"],
                    is_python_module=False,
                    verbose=False,
                )
    except (ImportError, OSError, RuntimeError, subprocess.CalledProcessError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"could not be built: {first}"
    return None
