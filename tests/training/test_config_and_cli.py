"""Run configs (YAML, --set, unknown keys) and `aiayn train` errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aiayn.cli.main import main
from aiayn.errors import ConfigError
from aiayn.training.config import load_run_config, run_config_from_dict, yaml_problem
from aiayn.training.translation import DEMO_CONFIG

ROOT = Path(__file__).resolve().parents[2]


def test_demo_yaml_equals_builtin_demo() -> None:
    assert yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text()) == DEMO_CONFIG


@pytest.mark.parametrize("name", ["base", "big", "multi30k_small", "demo"])
def test_shipped_configs_load(name: str) -> None:
    run = load_run_config(ROOT / "configs" / f"{name}.yaml")
    assert run.model.d_model in (256, 512, 1024)
    assert run_config_from_dict(run.to_dict()) == run  # to_dict round-trips


def test_paper_presets_in_configs() -> None:
    base = load_run_config(ROOT / "configs" / "base.yaml")
    big = load_run_config(ROOT / "configs" / "big.yaml")
    assert (base.model.d_model, base.train.warmup_steps, base.train.average_last) == (512, 4000, 5)
    assert (big.model.d_model, big.model.dropout, big.train.average_last) == (1024, 0.3, 20)
    assert base.train.adam_betas == (0.9, 0.98) and base.train.adam_eps == 1e-9


def test_overrides_and_errors() -> None:
    run = load_run_config(None, ["train.max_steps=5", "model.dropout=0.3", "run_dir=x"])
    assert (run.train.max_steps, run.model.dropout, run.run_dir) == (5, 0.3, "x")
    with pytest.raises(ConfigError, match=r"unknown train config key.*max_step"):
        load_run_config(None, ["train.max_step=5"])
    with pytest.raises(ConfigError, match=r"unknown model config key.*dropuot"):
        load_run_config(None, ["model.dropuot=0.3"])
    with pytest.raises(ConfigError, match=r"train\.max_tokens must be >= 1, got 0"):
        load_run_config(None, ["train.max_tokens=0"])
    with pytest.raises(ConfigError, match="max_tokens has the wrong type"):
        load_run_config(None, ["train.max_tokens=lots"])
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_run_config(None, ["nonsense"])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiayn", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_train_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "bad.de").write_bytes(b"eins\nzw\xffei\ndrei\n")
    cases = [
        (["--config", "missing.yaml"], "config file not found: missing.yaml"),
        (["--set", "data.train_src=a.en", "--set", "data.train_tgt=a.de"], "a.de"),
        (["--set", "data.train_src=a.en", "--set", "data.train_tgt=bad.de"], "line 2"),
        (["--set", "data.train_src=nope.en", "--set", "data.train_tgt=a.de"], "nope.en"),
    ]
    for args, needle in cases:
        result = _cli("train", *args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "error:" in result.stderr and needle in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    misaligned = _cli("train", *cases[1][0], cwd=tmp_path).stderr
    assert "3" in misaligned and "2" in misaligned  # both line counts are named


def test_average_cli_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["average", "--run-dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no checkpoints under" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: b: c\n", "line 1, column 5: mapping values are not allowed here"),
        (
            "model:\n  d_model: [1\n",
            "line 3, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence)",
        ),
    ],
)
def test_yaml_errors_are_one_line_with_their_position(text: str, expected: str) -> None:
    """PyYAML's multi-line message becomes one line naming the 1-based line and column."""
    with pytest.raises(yaml.YAMLError) as error:
        yaml.safe_load(text)
    assert "\n" in str(error.value)  # what the function exists to fold
    assert yaml_problem(error.value) == expected
