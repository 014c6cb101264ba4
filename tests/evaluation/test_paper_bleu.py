"""The paper's WMT14 EN-DE BLEU (tokenized, compound-split, as tensor2tensor's get_ende_bleu.sh
then multi-bleu.perl), checked against n-gram counts worked out by hand."""

from __future__ import annotations

import math

import pytest

from aiayn.evaluation import corpus_bleu, paper_bleu, split_compounds


def test_split_compounds_follows_the_perl_substitution() -> None:
    # s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: non-overlapping, so a one-letter middle is not split
    assert split_compounds("Zwei-Mann-Zelt") == "Zwei ##AT##-##AT## Mann ##AT##-##AT## Zelt"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("ein - Zelt") == "ein - Zelt"  # a free-standing dash stays
    assert split_compounds("2014-2015") == "2014 ##AT##-##AT## 2015"


def test_paper_bleu_by_hand() -> None:
    hyp, ref = "Ein Zwei-Mann-Zelt steht im Wald.", "Ein Drei-Mann-Zelt steht im Wald."
    # tokenized and split, both sides have 10 tokens; only "Zwei" (position 1) is wrong:
    # Ein Zwei ##AT##-##AT## Mann ##AT##-##AT## Zelt steht im Wald .
    # matches: 1-grams 9/10, 2-grams 7/9, 3-grams 6/8, 4-grams 5/7; brevity penalty 1
    expected = 100 * (9 / 10 * 7 / 9 * 6 / 8 * 5 / 7) ** 0.25
    assert paper_bleu([hyp], [ref]).score == pytest.approx(expected)  # 78.25
    # sacreBLEU sees 6 tokens, the compound one of them: 5/6, 3/5, 2/4, 1/3
    plain = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert corpus_bleu([hyp], [ref]).score == pytest.approx(plain)  # 53.73


def test_paper_bleu_brevity_penalty_by_hand() -> None:
    hyp, ref = "Ein Drei-Mann-Zelt steht.", "Ein Drei-Mann-Zelt steht im Wald."
    # 8 hypothesis tokens against 10: BP = exp(1 - 10/8); only n-grams ending in "steht ." miss:
    # 8/8, 6/7, 5/6, 4/5
    expected = 100 * math.exp(1 - 10 / 8) * (6 / 7 * 5 / 6 * 4 / 5) ** 0.25
    score = paper_bleu([hyp], [ref])
    assert score.score == pytest.approx(expected)  # 67.71
    assert "smooth:none" in score.signature and "compound-split:yes" in score.signature


def test_paper_bleu_is_unsmoothed_like_multi_bleu() -> None:
    # no 4-gram in common: multi-bleu.perl gives 0, where sacreBLEU's default smoothing would not
    assert paper_bleu(["Zwei Hunde laufen schnell"], ["Zwei Hunde rennen schnell"]).score == 0.0
    assert corpus_bleu(["Zwei Hunde laufen schnell"], ["Zwei Hunde rennen schnell"]).score > 0
