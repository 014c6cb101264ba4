"""Evaluation: sacreBLEU BLEU and chrF."""

from aiayn.evaluation.bleu import Score, corpus_bleu, corpus_chrf

__all__ = ["Score", "corpus_bleu", "corpus_chrf"]
