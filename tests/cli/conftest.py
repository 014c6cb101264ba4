"""Fixtures for the command tests: the tiny SentencePiece models and the builders of Hugging Face
T5 and Marian tokenizers that the tokenizer tests use, from ``tests/data/conftest.py``.

The test folders are not packages, so that file cannot be imported by name (every conftest is
module ``conftest``): it is loaded from its path, once, and its fixtures are re-exported here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _data_conftest() -> ModuleType:
    name = "_aiayn_tests_data_conftest"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "data" / "conftest.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_data = _data_conftest()
sentencepiece_models = _data.sentencepiece_models
make_hf_t5_tokenizer = _data.make_hf_t5_tokenizer
make_marian_vocab = _data.make_marian_vocab
