"""Ctrl-C from the first instant: an interrupt while the commands import (torch, seconds) prints
``aiayn: interrupted`` and exits 130, as one during a command does, without a traceback; the
console script starts at the entry point that installs the handler."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiayn.__main__ import INTERRUPTED, INTERRUPTED_MESSAGE

ROOT = Path(__file__).resolve().parents[2]


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it, even where the tests run with it ignored
    (a background job), which Python would keep ignoring."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_while_the_commands_import_prints_one_line_and_exits_130() -> None:
    """SIGINT 0.3 s after the start, while torch imports (``-X importtime`` shows it had not
    finished): one line, status 130."""
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "aiayn", "--version"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    imported = [line for line in err.splitlines() if line.startswith("import time:")]
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert not any(re.search(r"\|\s+torch$", line) for line in imported), (
        "torch had finished importing within 0.3 s: the interrupt did not come during the import"
    )
    assert (process.returncode, said, out) == (INTERRUPTED, [INTERRUPTED_MESSAGE], "")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_an_ignored_sigint_stays_ignored() -> None:
    """A background job (SIGINT ignored) is not made interruptible by the handler."""
    process = subprocess.Popen(
        [sys.executable, "-m", "aiayn", "--version"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert (process.returncode, out.strip(), err) == (0, "aiayn 0.1.0", "")


def test_without_an_interrupt_the_entry_point_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "aiayn 0.1.0", "")


def test_the_console_script_starts_at_the_entry_point() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"] == {"aiayn": "aiayn.__main__:main"}
