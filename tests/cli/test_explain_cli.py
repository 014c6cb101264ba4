"""``aiayn explain`` from the command line: output, exit status, error messages."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli.main import main


def _status(argv: list[str]) -> int:
    """main's exit status; argparse's own errors (e.g. a non-integer) raise SystemExit(2)."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


def _env() -> dict[str, str]:
    """The environment for a subprocess, with this checkout's src/ first on the path."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": src if not path else os.pathsep.join([src, path])}


def test_default_prints_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith('Self-attention, step by step: "The cat sat"')
    for title in ("Step 1.", "Step 2.", "Step 3.", "Step 4.1.", "Step 4.2.", "Step 5.", "Step 6."):
        assert title in out
    assert "√d_k = √2 = 1.4142" in out
    assert (
        out.rstrip()
        .splitlines()[-1]
        .startswith("check: equals aiayn.attention.SelfAttention output and weights (max |diff| = ")
    )


def test_python_dash_m(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "explain"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Step 6. Output = Concat · W_O (§3.2.2)" in done.stdout
    assert "check: equals aiayn.attention.SelfAttention" in done.stdout


def test_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "explain",
        "--tokens",
        "a b c d",
        "--d-model",
        "6",
        "--heads",
        "3",
        "--seed",
        "4",
        "--causal",
        "--no-positional",
        "--no-scale",
        "--decimals",
        "2",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "T=4 tokens, D=d_model=6, H=3 heads, d_k=d_v=D/H=2" in out
    assert "Step 4.3. Head 3 of 3: columns 4:6" in out
    assert "Causal mask (§3.2.3)" in out
    assert "skipped (--no-positional)" in out
    assert "off (--no-scale)" in out
    assert "from seed 4" in out
    assert "    row sums: 1.00  1.00  1.00  1.00" in out
    assert main(argv) == 0
    assert capsys.readouterr().out == out  # reproducible


def test_weights_file_softmax_3_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = math.sqrt(2)
    path = tmp_path / "w.json"
    path.write_text(
        json.dumps(
            {
                "embeddings": [[1, 0], [0, 1]],
                "W_Q": [[3 * root, 2 * root], [0, 0]],
                "W_K": [[1, 0], [0, 1]],
            }
        )
    )
    argv = [
        "explain",
        "--tokens",
        "The cat",
        "--weights",
        str(path),
        "--heads",
        "1",
        "--no-positional",
        "--no-scale",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "The  0.7311  0.2689" in out
    assert "0.75" not in out
    assert f"W_Q:                 from {path}" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--heads", "3"], "heads=3 does not divide d_model=4"),
        (["--d-model", "0"], "argument --d-model: must be >= 1, got 0"),
        (["--tokens", "   "], "no tokens"),
        (["--decimals", "-1"], "decimals"),
        (["--d-model", "x"], "invalid int value: 'x'"),
        (["--weights", "/nonexistent/w.json"], "/nonexistent/w.json"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _status(["explain", *argv]) == 2
    out, err = capsys.readouterr()
    assert "error:" in err
    assert message in err
    assert "Traceback" not in err + out


def test_bad_weights_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("[1, 2,")
    wrong_shape = tmp_path / "shape.json"
    wrong_shape.write_text(json.dumps({"W_Q": [[1, 0, 0], [0, 1, 0], [0, 0, 1]]}))
    for path, message in ((bad_json, "is not valid JSON"), (wrong_shape, "W_Q must be 4×4")):
        assert main(["explain", "--weights", str(path), "--d-model", "4"]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("aiayn explain: error: ")
        assert message in err
        assert str(path) in err
        assert "Traceback" not in err


def test_bad_input_subprocess(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "explain", "--heads", "3"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "error:" in done.stderr
    assert "heads=3 does not divide d_model=4" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_docs_example_is_the_real_output(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/explain.md shows excerpts of `aiayn explain`: every line shown must be printed."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "explain.md").read_text("utf-8")
    block = doc.split("$ aiayn explain\n", 1)[1].split("```", 1)[0]
    shown = [line for line in block.splitlines() if line and line != "…"]
    assert len(shown) > 40
    assert main(["explain"]) == 0
    printed = capsys.readouterr().out.splitlines()
    for line in shown:
        if "max |diff|" in line:  # rounding-level numbers may differ between machines
            line = line.split("(max |diff|")[0]
            assert any(p.startswith(line) for p in printed), line
        else:
            assert line in printed, line
