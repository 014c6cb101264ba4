"""Corpus BLEU and chrF with sacreBLEU: detokenized, cased, with the signature that makes the
score reproducible (Post, 2018)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sacrebleu


@dataclass(frozen=True)
class Score:
    """A metric value with its sacreBLEU signature."""

    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Detokenized, cased corpus BLEU (sacreBLEU defaults: 13a tokenizer, exp smoothing)."""
    _check_lengths(hypotheses, references)
    metric = sacrebleu.BLEU()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return Score("BLEU", float(result.score), str(metric.get_signature()))


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Corpus chrF (character n-gram F-score, β = 2)."""
    _check_lengths(hypotheses, references)
    metric = sacrebleu.CHRF()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return Score("chrF", float(result.score), str(metric.get_signature()))


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        from aiayn.errors import UserError

        raise UserError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must align"
        )
