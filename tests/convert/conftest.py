"""Tiny Hugging Face GPT-2 folders with every parameter drawn at random, and the logits check.

Hugging Face initialises norms to 1 and biases to 0, which would hide a norm or bias mapped to
the wrong place; N(0, 0.3) draws for every tensor make each one visible in the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel

from aiayn.models.gpt2 import GPT2

VOCAB, POSITIONS = 300, 64
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "n_positions": POSITIONS,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
CORPUS = [
    "Hello world, hello there! The quick brown fox jumps over the lazy dog.",
    "  double  spaces and\nnew lines\n\n",
    "café naïve façade 東京 北京 😀 🚀 <|endoftext|> end",
]


class HFFolder(NamedTuple):
    """A saved Hugging Face model and its folder."""

    model: GPT2LMHeadModel  # eval mode
    path: Path


def random_hf_gpt2(seed: int = 0, **config: Any) -> GPT2LMHeadModel:
    """A GPT2LMHeadModel of the tiny config (with ``config`` changes), every tensor ~ N(0, 0.3)."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**{**TINY, **config}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


def write_bpe(folder: Path) -> None:
    """A byte-level BPE trained on :data:`CORPUS` (``<|endoftext|>`` special) as vocab.json +
    merges.txt."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS * 4, vocab_size=VOCAB, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder))


@pytest.fixture
def make_hf(tmp_path: Path) -> Callable[..., HFFolder]:
    """``make_hf(name, tokenizer=False, shard=None, **config)``: save a random tiny GPT-2."""

    def make(
        name: str = "hf", *, tokenizer: bool = False, shard: str | None = None, **config: Any
    ) -> HFFolder:
        model = random_hf_gpt2(**config)
        path = tmp_path / name
        if shard is None:
            model.save_pretrained(path)
        else:
            model.save_pretrained(path, max_shard_size=shard)
        if tokenizer:
            write_bpe(path)
        return HFFolder(model, path)

    return make


def left_padded_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) random ids and their (B, P) 0/1 mask: prompts of 64, 9, 1 and 30 tokens, left
    padded (the longest uses every learned position)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (4, POSITIONS), generator=g)
    mask = torch.zeros(4, POSITIONS, dtype=torch.long)
    for row, length in enumerate((POSITIONS, 9, 1, 30)):
        mask[row, POSITIONS - length :] = 1
    return tokens, mask


@torch.no_grad()
def hf_logits(hf: GPT2LMHeadModel, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face's logits with the positions aiayn's key padding gives (from the first real
    token of each row)."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return hf(input_ids=tokens, attention_mask=mask, position_ids=positions).logits


@torch.no_grad()
def aiayn_logits(model: GPT2, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return model.logits(model(tokens, key_padding=mask.bool()).hidden)


def max_logit_gap(hf: GPT2LMHeadModel, model: GPT2) -> float:
    """Largest |difference| of the two models' logits at the real positions of the batch."""
    tokens, mask = left_padded_batch()
    real = mask.bool()
    gap = hf_logits(hf, tokens, mask)[real] - aiayn_logits(model, tokens, mask)[real]
    return float(gap.abs().max())


@pytest.fixture
def logit_gap() -> Callable[[GPT2LMHeadModel, GPT2], float]:
    """:func:`max_logit_gap`: equal models give < 1e-4 in fp32."""
    return max_logit_gap
