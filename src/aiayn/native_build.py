"""Building aiayn's own C++ kernels (the ``csrc/`` folders beside the modules that use them) on
first use, with PyTorch's extension builder: a C++ compiler and ninja are needed, the build is
cached per machine in ``$TORCH_EXTENSIONS_DIR`` (by default under ``~/.cache/torch_extensions``),
one build folder per checkout and source contents (:func:`build_name`): two checkouts or versions
used in turn on one machine do not rebuild each other's kernels.

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
    """``name`` with a digest of the sources' paths and contents and of the flags: the build
    folder of this checkout's kernels (PyTorch's builder keeps one build per name, and rebuilds
    when another checkout's sources, or other contents, come under the same name)."""
    digest = hashlib.sha256(" ".join(FLAGS).encode())
    for source in sources:
        digest.update(str(source.resolve()).encode())
        digest.update(source.read_bytes())
    return f"{name}_{digest.hexdigest()[:12]}"


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
            cpp_extension.load(
                name=build_name(name, sources),
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
