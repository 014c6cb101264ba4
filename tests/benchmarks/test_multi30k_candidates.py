"""benchmarks/multi30k_candidates.py: a candidate's rows against the baseline's on the seeds both
ran, the spread rule, candidates of another protocol refused by name, and a candidate that changes
a step's cost compared at its own step budget only when given as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import multi30k_candidates as cand

PROTOCOL = {"minutes": None, "steps": {"aiayn": 100, "peer-same": 80}, "config": "c.yaml",
            "config_sha256": "x", "test_sentences": None, "alphas": [0.6], "device": "cuda",
            "threads": 2, "overrides": ["train.precision=fp32"]}  # fmt: skip


def _write(
    root: Path,
    seed: int,
    bleu: dict[str, float],
    machine: dict[str, str] | None = None,
    **protocol: object,
) -> None:
    path = root / "en-de" / "aiayn" / f"seed_{seed}" / "result.json"
    path.parent.mkdir(parents=True)
    result = {
        "seed": seed,
        "scores": {row: {"bleu": b} for row, b in bleu.items()},
        "protocol": {**PROTOCOL, **protocol},
        "machine": machine or {"gpu": "G", "torch": "t"},
    }
    path.write_text(json.dumps(result), encoding="utf-8")


def test_rows_compared_on_shared_seeds_with_the_spread_rule(tmp_path: Path) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    _write(base, 1, {"a": 30.0, "b": 20.0, "c": 10.0})  # row c: seed 1 only, in no table
    _write(base, 2, {"a": 31.0, "b": 21.0})
    _write(base, 3, {"a": 90.0, "b": 90.0})  # the candidate did not run seed 3: left out
    over = ["train.precision=fp32", "model.dropout=0.3"]
    _write(new, 1, {"a": 32.5, "b": 20.0}, overrides=over)
    _write(new, 2, {"a": 33.0, "b": 22.0}, overrides=over)
    rows = cand.compare(cand.aiayn_runs(base, "en-de"), cand.aiayn_runs(new, "en-de"))
    by = {r["row"]: r for r in rows}
    assert by["a"]["difference"] == pytest.approx(2.25)  # 32.75 − 30.5 > spread 1.0
    assert by["a"]["significant"] is True and by["a"]["seeds"] == [1, 2]
    assert by["b"]["difference"] == pytest.approx(0.5) and by["b"]["significant"] is False
    out = tmp_path / "page.md"
    cand.main(["--direction", "en-de", "--baseline", str(base), "--candidate", str(new),
               "--out", str(out)])  # fmt: skip
    page = out.read_text(encoding="utf-8")
    assert "### new: `model.dropout=0.3`" in page and "| a | 30.50 (30.00–31.00) |" in page
    assert "| 32.75 (32.50–33.00) | +2.25 | yes |" in page and "100 steps" in page
    assert "all its seeds (1, 2, 3)" in page  # the baseline alone keeps its seed 3
    assert "| a | 50.33 (30.00–90.00) | 30.00, 31.00, 90.00 |" in page and "| c |" not in page


def test_a_candidate_of_another_budget_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, new = tmp_path / "base", tmp_path / "new"
    _write(base, 1, {"a": 30.0})
    _write(new, 1, {"a": 31.0}, steps={"aiayn": 200, "peer-same": 80})
    _write(tmp_path / "peer", 1, {"a": 31.0}, steps={"aiayn": 100, "peer-same": 99})
    assert (
        cand.changes(
            json.loads((base / "en-de/aiayn/seed_1/result.json").read_text()),
            json.loads((tmp_path / "peer/en-de/aiayn/seed_1/result.json").read_text()),
            "peer",
        )
        == []
    )  # another peer count leaves aiayn's runs comparable
    with pytest.raises(SystemExit) as exit_:
        cand.main(["--direction", "en-de", "--baseline", str(base), "--candidate", str(new)])
    assert exit_.value.code == 2
    assert f"{new}: not comparable with the baseline (steps differ)" in capsys.readouterr().err


def test_a_rate_candidate_is_compared_at_its_own_budget_and_names_both(tmp_path: Path) -> None:
    base, new = tmp_path / "base", tmp_path / "vocab"
    _write(base, 1, {"a": 30.0})
    over = ["train.precision=fp32", "data.vocab_size=4000"]
    _write(new, 1, {"a": 31.0}, steps={"aiayn": 1140, "peer-same": 80}, overrides=over)
    out = tmp_path / "page.md"
    cand.main(["--direction", "en-de", "--baseline", str(base), "--rate-candidate", str(new),
               "--out", str(out)])  # fmt: skip
    page = out.read_text(encoding="utf-8")
    assert "### vocab: `data.vocab_size=4000`" in page
    assert "Its budget: 1,140 steps (the baseline's: 100 steps)." in page
    assert "| a | 30.00 (30.00–30.00) | 31.00 (31.00–31.00) | +1.00 |" in page
    _write(tmp_path / "other", 1, {"a": 31.0}, steps={"aiayn": 1140}, config_sha256="y")
    with pytest.raises(ValueError, match="config_sha256 differ"):  # the rest must still match
        cand.changes(
            json.loads((base / "en-de/aiayn/seed_1/result.json").read_text()),
            json.loads((tmp_path / "other/en-de/aiayn/seed_1/result.json").read_text()),
            "other",
            own_steps=True,
        )


def test_no_candidate_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cand.main(["--direction", "en-de", "--baseline", "runs/x"])
    assert exit_.value.code == 2
    assert "give at least one --candidate or --rate-candidate" in capsys.readouterr().err


def test_a_candidate_from_another_host_is_marked_in_its_table(tmp_path: Path) -> None:
    base, same, other = tmp_path / "base", tmp_path / "same", tmp_path / "other"
    amd, intel = {"cpu": "AMD (family 26)", "torch": "t"}, {"cpu": "Intel (family 6)", "torch": "t"}
    over = ["train.precision=fp32", "model.dropout=0.3"]
    for seed in (1, 2):
        _write(base, seed, {"a": 30.0}, amd)
        _write(same, seed, {"a": 31.0}, amd, overrides=over)
    _write(other, 1, {"a": 31.0}, amd, overrides=over)
    _write(other, 2, {"a": 31.0}, intel, overrides=over)  # one seed moved host
    out = tmp_path / "page.md"
    cand.main(["--direction", "en-de", "--baseline", str(base), "--candidate", str(same),
               "--candidate", str(other), "--out", str(out)])  # fmt: skip
    page = out.read_text(encoding="utf-8")
    assert "trained on AMD (family 26), torch t. BLEU" in page
    mine, theirs = page.split("### other")
    assert "Another host" not in mine
    assert (
        "Seeds 1, 2. **Another host:** trained on AMD (family 26), torch t; Intel (family 6), "
        "torch t; the baseline on AMD (family 26), torch t."
    ) in theirs
