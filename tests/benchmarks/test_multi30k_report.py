"""The report of benchmarks/train_multi30k.py: the rows compared with each peer, the spread
verdicts from seeds (by hand), and the paired bootstrap equal to sacreBLEU's ``--paired-bs``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import _multi30k_report as report

REFS = [
    "the cat sat on the mat",
    "a dog runs in the park",
    "she reads a book today",
    "the sun is very bright",
    "we play football after school",
    "he drinks coffee every morning",
]
GOOD = [
    "the cat sat on a mat",
    "a dog runs in park",
    "she reads the book today",
    "the sun is bright",
    "we play football after school",
    "he drinks tea every morning",
]
POOR = ["cat sat mat", "the dog is running", "she read book", "sun bright", "we play soccer", "he"]


def run(rows: dict[str, float]) -> dict[str, Any]:
    """A result with these rows' BLEU (and the other figures the tables read)."""
    return {
        "scores": {
            name: {"bleu": bleu, "chrf": 50.0, "brevity_penalty": 1.0, "length_ratio": 1.0}
            for name, bleu in rows.items()
        },
        "outputs": {name: GOOD if bleu > 30 else POOR for name, bleu in rows.items()},
        "steps": 100,
        "median_tgt_tokens_per_s": 1000.0,
    }


def results() -> report.Results:
    tuned = report.TUNED_ROW
    return {
        "aiayn": {
            1: run({"last, greedy": 36.0, "averaged, greedy": 38.0, tuned: 39.0}),
            2: run({"last, greedy": 37.0, "averaged, greedy": 38.5, tuned: 39.5}),
        },
        "peer-same": {
            1: run({"last, greedy": 35.0, "averaged, greedy": 37.5, tuned: 38.0}),
            2: run({"last, greedy": 33.0, "averaged, greedy": 38.0, tuned: 38.2}),
        },
        "peer-paper": {1: run({"last, greedy": 20.0, "last, beam 4, α 0.6": 21.0})},
    }


def test_same_recipe_rows_compared_by_name_with_the_spread_rule() -> None:
    rows = {r["aiayn"]: r for r in report.comparison(results(), "peer-same")}
    assert list(rows) == ["last, greedy", "averaged, greedy", report.TUNED_ROW]
    # last greedy: 36.5 - 34 = 2.5 against the peer's range 2: beyond it
    assert rows["last, greedy"]["difference"] == pytest.approx(2.5)
    assert rows["last, greedy"]["significant"] is True
    # averaged greedy: 38.25 - 37.75 = 0.5, ranges 0.5 and 0.5: not beyond
    assert rows["averaged, greedy"]["significant"] is False
    # tuned: 39.25 - 38.1 = 1.15 against the range 0.5: beyond
    assert rows[report.TUNED_ROW]["difference"] == pytest.approx(1.15)
    assert rows[report.TUNED_ROW]["significant"] is True


def test_paper_rows_compare_with_its_last_weights_and_one_seed_is_not_a_verdict() -> None:
    rows = report.comparison(results(), "peer-paper")
    assert [(r["aiayn"], r["peer"]) for r in rows] == [
        ("last, greedy", "peer-paper: last, greedy"),
        ("averaged, greedy", "peer-paper: last, greedy"),
        (report.TUNED_ROW, "peer-paper: last, beam 4, α 0.6"),
    ]  # aiayn has no α-0.6 beam rows here: those pairs are left out
    assert rows[0]["difference"] == pytest.approx(16.5)
    assert all(r["significant"] is None for r in rows)  # the paper peer ran one seed


def test_tables_name_every_row_and_the_verdicts() -> None:
    r = results()
    scores = "\n".join(report.score_table(r))
    assert "| aiayn | last, greedy | 36.50 | 36.00–37.00 | 0.71 |" in scores  # std √0.5
    assert "| peer-paper | last, greedy | 20.00 | 20.00–20.00 | – |" in scores
    table = "\n".join(report.comparison_table(report.comparison(r, "peer-same")))
    assert "| last, greedy | peer-same: last, greedy | +2.50 | 2.00 | yes |" in table


def test_bootstrap_pairs_each_seed_both_sides_ran() -> None:
    rows = report.bootstraps(results(), REFS)
    pairs = [(b["seed"], b["aiayn"], b["peer"]) for b in rows]
    assert pairs == [
        (1, "averaged, greedy", "peer-same: averaged, greedy"),
        (1, report.TUNED_ROW, f"peer-same: {report.TUNED_ROW}"),
        (2, "averaged, greedy", "peer-same: averaged, greedy"),
        (2, report.TUNED_ROW, f"peer-same: {report.TUNED_ROW}"),
        (1, "averaged, greedy", "peer-paper: last, greedy"),
        (1, report.TUNED_ROW, "peer-paper: last, beam 4, α 0.6"),
    ]


def test_paired_bootstrap_equals_sacrebleu_paired_bs(tmp_path: Path) -> None:
    for name, lines in (("ref", REFS), ("good", GOOD), ("poor", POOR)):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = ["ref.txt", "-i", "poor.txt", "good.txt", "--paired-bs", "-m", "bleu", "-f", "json"]
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    baseline, system = (entry["BLEU"] for entry in json.loads(cli.stdout))
    ours = report.paired_bootstrap(GOOD, POOR, REFS)
    assert ours["aiayn_bleu"] == pytest.approx(system["score"])
    assert ours["p_value"] == pytest.approx(system["p_value"])
    assert (ours["aiayn_mean"], ours["aiayn_ci"]) == pytest.approx((system["mean"], system["ci"]))
    assert (ours["peer_bleu"], ours["peer_mean"], ours["peer_ci"]) == pytest.approx(
        (baseline["score"], baseline["mean"], baseline["ci"])
    )
