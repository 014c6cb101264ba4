"""A tiny random model with a tokenizer, saved as a checkpoint, for the attention-map tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.config import preset
from aiayn.data.tokenizer import Tokenizer
from aiayn.models import Transformer

PAIRS = [
    ("the cat sat on the mat", "die katze sass auf der matte"),
    ("the dog sat on the sofa", "der hund sass auf dem sofa"),
    ("i see the cat", "ich sehe die katze"),
    ("we like the dog", "wir moegen den hund"),
    ("tom is my friend", "tom ist mein freund"),
]


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of a random 1+2-layer, 2-head model with a tiny joint BPE vocabulary."""
    root = tmp_path_factory.mktemp("attention_ckpt")
    tokenizer = Tokenizer.train([s for pair in PAIRS for s in pair], 300, min_frequency=1)
    tokenizer.save(root / "tokenizer.json")
    torch.manual_seed(0)
    config = preset(
        "tiny",
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        d_ff=64,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=2,
        dropout=0.1,
    )
    return save_checkpoint(root / "ckpt", Transformer(config), {"step": 0}, root / "tokenizer.json")
