"""Fixtures for the data-pipeline tests: the shipped demo corpus, a small tokenizer trained on it,
the optional real corpora under ``<repo>/../shared/data`` (tests using them skip without it), and
tiny SentencePiece models with builders of Hugging Face T5 and Marian tokenizers from them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from aiayn.data import Tokenizer, demo_corpus_path, read_parallel

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def demo_pairs() -> list[tuple[str, str]]:
    """All pairs of the shipped demo corpus."""
    return read_parallel(demo_corpus_path())


@pytest.fixture(scope="session")
def small_tokenizer(demo_pairs: list[tuple[str, str]]) -> Tokenizer:
    """A 600-token BPE trained on 400 demo pairs, every 50th (both sides)."""
    return Tokenizer.train((s for pair in demo_pairs[::50] for s in pair), vocab_size=600)


@pytest.fixture(scope="session")
def tatoeba_tsv() -> Path:
    """The full Tatoeba English–German file; skips the test where ../shared is absent."""
    path = SHARED_DATA / "tatoeba" / "eng-deu.tsv.gz"
    if not path.is_file():
        pytest.skip(f"real data not available ({path})")
    return path


# ----------------------------------------- SentencePiece models and Hugging Face tokenizers
# Shared with tests/cli/conftest.py, which loads this file by path (the test folders are not
# packages).


def _train_sentencepiece(lines: list[str], prefix: Path, vocab_size: int, **ids: Any) -> Path:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
        **ids,
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="session")
def sentencepiece_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three SentencePiece models trained on 500 demo pairs: T5-style (joint, pad 0, eos 1, unk 2,
    400 pieces) and Marian-style source (English) and target (German), 300 pieces each."""
    root = tmp_path_factory.mktemp("spm")
    pairs = read_parallel(demo_corpus_path())[::40]
    return {
        "t5": _train_sentencepiece(
            [s for p in pairs for s in p], root / "t5", 400, pad_id=0, eos_id=1, unk_id=2, bos_id=-1
        ),
        "source": _train_sentencepiece([p[0] for p in pairs], root / "source", 300),
        "target": _train_sentencepiece([p[1] for p in pairs], root / "target", 300),
    }


def _field(message: bytes, number: int) -> bytes:
    """The first length-delimited field ``number`` of a serialised protobuf message."""
    i = 0

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while True:
            byte = message[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while i < len(message):
        key = varint()
        wire = key & 7
        if wire == 0:
            varint()
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            size = varint()
            if key >> 3 == number:
                return message[i : i + size]
            i += size
    return b""


def _hf_t5_tokenizer(folder: Path, extra_ids: int) -> Any:
    """``transformers.T5Tokenizer`` from a folder with ``spiece.model`` (and, for transformers'
    own conversion, a ``tokenizer_config.json`` with ``extra_ids``): converted by transformers
    itself where protobuf is installed, else built as that conversion builds it (the pieces and
    scores, ``extra_ids`` sentinels, the model's precompiled normaliser: ModelProto field 3,
    field 2)."""
    import transformers

    try:
        import google.protobuf  # noqa: F401  (transformers reads spiece.model with it)
    except ImportError:
        pass
    else:
        return transformers.T5Tokenizer.from_pretrained(folder)
    data = (folder / "spiece.model").read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=data)
    n = sp.get_piece_size()
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(n)]
    vocab += [(f"<extra_id_{k}>", 0.0) for k in reversed(range(extra_ids))]
    control = [
        transformers.AddedToken(sp.id_to_piece(i), normalized=False, special=True)
        for i in range(n)
        if sp.is_control(i)
    ]
    return transformers.T5Tokenizer(
        vocab=vocab,
        _spm_precompiled_charsmap=_field(_field(data, 3), 2) or None,
        extra_ids=extra_ids,
        additional_special_tokens=control,
    )


@pytest.fixture(scope="session")
def make_hf_t5_tokenizer() -> Callable[[Path, int], Any]:
    """``make_hf_t5_tokenizer(folder, extra_ids)``: Hugging Face's T5 tokenizer of the
    ``spiece.model`` in ``folder`` (skips the test without transformers)."""
    pytest.importorskip("transformers")
    return _hf_t5_tokenizer


def _marian_vocab(*models: Path, codes: tuple[str, ...] = ()) -> dict[str, int]:
    vocab = {"</s>": 0, "<unk>": 1}
    for code in codes:
        vocab[code] = len(vocab)
    for model in models:
        sp = spm.SentencePieceProcessor(model_file=str(model))
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


@pytest.fixture(scope="session")
def make_marian_vocab() -> Callable[..., dict[str, int]]:
    """``make_marian_vocab(*spm_models, codes=())``: a Marian vocabulary (vocab.json's mapping):
    ``</s>`` 0, ``<unk>`` 1, the language ``codes``, the models' pieces, ``<pad>`` last."""
    return _marian_vocab
