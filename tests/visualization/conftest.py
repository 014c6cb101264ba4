"""A tiny random model with a tokenizer, saved as a checkpoint, for the attention-map tests;
random tiny Hugging Face folders of every text family, converted, for the family tests."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.config import preset
from aiayn.data.tokenizer import Tokenizer
from aiayn.models import Transformer
from data_builders import data_conftest

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


# -- Hugging Face folders of every text family, every parameter drawn at random ---------------
# The SentencePiece models and tokenizer builders of tests/data/conftest.py, loaded by path (the
# test folders are not packages), as tests/cli/conftest.py does.


_data = data_conftest()
sentencepiece_models = _data.sentencepiece_models
make_hf_t5_tokenizer = _data.make_hf_t5_tokenizer
make_marian_vocab = _data.make_marian_vocab

CORPUS = [
    "the cat sat on the mat . the dog sat on the sofa .",
    "tom is my friend and i see the cat every day .",
    "we like the dog , and the dog likes us .",
]


def redraw(model: Any, std: float = 0.3) -> Any:
    """Every parameter of a transformers model ~ N(0, std), norm gains ~ N(1, std) (its own init,
    norms at 1 and biases at 0, would hide a tensor mapped to the wrong place); eval mode."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = name.endswith("weight") and ("norm" in name.lower() or "ln_" in name)
            p.normal_(1.0 if gain else 0.0, std)
    return model.eval()


def _gpt2_folder(root: Path) -> Path:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS * 4, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    root.mkdir(parents=True)
    bpe.save_model(str(root))
    config = GPT2Config(
        vocab_size=300,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    redraw(GPT2LMHeadModel(config)).save_pretrained(root)
    return root


def _bert_folder(root: Path) -> Path:
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(CORPUS, vocab_size=200, min_frequency=1)
    root.mkdir(parents=True)
    trainer.save_model(str(root))
    BertTokenizer(vocab=str(root / "vocab.txt")).save_pretrained(root)  # transformers 5: vocab=
    config = BertConfig(
        vocab_size=200,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    redraw(BertForMaskedLM(config), 0.2).save_pretrained(root)
    return root


def _t5_folder(root: Path, spm_model: Path, make_tokenizer: Callable[[Path, int], Any]) -> Path:
    import transformers

    hub = root / "hub"
    hub.mkdir(parents=True)
    shutil.copy(spm_model, hub / "spiece.model")
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (hub / "tokenizer_config.json").write_text(json.dumps(special | {"extra_ids": 100}))
    folder = root / "hf"
    make_tokenizer(hub, 100).save_pretrained(folder)
    config = transformers.T5Config(
        vocab_size=512,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        feed_forward_proj="relu",
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    redraw(transformers.T5ForConditionalGeneration(config), 0.4).save_pretrained(folder)
    return folder


def _marian_folder(root: Path, models: dict[str, Path], make_vocab: Callable[..., Any]) -> Path:
    import transformers

    root.mkdir(parents=True)
    vocab = make_vocab(models["source"], models["target"])
    (root / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        str(models["source"]), str(models["target"]), str(root / "vocab.json")
    )
    pad = tokenizer.pad_token_id
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
    )
    model = transformers.MarianMTModel(config)
    positions = {n: p.clone() for n, p in model.named_parameters() if "embed_positions" in n}
    redraw(model)
    with torch.no_grad():  # the sinusoid tables stay as Hugging Face builds them
        for n, p in model.named_parameters():
            if n in positions:
                p.copy_(positions[n])
    folder = root / "hf"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class Converted(NamedTuple):
    """A Hugging Face folder and the aiayn checkpoint ``aiayn convert`` made of it."""

    hf: Path
    checkpoint: Path


def _convert(hf: Path, out: Path) -> Converted:
    from aiayn.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["convert", "--from-hf", str(hf), "--to", str(out)]) == 0
    return Converted(hf, out)


@pytest.fixture(scope="session")
def converted_families(
    tmp_path_factory: pytest.TempPathFactory,
    sentencepiece_models: dict[str, Path],
    make_hf_t5_tokenizer: Callable[[Path, int], Any],
    make_marian_vocab: Callable[..., Any],
) -> dict[str, Converted]:
    """Random tiny GPT-2, BERT (masked-LM head), T5 and Marian folders with their tokenizers,
    each converted by ``aiayn convert``; by Hugging Face ``model_type``."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("families")
    folders = {
        "gpt2": _gpt2_folder(root / "gpt2"),
        "bert": _bert_folder(root / "bert"),
        "t5": _t5_folder(root / "t5", sentencepiece_models["t5"], make_hf_t5_tokenizer),
        "marian": _marian_folder(root / "marian", sentencepiece_models, make_marian_vocab),
    }
    return {name: _convert(hf, root / f"{name}-aiayn") for name, hf in folders.items()}
