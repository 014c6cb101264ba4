"""``python -m aiayn`` and the ``aiayn`` console script: the command line of
:mod:`aiayn.cli.main`, answering Ctrl-C from the first instant.

Importing the commands takes seconds (torch, imported with the sub-command modules); a Ctrl-C
then would end in a ``KeyboardInterrupt`` traceback from deep inside an import. :func:`main`
installs its SIGINT handler before that import, so an interrupt while it runs prints
``aiayn: interrupted`` and exits 130, as one during a command does (:func:`aiayn.cli.main.main`).
This module imports only the standard library at its top, so the handler is in place within
milliseconds of the start.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

INTERRUPTED = 130
"""The exit status of an interrupted command (128 + SIGINT), as shells report one."""

INTERRUPTED_MESSAGE = "aiayn: interrupted"
"""What an interrupted command prints (on standard error), whenever the interrupt comes."""


def _interrupted_while_importing(signum: int, frame: FrameType | None) -> None:
    """SIGINT while the commands import: say so and exit 130 at once. Nothing has been written
    yet, and unwinding a half-done import of torch could only print more."""
    sys.stderr.write(INTERRUPTED_MESSAGE + "\n")
    sys.stderr.flush()
    os._exit(INTERRUPTED)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``aiayn`` command (:func:`aiayn.cli.main.main`), imported under a SIGINT handler
    installed first; returns the exit status.

    The handler replaces Python's default one only (an ignored SIGINT, as in a background job,
    stays ignored), in the main thread only, and only until the import is done.
    """
    installed = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    if installed:
        signal.signal(signal.SIGINT, _interrupted_while_importing)
    try:
        # imported here, on purpose: after the handler, since it takes seconds (torch)
        from aiayn.cli.main import main as command
    finally:
        if installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return command(argv)
    except KeyboardInterrupt:  # while the arguments were read, before the command's own catch
        print(INTERRUPTED_MESSAGE, file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
