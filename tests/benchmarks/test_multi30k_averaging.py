"""benchmarks/multi30k_averaging.py: which window checkpoints a setting (n/w) averages, settings
whose points are not the recipe's refused by name, and a study end to end on tiny checkpoints
whose references are one setting's own output (so that setting, and only it, scores 100)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

import _common
import multi30k_averaging as avg
from aiayn.checkpoint import average_checkpoints, load_checkpoint, save_checkpoint
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.decoding.translate import DecodeOptions, translate_texts
from aiayn.models import Transformer
from train_multi30k import score

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]
WINDOW = [10, 20, 30, 40]  # the steps of a (4, 0.2) recipe's averaging checkpoints


def test_a_setting_picks_every_m_th_window_checkpoint_from_the_last() -> None:
    ten, recipe = list(range(101, 111)), avg.Variant(10, 0.3)
    assert avg.picked(ten, recipe, avg.Variant(10, 0.3)) == ten
    assert avg.picked(ten, recipe, avg.Variant(1, 0.03)) == [110]
    assert avg.picked(ten, recipe, avg.Variant(1, 0.3)) == [110]  # one point: the budget's end
    assert avg.picked(ten, recipe, avg.Variant(5, 0.15)) == [106, 107, 108, 109, 110]
    assert avg.picked(ten, recipe, avg.Variant(5, 0.3)) == [102, 104, 106, 108, 110]
    assert avg.picked(ten, recipe, avg.Variant(2, 0.3)) == [105, 110]
    assert avg.picked(ten, recipe, avg.Variant(4, 0.36)) == [101, 104, 107, 110]


@pytest.mark.parametrize(
    ("variant", "why"),
    [
        (avg.Variant(3, 0.1), "spacing 0.0333333"),  # not a multiple of 0.03
        (avg.Variant(6, 0.36), "spacing 0.06"),  # reaches back past the window
        (avg.Variant(20, 0.3), "spacing 0.015"),  # finer than the recipe's
    ],
)
def test_a_setting_whose_points_are_not_the_recipes_is_refused_by_name(
    variant: avg.Variant, why: str
) -> None:
    with pytest.raises(ValueError, match=f"--variants {variant.name}: .*{why}"):
        avg.picked(list(range(10)), avg.Variant(10, 0.3), variant)
    with pytest.raises(ValueError, match="9 window checkpoints where the recipe writes 10"):
        avg.picked(list(range(9)), avg.Variant(10, 0.3), avg.Variant(1, 0.03))


@pytest.mark.parametrize("text", ["5", "0/0.3", "5/0", "5/1.5", "x/0.3", "5/0.3,"])
def test_bad_variants_are_refused_naming_the_entry(text: str) -> None:
    with pytest.raises(ValueError, match=r"--variants: .* is not n/w"):
        avg.parse_variants(text)


@pytest.mark.parametrize("text", ["1,1.5", "0.6,x", "0.6,-1", "0.6,inf", ""])
def test_an_alpha_grid_without_the_fixed_alpha_or_with_a_bad_value_exits_2(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        avg.main(["--data-dir", "d", "--direction", "en-de", "--alphas", text])
    assert exit_.value.code == 2 and f"--alphas: {text!r} is not a list" in capsys.readouterr().err


def _run(tmp: Path) -> tuple[Path, list[Path], Tokenizer]:
    """A run folder with four window checkpoints of random tiny models, and its tokenizer."""
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(tmp / "tok.json")
    config = preset("tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4,
                    max_len=24, dropout=0.0)  # fmt: skip
    paths = []
    for step in WINDOW:
        torch.manual_seed(step)
        folder = tmp / "run" / "checkpoints" / "window" / f"step_{step:08d}"
        paths.append(save_checkpoint(folder, Transformer(config), {"step": step}, tmp / "tok.json"))
    return tmp / "run", paths, tokenizer


def _greedy(path: Path, tokenizer: Tokenizer) -> list[str]:
    model = load_checkpoint(path).model
    return translate_texts(model, tokenizer, TEXTS, DecodeOptions(beam_size=1))


def _write_gz(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(f"{line}\n" for line in lines))


def _data(tmp: Path, val: list[str], test: list[str]) -> Path:
    """A data folder whose en sources are TEXTS and de references ``val`` and ``test``."""
    data = tmp / "data"
    data.mkdir()
    for split, refs in (("val", val), ("test_2016_flickr", test)):
        _write_gz(data / f"{split}.en.gz", TEXTS)
        _write_gz(data / f"{split}.de.gz", refs)
    return data


def _store(tmp: Path, run: Path, scores: dict[str, dict[str, float]]) -> Path:
    """A result store with one aiayn run (seed 1, 40 steps, the (4, 0.2) recipe) of ``run``."""
    train = {"average_last": 4, "average_window": 0.2}
    result = {"seed": 1, "steps": 40, "scores": scores,
              "recipe": {"run_dir": str(run), "train": train}}  # fmt: skip
    folder = tmp / "store" / "en-de" / "aiayn" / "seed_1"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result), encoding="utf-8")
    return tmp / "store"


def test_the_study_scores_each_setting_on_its_own_average(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, paths, tokenizer = _run(tmp_path)
    every_second = average_checkpoints([paths[1], paths[3]], tmp_path / "avg_2")
    recipe = average_checkpoints(paths, tmp_path / "avg_4")
    last = _greedy(paths[-1], tokenizer)
    data = _data(tmp_path, _greedy(every_second, tokenizer), last)
    recorded = score(_greedy(recipe, tokenizer), last)["bleu"]
    store = _store(tmp_path, run, {"averaged, greedy": {"bleu": recorded}})
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(_common, "TABLES", tmp_path / "results")
    avg.main(["--data-dir", str(data), "--direction", "en-de", "--results-store", str(store),
              "--variants", "1/0.05,2/0.2", "--alphas", "0.6,1"])  # fmt: skip
    study = _common.read_json(tmp_path / "results" / "multi30k_averaging.json.gz")
    seed = study["directions"]["en-de"]["seeds"]["1"]
    assert list(seed) == ["1/0.05", "2/0.2", "4/0.2"]
    assert [seed[v]["steps"] for v in seed] == [[40], [20, 40], WINDOW]
    assert seed["1/0.05"]["rows"]["test, greedy"]["bleu"] == pytest.approx(100.0)
    assert seed["2/0.2"]["rows"]["validation, greedy"]["bleu"] == pytest.approx(100.0)
    assert seed["2/0.2"]["rows"]["test, greedy"]["bleu"] < 100.0
    assert seed["4/0.2"]["rows"]["test, greedy"]["bleu"] == pytest.approx(recorded)
    page = (tmp_path / "results" / "multi30k_averaging.md").read_text()
    assert "by at most 0.00 BLEU" in page and "| 2/0.2 | 20–40 of 40 |" in page


def test_a_setting_off_the_recipes_points_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, _, _ = _run(tmp_path)
    data, store = _data(tmp_path, TEXTS, TEXTS), _store(tmp_path, run, {})
    with pytest.raises(SystemExit) as exit_:
        avg.main(["--data-dir", str(data), "--direction", "en-de", "--results-store", str(store),
                  "--variants", "3/0.1"])  # fmt: skip
    assert exit_.value.code == 2
    assert "--variants 3/0.1: its checkpoints are not among the 4/0.2" in capsys.readouterr().err
