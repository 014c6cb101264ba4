"""Files are written with the user's umask: a training run (checkpoints, ``best``, averaging
checkpoints, ``averaged``, tokenizer, metrics, curves, test hypotheses), ``aiayn average``,
``aiayn convert`` both ways and ``aiayn attention`` (its HTML page) create files readable by
others exactly when the umask says so (no 0600 temporary file renamed into place, no copied
modes)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.models import GPT2, GPT2Config
from aiayn.training.config import RunConfig, run_config_from_dict
from aiayn.training.trainer import Trainer

FIXTURES = Path(__file__).parents[1] / "checkpoint" / "fixtures"


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test under this umask (and torch's thread count, which the trainer sets),
    restored after."""
    old, threads = os.umask(request.param), torch.get_num_threads()
    try:
        yield request.param
    finally:
        os.umask(old)
        torch.set_num_threads(threads)


def _modes(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` (itself included) -> its permission bits, octal."""
    paths = [root, *root.rglob("*")]
    return {str(p.relative_to(root.parent)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in paths}


def test_every_written_file_follows_the_umask(
    umask: int,
    tmp_path: Path,
    reverse_task: Callable[..., Path],
    make_run: Callable[..., RunConfig],
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    train, test = reverse_task(data, 200, seed=1), reverse_task(data, 2, seed=2)
    short = {"positional": "learned", "max_len": 24}  # the untrained model's outputs stop soon
    values = make_run(
        tmp_path / "run", train, model=short, max_steps=4, save_every=2, average_last=2,
        average_window=0.5, threads=1,
    ).to_dict()  # fmt: skip
    values["data"].update(test_src=str(test), valid_size=5, bleu_sentences=2)
    Trainer(run_config_from_dict(values)).fit()
    run = tmp_path / "run"
    assert (
        main(["average", "--run-dir", str(run), "--last", "2", "--out", str(tmp_path / "avg")]) == 0
    )
    out = tmp_path / "maps"
    maps = ["attention", "--checkpoint", str(run), "--src", "a b", "--tgt", "b a", "--no-png"]
    assert main([*maps, "--out", str(out)]) == 0
    config = GPT2Config(
        vocab_size=270, max_len=16, d_model=16, num_heads=2, num_layers=1, bos_id=1, eos_id=2,
        pad_id=0,
    )  # fmt: skip
    gpt2 = GPT2(config)
    save_checkpoint(tmp_path / "gpt2", gpt2, {}, FIXTURES / "format1_tied" / "tokenizer.json")
    hf, back = tmp_path / "hf", tmp_path / "back"
    assert main(["convert", "--checkpoint", str(tmp_path / "gpt2"), "--to-hf", str(hf)]) == 0
    assert main(["convert", "--from-hf", str(hf), "--to", str(back)]) == 0
    capsys.readouterr()

    written: dict[str, str] = {}
    for root in (run, tmp_path / "avg", out, tmp_path / "gpt2", hf, back):
        written.update(_modes(root))
    expected = {"file": oct(0o666 & ~umask), "folder": oct(0o777 & ~umask)}
    wrong = {
        name: mode
        for name, mode in written.items()
        if mode != expected["folder" if (tmp_path / name).is_dir() else "file"]
    }
    assert wrong == {}, f"expected {expected}"
    names = set(written)
    for must in (
        "run/checkpoints/best/SHA256SUMS",
        "run/checkpoints/averaged/model.safetensors",
        "run/checkpoints/step_00000004/optimizer.safetensors",
        "run/checkpoints/window/step_00000004/state.json",
        "run/metrics.jsonl",
        "run/curves.png",
        "run/test.hyp.txt",
        "run/tokenizer.json",
        "avg/tokenizer.json",
        "maps/attention.html",
        "hf/model.safetensors",
        "back/SHA256SUMS",
    ):
        assert must in names, sorted(names)
