"""Data for machine-translation training (§5.1): corpus reading and cleaning, the joint BPE
vocabulary, encoded datasets, token-budget batching and collation.

Typical use::

    pairs, report = filter_pairs(read_parallel(demo_corpus_path()))
    tokenizer = Tokenizer.train((s for pair in pairs for s in pair), vocab_size=8000)
    dataset = ParallelDataset.from_pairs(pairs, tokenizer, max_tokens_per_sentence=128)
    sampler = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, 4096, seed=1)
    for indices in sampler.batches(epoch):
        batch = dataset.collate(indices)  # batch.src (B, S), batch.tgt_in / tgt_out (B, T)

The built-in demo corpus (:func:`demo_corpus_path`) is a 20,000-pair English–German subset of
the Tatoeba sentences (CC BY 2.0, "www.manythings.org/anki and tatoeba.org"; see NOTICE).
"""

from __future__ import annotations

from pathlib import Path

from aiayn.data.batching import (
    Batch,
    Example,
    ParallelDataset,
    TokenBatchSampler,
    collate,
    padding_fraction,
)
from aiayn.data.corpus import FilterReport, filter_pairs, normalize, read_lines, read_parallel
from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, Tokenizer

__all__ = [
    "BOS_ID",
    "DEMO_CORPUS_NAME",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "Batch",
    "Example",
    "FilterReport",
    "ParallelDataset",
    "TokenBatchSampler",
    "Tokenizer",
    "collate",
    "demo_corpus_path",
    "filter_pairs",
    "normalize",
    "padding_fraction",
    "read_lines",
    "read_parallel",
]

DEMO_CORPUS_NAME = "tatoeba_en_de.tsv.gz"


def demo_corpus_path() -> Path:
    """Path of the built-in demo corpus: a gzip TSV of ~20,000 ``English<TAB>German`` pairs.

    Read it with ``read_parallel(demo_corpus_path())``. The file ships inside the package
    (made by ``scripts/make_demo_corpus.py``); its licence and attribution are in NOTICE.
    """
    return Path(__file__).resolve().parent / "demo" / DEMO_CORPUS_NAME
