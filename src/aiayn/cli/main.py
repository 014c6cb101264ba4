"""The ``aiayn`` command: one sub-command per module in :mod:`aiayn.cli`.

Each sub-command module exposes ``register(subparsers)`` which adds its parser and sets
``func`` (args -> exit code). Errors, by what the user can do about them:

* bad user input (:class:`~aiayn.errors.UserError`, a message naming the bad value) is printed as
  one line, ``aiayn CMD: error: …``, without a traceback, with exit status 2;
* so is the operating system refusing a file operation (an :class:`OSError` naming a path: not
  found, permission denied, is a folder, read-only file system, disk full…), whichever path it
  is — the remedy is the user's, and the message names the path — and a file that is not UTF-8,
  or memory running out;
* argparse's own errors (an unknown flag, a value of the wrong type) print its usage synopsis,
  then the error as the last line, with exit status 2;
* anything else is a bug in aiayn: the traceback is kept, followed by one line asking for a bug
  report, with exit status 1.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import traceback
from collections.abc import Sequence

from aiayn import __version__
from aiayn.cli import (
    attention,
    average,
    classify_image,
    classify_text,
    convert,
    embed,
    evaluate,
    experiment,
    explain,
    export,
    fill_mask,
    generate,
    kernels,
    params,
    quantize,
    serve,
    train,
    translate,
    tune_alpha,
)
from aiayn.cli.outputs import silence_stdout
from aiayn.errors import UserError

COMMANDS = (
    train,
    translate,
    generate,
    fill_mask,
    embed,
    classify_image,
    classify_text,
    evaluate,
    tune_alpha,
    average,
    quantize,
    attention,
    experiment,
    explain,
    params,
    kernels,
    convert,
    export,
    serve,
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer of 'Attention Is All You Need': "
        "build, train, decode, inspect.",
    )
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m aiayn``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except UserError as error:
        return _error(args.command, str(error))
    except KeyboardInterrupt:
        print("aiayn: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`aiayn generate … | head -1`): it has
        silence_stdout()  # what it wanted, so this is no failure
        return 0
    except OSError as error:
        message = describe_os_error(error)
        if message is None:
            return _internal_error()
        return _error(args.command, message)
    except UnicodeDecodeError as error:
        return _error(
            args.command,
            f"a file is not valid UTF-8 (byte {error.object[error.start : error.end]!r} at "
            f"offset {error.start}); convert it to UTF-8, e.g. with iconv",
        )
    except MemoryError:
        return _error(args.command, "out of memory: try a smaller batch, beam or input")
    except Exception as error:
        memory = out_of_memory(error)
        if memory is not None:
            return _error(args.command, memory)
        return _internal_error()


_CPU_ALLOCATION = re.compile(
    r"DefaultCPUAllocator: can't allocate memory: (you tried to allocate \d+ bytes)"
)


def out_of_memory(error: BaseException) -> str | None:
    """One line for torch running out of memory: CUDA's ``OutOfMemoryError``, or the CPU
    allocator's ``RuntimeError`` (``DefaultCPUAllocator: can't allocate memory``); None for
    anything else."""
    text = str(error).strip()
    if type(error).__name__ == "OutOfMemoryError":
        first = text.splitlines()[0] if text else "CUDA"
        return f"out of memory ({first}): try a smaller batch, beam or input"
    found = _CPU_ALLOCATION.search(text) if isinstance(error, RuntimeError) else None
    if found is None:
        return None
    return f"out of memory ({found[1]}): try a smaller batch, beam or input"


# errnos of a refused file operation that name no file but the disk or file system
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def describe_os_error(error: OSError) -> str | None:
    """One line for an :class:`OSError` that is the environment's, not aiayn's: one naming a
    file (``PATH: reason``, and the second path of a rename), or a full or read-only disk; None
    for others (a bug)."""
    reason = error.strerror or str(error)
    if error.filename is not None:
        name = os.fsdecode(error.filename)
        if error.filename2 is not None:
            name = f"{name} -> {os.fsdecode(error.filename2)}"
        return f"{name}: {reason}"
    if error.errno in _DISK_ERRNOS:
        return reason
    return None


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined, blank ones and caret markers dropped."""
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and set(line) != {"^"})


def _error(command: str, message: str) -> int:
    print(f"aiayn {command}: error: {one_line(message)}", file=sys.stderr)
    return 2


def _internal_error() -> int:
    traceback.print_exc()
    print(
        "aiayn: internal error — this is a bug in aiayn: please report it to the aiayn "
        "maintainers with the command and the traceback above",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
