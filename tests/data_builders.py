"""Helpers of one test folder for the others, loaded by path: test folders are not packages, and
every folder's ``conftest.py`` has the same module name.

    from data_builders import data_conftest, load_test_file
    sentencepiece_models = data_conftest().sentencepiece_models   # tests/data/conftest.py
    cli = load_test_file("cli/conftest.py")                           # any file below tests/

Each file is loaded once, under one module name, so that every folder shares its cached models.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_test_file(relative: str) -> ModuleType:
    """The file ``tests/<relative>`` as a module (loaded on the first call)."""
    name = "_aiayn_tests_" + relative.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / relative
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:  # not half a module for the next caller: the same error again
            del sys.modules[name]
            raise
    return sys.modules[name]


def data_conftest() -> ModuleType:
    """tests/data/conftest.py: SentencePiece models, Marian vocabularies, T5 tokenizers."""
    return load_test_file("data/conftest.py")


def cpu_has(flag: str) -> bool:
    """Whether this CPU reports ``flag`` (e.g. ``avx512f``, ``avx512_vnni``) in /proc/cpuinfo:
    where it does, the native kernels that need it must build (False where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return flag in info.read().split()  # whole flags: avx512f is not avx512fp16
    except OSError:
        return False


def noisy_gpt2() -> object:
    """A small GPT-2 (vocabulary 40, 2 layers, d_model 32, no dropout) whose weights but the
    norms are drawn from N(0, 0.5²) (seed 0), in eval mode: sharp enough that searches and
    samplers disagree (the decoding tests' model)."""
    import torch

    from aiayn.models import GPT2, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, max_len=32, d_model=32, num_heads=4, num_layers=2,
                        dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0,
                        bos_id=1, eos_id=2, pad_id=0)  # fmt: skip
    model = GPT2(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.5)
    return model
