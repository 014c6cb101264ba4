"""Fixtures for the command tests: the tiny SentencePiece models and the builders of Hugging Face
T5 and Marian tokenizers that the tokenizer tests use, from ``tests/data/conftest.py``; a
Hugging Face BERT folder with random weights; the command line run with its output captured.

The test folders are not packages, so that file cannot be imported by name (every conftest is
module ``conftest``): it is loaded from its path, once, and its fixtures are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from aiayn.cli.main import main
from data_builders import data_conftest

RunCli = Callable[..., tuple[int, str, str]]
"""``run_cli(*argv)`` -> (exit status, standard output, standard error) of ``aiayn argv``."""


_data = data_conftest()
sentencepiece_models = _data.sentencepiece_models
make_hf_t5_tokenizer = _data.make_hf_t5_tokenizer
make_marian_vocab = _data.make_marian_vocab


def _hf_bert_folder(root: Path, model: Any, corpus: Sequence[str], vocab_size: int) -> Path:
    """Write a Hugging Face folder at ``root``: ``model`` (a transformers BERT, changed in place
    and put in eval mode) with every parameter drawn at random, not transformers' init (norms at
    1, biases at 0, which would hide mis-mapped tensors), and a WordPiece vocabulary of
    ``corpus`` of at most ``vocab_size`` tokens."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizer

    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(corpus, vocab_size=vocab_size, min_frequency=1)
    root.mkdir(parents=True)
    trainer.save_model(str(root))
    # transformers 5 reads the vocabulary from ``vocab=`` (``vocab_file=`` is ignored: the
    # tokenizer would hold its 5 special tokens only and code every word as [UNK])
    tokenizer = BertTokenizer(vocab=str(root / "vocab.txt"))
    assert len(tokenizer) == len((root / "vocab.txt").read_text(encoding="utf-8").splitlines())
    for line in corpus:
        assert tokenizer.unk_token_id not in tokenizer(line)["input_ids"], line
    tokenizer.save_pretrained(root)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "LayerNorm" in name
            p.normal_(1.0 if "LayerNorm.weight" in name else 0.0, 0.2 if norm else 0.3)
    model.eval().save_pretrained(root)
    return root


@pytest.fixture(scope="session")
def hf_bert_folder() -> Callable[[Path, Any, Sequence[str], int], Path]:
    """``hf_bert_folder(root, model, corpus, vocab_size)``: see :func:`_hf_bert_folder`."""
    return _hf_bert_folder


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> RunCli:
    """``aiayn`` through its real entry point, what it printed captured (see :data:`RunCli`)."""

    def run(*argv: Any) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run
