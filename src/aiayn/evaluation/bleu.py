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


def split_compounds(text: str) -> str:
    r"""The compound splitting of the WMT EN-DE "paper BLEU" (tensor2tensor's get_ende_bleu.sh,
    ``perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'``): ``Ein-Mann`` ->
    ``Ein ##AT##-##AT## Mann``, so that a hyphenated compound counts as 3 tokens. Matches do not
    overlap, as in Perl: ``a-b-c`` -> ``a ##AT##-##AT## b-c``."""
    import re

    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", text)


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Tokenized BLEU with compound splitting, as WMT14 EN-DE results are usually reported
    (the Transformer paper's Table 2, via tensor2tensor's get_ende_bleu.sh).

    Clearly *not* sacreBLEU: both sides are tokenized (sacreBLEU's 13a tokenizer standing in for
    Moses' tokenizer.perl, which it follows closely but not in every detail) and compound-split
    (:func:`split_compounds`), then scored as multi-bleu.perl does: on whitespace tokens, cased,
    without smoothing. Splitting inflates the score; use it only to compare with published
    tokenized figures, next to :func:`corpus_bleu`.
    """
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    _check_lengths(hypotheses, references)
    tokenize = Tokenizer13a()
    metric = sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True)
    result = metric.corpus_score(
        [split_compounds(tokenize(h)) for h in hypotheses],
        [[split_compounds(tokenize(r)) for r in references]],
    )
    return Score(
        "paper BLEU (13a-tokenized, compound-split; NOT sacreBLEU)",
        float(result.score),
        f"{metric.get_signature()}|pre-tok:13a|compound-split:yes",
    )
