"""Evaluation: sacreBLEU BLEU and chrF."""

from aiayn.evaluation.bleu import Score, corpus_bleu, corpus_chrf, paper_bleu, split_compounds

__all__ = ["Score", "corpus_bleu", "corpus_chrf", "paper_bleu", "split_compounds"]
