"""BLEU/chrF: parity with sacreBLEU's own API, signatures, paper-BLEU compound splitting."""

from __future__ import annotations

import pytest
import sacrebleu

from aiayn.errors import UserError
from aiayn.evaluation import corpus_bleu, corpus_chrf, paper_bleu, split_compounds

HYPS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]
REFS = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]


def test_bleu_and_chrf_equal_sacrebleu() -> None:
    bleu = corpus_bleu(HYPS, REFS)
    assert bleu.score == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert "tok:13a" in bleu.signature and "case:mixed" in bleu.signature
    assert corpus_chrf(HYPS, REFS).score == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert corpus_bleu(REFS, REFS).score == pytest.approx(100.0)


def test_compound_split_and_paper_bleu() -> None:
    assert split_compounds("Ein-Mann-Zelt") == "Ein ##AT##-##AT## Mann ##AT##-##AT## Zelt"
    paper = paper_bleu(["Das ist ein Zwei-Mann-Zelt."], ["Das ist ein Drei-Mann-Zelt."])
    plain = corpus_bleu(["Das ist ein Zwei-Mann-Zelt."], ["Das ist ein Drei-Mann-Zelt."])
    assert paper.score > plain.score  # splitting turns one wrong word into one wrong of three
    assert "NOT sacreBLEU" in paper.name and "compound-split:yes" in paper.signature


def test_misaligned_inputs_are_an_error() -> None:
    with pytest.raises(UserError, match="2 hypotheses but 3 references"):
        corpus_bleu(HYPS[:2], REFS)
