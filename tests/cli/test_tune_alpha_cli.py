"""`aiayn tune-alpha` on a tiny checkpoint: the run's validation set by default, never its test
set, and `--alpha auto` reading what it chose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import build_parser, main
from aiayn.cli.translate import load_for_decoding
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.errors import UserError
from aiayn.evaluation.tuning import TUNED_ALPHA_FILE, LengthScore, choose_alpha
from aiayn.models import Transformer
from aiayn.training.config import run_config_from_dict

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A random tiny model whose recorded run validates on val.* and tests on test.*."""
    for name in ("val", "test"):
        (tmp_path / f"{name}.src").write_text("\n".join(TEXTS) + "\n")
        (tmp_path / f"{name}.tgt").write_text("\n".join(reversed(TEXTS)) + "\n")
    data = {
        "train_src": str(tmp_path / "val.src"),
        "train_tgt": str(tmp_path / "val.tgt"),
        "valid_src": str(tmp_path / "val.src"),
        "valid_tgt": str(tmp_path / "val.tgt"),
        "test_src": str(tmp_path / "test.src"),
        "test_tgt": str(tmp_path / "test.tgt"),
    }
    run = run_config_from_dict({"run_dir": str(tmp_path / "run"), "data": data})
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(tmp_path / "tok.json")
    torch.manual_seed(0)
    config = preset(
        "tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4, max_len=24
    )
    state = {"step": 1, "run_config": run.to_dict()}
    return save_checkpoint(tmp_path / "step_1", Transformer(config), state, tmp_path / "tok.json")


def test_tune_alpha_on_the_runs_validation_set(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["tune-alpha", "--checkpoint", str(checkpoint), "--alphas", "0,1.5", "--beam", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "alpha 0 " in out and "alpha 1.5 " in out and "best: alpha" in out
    saved = json.loads((checkpoint / TUNED_ALPHA_FILE).read_text())
    assert saved["source"].endswith("val.src") and saved["sentences"] == len(TEXTS)
    assert saved["beam_size"] == 2 and set(saved["scores"]) == {"0", "1.5"}
    table = {float(a): LengthScore(**s) for a, s in saved["scores"].items()}
    assert saved["alpha"] == choose_alpha(table)
    # --alpha auto takes the tuned alpha and its beam; a given --beam wins
    parser = build_parser()
    options = load_for_decoding(
        parser.parse_args(["translate", "--checkpoint", str(checkpoint), "--alpha", "auto"])
    )[2]
    assert (options.alpha, options.beam_size) == (saved["alpha"], 2)
    given = ["translate", "--checkpoint", str(checkpoint), "--alpha", "auto", "--beam", "3"]
    assert load_for_decoding(parser.parse_args(given))[2].beam_size == 3
    # never silently replaced
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err


def test_tune_alpha_refuses_the_test_set_and_greedy(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test = checkpoint.parent / "test"
    base = ["tune-alpha", "--checkpoint", str(checkpoint), "--alphas", "0.6"]
    assert main([*base, "--src", f"{test}.src", "--ref", f"{test}.tgt"]) == 2
    assert "test set" in capsys.readouterr().err
    assert main([*base, "--beam", "1"]) == 2
    assert "greedy" in capsys.readouterr().err
    assert main([*base, "--src", f"{test}.src"]) == 2
    with pytest.raises(SystemExit) as usage:  # argparse: the usage, then the error
        main(["tune-alpha", "--checkpoint", str(checkpoint), "--alphas=0.6,-1"])
    assert usage.value.code == 2 and "finite number >= 0" in capsys.readouterr().err
    assert not (checkpoint / TUNED_ALPHA_FILE).exists()


def test_tune_alpha_grows_past_the_grid_by_the_rule(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a grid of one α: that α is its largest and its best, so the rule must grow past it
    base = ["tune-alpha", "--checkpoint", str(checkpoint), "--beam", "2", "--alphas", "1.5"]
    assert main([*base, "--grow-by", "0.5", "--grow-to", "1.9"]) == 2
    assert "--grow-to 1.9 leaves no room" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--grow-by", "inf"])
    assert "--grow-by" in capsys.readouterr().err
    assert main([*base, "--grow-by", "0.5", "--grow-to", "3"]) == 0
    err = capsys.readouterr().err
    saved = json.loads((checkpoint / TUNED_ALPHA_FILE).read_text())
    table = {float(a): LengthScore(**s) for a, s in saved["scores"].items()}
    tried = sorted(table)
    assert tried[:2] == [1.5, 2.0] and tried[2:] == [2.5, 3.0][: len(tried) - 2]
    for i in range(1, len(tried)):  # each α past the grid: the one before it was the best
        assert choose_alpha({a: table[a] for a in tried[:i]}) == tried[i - 1]
    assert saved["alpha"] == choose_alpha(table)
    stopped_inside = saved["alpha"] != tried[-1]
    assert stopped_inside or tried[-1] == 3.0  # the rule's two ends: a best inside, or the bound
    assert ("largest tried" in err) == (not stopped_inside)


def test_alpha_auto_without_tuning_is_one_line(checkpoint: Path) -> None:
    args = build_parser().parse_args(
        ["translate", "--checkpoint", str(checkpoint), "--alpha", "auto"]
    )
    with pytest.raises(UserError, match="tune-alpha --checkpoint"):
        load_for_decoding(args)
