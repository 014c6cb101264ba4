"""The builders of tests/data/conftest.py (SentencePiece models, Marian vocabularies, Hugging
Face T5 tokenizers) for test folders other than tests/data: that conftest loaded once by path,
under one module name, so that every folder shares its cached models.

    from data_builders import data_conftest
    sentencepiece_models = data_conftest().sentencepiece_models
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_NAME = "_aiayn_tests_data_conftest"


def data_conftest() -> ModuleType:
    """tests/data/conftest.py as a module (loaded on the first call)."""
    if _NAME not in sys.modules:
        path = Path(__file__).resolve().parent / "data" / "conftest.py"
        spec = importlib.util.spec_from_file_location(_NAME, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[_NAME]
