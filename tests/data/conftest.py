"""Fixtures for the data-pipeline tests: the shipped demo corpus, a small tokenizer trained on it,
and the optional real corpora under ``<repo>/../shared/data`` (tests using them skip without it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
