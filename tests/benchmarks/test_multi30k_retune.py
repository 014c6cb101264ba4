"""benchmarks/multi30k_retune.py: a stored result brought to the grown-α rule gives what tuning
under the rule from the start gives (row, output, protocol); a result whose α lies inside its
grid only gains the rule; one whose weights are gone, or do not reproduce the stored table, is
left as it was; the peer's saved weights are found in its run folder."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import _peer_nmt as peer
import multi30k_retune as retune_mod
import train_multi30k as bench

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
VAL = {f"val {i}": " ".join(WORDS[i % 3 : i % 3 + 8]) for i in range(6)}
TEST = {f"test {i}": " ".join(WORDS[i % 2 : i % 2 + 8]) for i in range(5)}
REFS = VAL | TEST


def _fake_translate(sources: list[str], beam: int, alpha: float) -> list[str]:
    """The reference cut to α/3 of its 8 words (2, 3, 4, 5, 7, 8 words at α 0.6, 1, 1.5, 2, 2.5,
    3), an extra word at 3.5: α 3 scores best, and the grid 0.6…2's best is its edge, 2."""
    share = alpha / 3
    out = []
    for source in sources:
        words = REFS[source].split()
        n = round(len(words) * share)
        out.append(" ".join(words[:n] + ["extra"] * max(0, n - len(words))))
    return out


def _write(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _args(tmp: Path, *more: str) -> Any:
    for split, pairs in (("val", VAL), ("test_2016_flickr", TEST)):
        _write(tmp / f"{split}.en.gz", list(pairs))
        _write(tmp / f"{split}.de.gz", list(pairs.values()))
    return bench.parse_args(["--data-dir", str(tmp), "--run-dir", str(tmp / "runs"), *more])


def _stored(args: Any, system: str = "peer-same") -> dict[str, Any]:
    """A result tuned on ``args``' rule, in the layout train_multi30k.py writes."""
    sources, refs = bench.eval_set(args, "en-de", "test_2016_flickr")
    row, hyps = bench.tuned_row(args, "en-de", _fake_translate, sources, refs)
    return {
        "system": system,
        "seed": 1,
        "protocol": bench.protocol_of(args),
        "scores": {retune_mod.TUNED_ROW: {**row, "checkpoint": "averaged"}},
        "outputs": {retune_mod.TUNED_ROW: hyps},
    }


def _before_the_rule(result: dict[str, Any]) -> dict[str, Any]:
    old = copy.deepcopy(result)
    del old["protocol"]["alpha_growth"]
    return old


def _sets(args: Any) -> tuple[tuple[list[str], list[str]], ...]:
    return tuple(bench.eval_set(args, "en-de", s) for s in ("val", "test_2016_flickr"))


def test_retuning_gives_what_the_rule_gives_from_the_start(tmp_path: Path) -> None:
    now = _args(tmp_path)  # the rule: grown by 0.5 up to 4
    fresh = _stored(now)
    assert fresh["scores"][retune_mod.TUNED_ROW]["alpha"] == 3.0
    old = _before_the_rule(_stored(_args(tmp_path, "--alpha-grow-by", "0")))
    assert old["scores"][retune_mod.TUNED_ROW]["alpha"] == 2.0  # the grid's edge
    done = retune_mod.retune(old, bench.protocol_of(now), lambda _: _fake_translate, *_sets(now))
    assert done == "new α"
    assert old["scores"] == fresh["scores"] and old["outputs"] == fresh["outputs"]
    assert old["protocol"] == fresh["protocol"] and old["retuned"]["alpha_before"] == 2.0
    again = retune_mod.retune(old, bench.protocol_of(now), lambda _: None, *_sets(now))
    assert again == "current"


def test_an_alpha_inside_the_grid_only_gains_the_rule(tmp_path: Path) -> None:
    now = _args(tmp_path)
    inside = _args(tmp_path, "--alpha-grow-by", "0", "--alphas", "0.6,2,3,3.5")
    old = _before_the_rule(_stored(inside))
    before = copy.deepcopy(old)
    expected = bench.protocol_of(_args(tmp_path, "--alphas", "0.6,2,3,3.5"))
    assert retune_mod.retune(old, expected, lambda _: None, *_sets(now)) == "inside"
    assert old["scores"] == before["scores"] and "retuned" not in old
    assert old["protocol"] == expected


def test_gone_or_other_weights_leave_the_result_as_it_was(tmp_path: Path) -> None:
    now = _args(tmp_path)
    old = _before_the_rule(_stored(_args(tmp_path, "--alpha-grow-by", "0")))
    before = copy.deepcopy(old)
    expected = bench.protocol_of(now)
    assert retune_mod.retune(old, expected, lambda _: None, *_sets(now)) == "no weights"
    assert old == before

    def other(sources: list[str], beam: int, alpha: float) -> list[str]:
        return _fake_translate(sources, beam, alpha + 0.5)

    with pytest.raises(ValueError, match="not the run's weights"):
        retune_mod.retune(old, expected, lambda _: other, *_sets(now))
    assert old == before


def test_another_protocol_is_not_retuned_but_named(tmp_path: Path) -> None:
    now = _args(tmp_path)
    old = _before_the_rule(_stored(_args(tmp_path, "--alpha-grow-by", "0", "--minutes", "30")))
    with pytest.raises(ValueError, match=r"minutes: 30\.0 there, 60\.0 now"):
        retune_mod.retune(old, bench.protocol_of(now), lambda _: None, *_sets(now))
    other_growth = _stored(_args(tmp_path, "--alpha-grow-to", "2.5"))  # made under a rule
    with pytest.raises(ValueError, match=r"alpha_growth: \[0\.5, 2\.5\] there"):
        retune_mod.retune(other_growth, bench.protocol_of(now), lambda _: None, *_sets(now))


def test_the_peers_saved_weights_are_found_in_its_run_folder(tmp_path: Path) -> None:
    args = _args(tmp_path)
    cpu = torch.device("cpu")
    of = retune_mod.weights_of(args, "en-de", "peer-same", 1, cpu)
    assert of("averaged") is None  # nothing saved
    tokenizer = peer.train_bpe(list(REFS.values()) * 3, vocab_size=60, min_frequency=1)
    config = peer.PeerConfig(tokenizer.get_vocab_size(), d_model=16, num_heads=2, d_ff=32)
    torch.manual_seed(0)
    model = peer.TorchReference(config)
    work = bench.work_path(args, "en-de", "peer-same", 1)
    peer.save_weights(work, config, tokenizer, {"averaged": model.state_dict()})
    translate = of("averaged")
    assert translate is not None
    ours = bench.peer_translate(peer, model, tokenizer, cpu, None)
    assert translate(["two three"], 2, 0.6) == ours(["two three"], 2, 0.6)
    assert retune_mod.weights_of(args, "en-de", "aiayn", 1, cpu)("averaged") is None


def test_the_report_says_how_alpha_was_chosen_and_what_was_retuned(tmp_path: Path) -> None:
    args = _args(tmp_path)
    text = bench._alpha_text(bench.protocol_of(args), {"peer-same": {2: {"retuned": {}}}})
    assert "of 0.6, 1, 1.5, 2, grown by 0.5 while its largest α scores best (up to 4)" in text
    assert text.endswith("(benchmarks/multi30k_retune.py): peer-same seed 2.")
    plain = bench._alpha_text(bench.protocol_of(_args(tmp_path, "--alpha-grow-by", "0")), {})
    assert plain == "The tuned rows' α: the best on the validation set of 0.6, 1, 1.5, 2."
    assert json.dumps(bench.protocol_of(args)["alpha_growth"]) == "[0.5, 4.0]"


@pytest.mark.parametrize("bad", ["-0.5", "nan", "inf", "x"])
def test_a_bad_growth_is_refused_before_any_run(bad: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _args(tmp_path, "--alpha-grow-by", bad)
    with pytest.raises(SystemExit):
        _args(tmp_path, "--alpha-grow-to", bad)
