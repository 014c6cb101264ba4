"""Tuning α on a validation set: the length figures, the choice rule, the saved record."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from aiayn.errors import UserError
from aiayn.evaluation.tuning import (
    TUNED_ALPHA_FILE,
    LengthScore,
    choose_alpha,
    length_score,
    next_alpha,
    read_tuned_alpha,
    tune_alpha,
    tuned_record,
)


def _score(bleu: float, ratio: float) -> LengthScore:
    return LengthScore(bleu, 1.0, ratio, 0, 0)


def test_length_score_by_hand() -> None:
    # 3 hypothesis tokens against 4 reference tokens: ratio 3/4, BP = exp(1 - 4/3)
    s = length_score(["a b c"], ["a b c d"])
    assert (s.hyp_len, s.ref_len, s.ratio) == (3, 4, 0.75)
    assert s.bp == pytest.approx(math.exp(1 - 4 / 3), abs=1e-4)
    longer = length_score(["a b c d e"], ["a b c d"])
    assert longer.bp == 1.0 and longer.ratio == 1.25
    with pytest.raises(UserError, match="align"):
        length_score(["a"], ["a", "b"])


def test_choose_alpha_takes_bleu_then_length_then_the_smaller_alpha() -> None:
    assert choose_alpha({0.6: _score(33.4, 0.94), 1.0: _score(33.8, 0.96)}) == 1.0
    # equal BLEU: the ratio closer to 1 (in log: 0.8 is farther from 1 than 1.2)
    assert choose_alpha({0.6: _score(30.0, 0.8), 1.5: _score(30.0, 1.2)}) == 1.5
    assert choose_alpha({1.0: _score(30.0, 0.9), 0.3: _score(30.0, 0.9)}) == 0.3
    with pytest.raises(ValueError):
        choose_alpha({})


def test_choose_alpha_with_empty_outputs() -> None:
    # an untrained model can output nothing at every α: BLEU 0 and ratio 0 everywhere
    assert choose_alpha({0.6: _score(0.0, 0.0), 1.0: _score(0.0, 0.0)}) == 0.6
    assert choose_alpha({0.6: _score(0.0, 0.0), 1.0: _score(0.0, 0.5)}) == 1.0
    empty = length_score(["", ""], ["a b", "c"])
    assert empty.ratio == 0.0 and empty.bleu == 0.0


def test_tune_alpha_decodes_each_alpha_and_picks_the_best() -> None:
    refs = ["a b c d e f"]
    lengths = {0.0: 3, 0.5: 5, 1.0: 6, 2.0: 8}  # a longer output as α grows
    decoded: list[float] = []

    def decode(alpha: float) -> list[str]:
        decoded.append(alpha)
        return [" ".join("abcdefgh"[: lengths[alpha]])]

    alpha, scores = tune_alpha(decode, refs, [2.0, 0.0, 1.0, 0.5, 1.0])
    assert decoded == [0.0, 0.5, 1.0, 2.0]  # sorted, once each
    assert alpha == 1.0 and scores[1.0].ratio == 1.0 and scores[0.0].ratio == 0.5
    with pytest.raises(UserError, match="grid"):
        tune_alpha(decode, refs, [-1.0])


def test_the_grid_grows_while_its_largest_alpha_scores_best() -> None:
    refs = ["a b c d e f g h"]
    lengths = {0.6: 3, 1.0: 4, 1.5: 6, 2.0: 7, 2.5: 8, 3.0: 9, 3.5: 10}  # longer with α

    decoded: list[float] = []

    def decode(alpha: float) -> list[str]:
        decoded.append(alpha)
        return [" ".join("abcdefghij"[: lengths[alpha]])]

    grid = [0.6, 1.0, 1.5, 2.0]
    assert tune_alpha(decode, refs, grid)[0] == 2.0  # the edge of the grid as given
    decoded.clear()
    alpha, scores = tune_alpha(decode, refs, grid, grow_by=0.5, grow_to=4.0)
    # 2.5 gives all 8 words (BLEU 100); 3.0 is longer and no better: the growth stops there
    assert (alpha, decoded) == (2.5, [0.6, 1.0, 1.5, 2.0, 2.5, 3.0])
    assert list(scores) == [0.6, 1.0, 1.5, 2.0, 2.5, 3.0]
    # a table measured before is not decoded again: only the growth is
    decoded.clear()
    known = {a: scores[a] for a in grid}
    again = tune_alpha(decode, refs, grid, known=known, grow_by=0.5, grow_to=4.0)
    assert again == (alpha, scores) and decoded == [2.5, 3.0]
    decoded.clear()  # bounded by grow_to: 2.5 is beyond 2.4
    assert tune_alpha(decode, refs, grid, grow_by=0.5, grow_to=2.4)[0] == 2.0
    assert decoded == grid
    with pytest.raises(UserError, match="grow_by"):
        tune_alpha(decode, refs, grid, grow_by=float("nan"), grow_to=4.0)
    with pytest.raises(UserError, match=r"each α of the grid must be in \[0, 10\], got nan"):
        tune_alpha(decode, refs, [0.6, float("nan")])
    with pytest.raises(UserError, match=r"each α of the grid must be in \[0, 10\], got -1"):
        tune_alpha(decode, refs, [-1.0])
    with pytest.raises(UserError, match="at least one α"):
        tune_alpha(decode, refs, [])


def test_next_alpha_by_hand() -> None:
    table = {1.0: _score(30.0, 0.9), 2.0: _score(31.0, 0.95)}
    assert next_alpha(table, 0.5, 4.0) == 2.5
    assert next_alpha(table, 0.0, 4.0) is None  # no growth asked
    assert next_alpha({**table, 2.5: _score(30.5, 1.02)}, 0.5, 4.0) is None  # 2.0 is inside
    assert next_alpha({0.1: _score(1.0, 0.5), 0.2: _score(2.0, 0.6)}, 0.1, 1.0) == 0.3
    assert next_alpha({}, 0.5, 4.0) is None


def test_tuned_alpha_round_trip_and_refusals(tmp_path: Path) -> None:
    scores = {0.6: _score(33.4, 0.94), 1.2: _score(33.9, 0.98)}
    record = tuned_record(
        1.2,
        scores,
        beam_size=4,
        length_penalty="gnmt",
        source="val.de",
        reference="val.en",
        sentences=1014,
    )
    with pytest.raises(UserError, match="aiayn tune-alpha --checkpoint"):
        read_tuned_alpha(tmp_path)
    record.save(tmp_path)
    assert read_tuned_alpha(tmp_path) == record
    assert set(record.scores) == {"0.6", "1.2"}
    with pytest.raises(UserError, match="--force"):
        record.save(tmp_path)
    record.save(tmp_path, force=True)
    (tmp_path / TUNED_ALPHA_FILE).write_text('{"alpha": -1}')
    with pytest.raises(UserError, match="not a tune-alpha result"):
        read_tuned_alpha(tmp_path)
