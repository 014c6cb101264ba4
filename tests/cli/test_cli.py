"""The aiayn command: help, python -m, params output, clear errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aiayn.cli.main import main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiayn", *args], capture_output=True, text=True, timeout=120
    )


def test_help_via_python_m() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for command in ("explain", "params"):
        assert command in result.stdout


def test_params_base_and_big(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["params", "--preset", "base", "--vocab-size", "37000"]) == 0
    out = capsys.readouterr().out
    assert "63,082,496" in out and "(63.1M)" in out and "-3.0%" in out
    assert "encoder feed-forward" in out and "decoder cross-attention" in out
    assert main(["params", "--preset", "big", "--vocab-size", "37000"]) == 0
    assert "(214.2M)" in capsys.readouterr().out


def test_bad_input_is_a_clear_error_without_traceback() -> None:
    result = _run("params", "--preset", "tiny", "--vocab-size", "-5")
    assert result.returncode == 2
    assert "error: argument --vocab-size: must be >= 1, got -5" in result.stderr
    assert "Traceback" not in result.stderr


def test_params_of_the_gpt2_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["params", "--preset", "gpt2"]) == 0
    out = capsys.readouterr().out
    assert "124,439,808" in out and "published GPT-2" in out and "+0.0%" in out
    assert main(["params", "--preset", "gpt2-xl"]) == 0
    assert "1,557,611,200" in capsys.readouterr().out
    assert main(["params", "--preset", "gpt2", "--vocab-size", "1000"]) == 0
    out = capsys.readouterr().out
    assert "vocab=1000" in out and "published" not in out  # another vocabulary: no comparison


@pytest.mark.parametrize(
    "preset, total",
    [
        ("t5-small", "60,506,624"),
        ("flan-t5-small", "76,961,152"),
        ("bert-base-uncased", "109,482,240"),
        ("vit-base-patch16-224", "86,389,248"),
    ],
)
def test_params_of_the_descendants(
    preset: str, total: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The published counts of T5, FLAN-T5, BERT and ViT, with their own parts named."""
    assert main(["params", "--preset", preset]) == 0
    out = capsys.readouterr().out
    assert total in out and "difference +0.0%" in out and "other" not in out
    if preset.startswith("t5"):
        assert "relative position bias" in out
