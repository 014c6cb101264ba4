"""``aiayn convert``, ``fill-mask`` and ``embed`` on converted Hugging Face BERT folders, offline:
predictions and embeddings equal what transformers computes with the same weights and
vocabulary; bad requests are one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertTokenizerFast,
)

from aiayn.cli.main import main

RunCli = Callable[..., tuple[int, str, str]]  # the run_cli fixture (tests/cli/conftest.py)

CORPUS = [
    "the cat sat on the mat .",
    "a dog sat on the log .",
    "the cat and the dog are friends .",
    "paris is the capital of france .",
    "berlin is the capital of germany .",
    "she reads a book on the train .",
] * 5
TEXTS = ["the cat sat on the [MASK] .", "[MASK] is the capital of [MASK] ."]


def _config(**extra: Any) -> BertConfig:
    return BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def mlm(tmp_path_factory: pytest.TempPathFactory, hf_bert_folder: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bert")
    hf = BertForMaskedLM(_config())
    folder = hf_bert_folder(root / "hf", hf, CORPUS, 120)
    assert main(["convert", "--from-hf", str(folder), "--to", str(root / "ckpt")]) == 0
    return {"hf": hf, "tokenizer": BertTokenizerFast.from_pretrained(folder), "ckpt": root / "ckpt"}


@torch.no_grad()
def test_fill_mask_equals_transformers(mlm: dict[str, Any], run_cli: RunCli) -> None:
    code, out, err = run_cli("fill-mask", "--checkpoint", mlm["ckpt"], "--top-k", 3, *TEXTS)
    assert code == 0, err
    blocks = out.strip("\n").split("\n\n")
    assert len(blocks) == 2
    tok = mlm["tokenizer"]
    for text, block in zip(TEXTS, blocks, strict=True):
        enc = tok(text, return_tensors="pt")
        probs = torch.softmax(mlm["hf"](**enc).logits[0], dim=-1)
        masks = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[:, 0]
        lines = block.split("\n")
        assert len(lines) == 3 * len(masks)
        for m, position in enumerate(masks.tolist()):
            top = probs[position].topk(3)
            for r in range(3):
                p, token, sequence = lines[3 * m + r].split("\t")
                assert abs(float(p) - top.values[r].item()) < 1e-4
                assert token == tok.decode([int(top.indices[r])])  # specials spelled out
                filled = enc["input_ids"][0].clone()
                filled[position] = top.indices[r]
                assert sequence == tok.decode(filled, skip_special_tokens=True)


@torch.no_grad()
def test_embeddings_equal_mean_pooled_transformers(
    mlm: dict[str, Any], tmp_path: Path, run_cli: RunCli
) -> None:
    lines = ["the cat sat on the mat .", "paris is the capital of france .", "a dog"]
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    code, out, err = run_cli("embed", "--checkpoint", mlm["ckpt"], "-i", src)
    assert code == 0, err
    ours = torch.tensor([json.loads(line) for line in out.splitlines()])
    enc = mlm["tokenizer"](lines, padding=True, return_tensors="pt")
    hidden = mlm["hf"].bert(**enc).last_hidden_state
    real = enc["attention_mask"][:, :, None].float()
    want = torch.nn.functional.normalize((hidden * real).sum(1) / real.sum(1), dim=-1)
    assert ours.shape == want.shape and (ours - want).abs().max() < 1e-4
    npy = tmp_path / "e.npy"
    assert run_cli("embed", "--checkpoint", mlm["ckpt"], "-i", src, "-o", npy)[0] == 0
    assert np.allclose(np.load(npy), ours.numpy(), atol=1e-6)
    code, _, err = run_cli("embed", "--checkpoint", mlm["ckpt"], "-i", src, "-o", npy)
    assert code == 2 and "exists: pass --force" in err and "\n" not in err.strip()
    other = tmp_path / "other.txt"
    other.write_text("the cat sat on the mat .\nberlin is the capital of germany .\na cat\n")
    code, out, err = run_cli("embed", "--checkpoint", mlm["ckpt"], "--similarity", src, other)
    assert code == 0, err
    sims = [float(x) for x in out.split()]
    assert abs(sims[0] - 1.0) < 1e-5 and all(-1.0 <= s <= 1.0 + 1e-6 for s in sims)


def test_refusals_are_one_line(
    mlm: dict[str, Any], tmp_path: Path, run_cli: RunCli, hf_bert_folder: Any
) -> None:
    code, _, err = run_cli("fill-mask", "--checkpoint", mlm["ckpt"], "no mask here")
    assert code == 2 and "no [MASK] in 'no mask here'" in err and "\n" not in err.strip()
    long = "the cat [MASK] " + "sat " * 70 + "[MASK] ."  # max_position_embeddings 64
    code, _, err = run_cli("fill-mask", "--checkpoint", mlm["ckpt"], long)
    assert code == 2 and "\n" not in err.strip()
    assert "1 of the 2 [MASK] lie past the 64 tokens the model reads" in err
    hf = BertForSequenceClassification(_config(num_labels=3))
    folder = hf_bert_folder(tmp_path / "cls", hf, CORPUS, 120)
    assert run_cli("convert", "--from-hf", folder, "--to", tmp_path / "c")[0] == 0
    code, _, err = run_cli("fill-mask", "--checkpoint", tmp_path / "c", "a [MASK]")
    assert code == 2 and "head 'classification'; this needs 'mlm'" in err
    code, _, err = run_cli("translate", "--checkpoint", mlm["ckpt"])
    assert code == 2 and "holds a bert model" in err


@pytest.mark.parametrize("architecture", ["mlm", "classifier"])
def test_written_back_tokenizer_and_model_equal_the_original(
    architecture: str, tmp_path: Path, hf_bert_folder: Any
) -> None:
    """``aiayn convert --checkpoint --to-hf``: transformers' tokenizer of the written folder gives
    the original's ids (special tokens, lower-casing, pairs), its model the original's logits
    and labels."""
    labels = {"id2label": {0: "no", 1: "maybe", 2: "yes"}} if architecture == "classifier" else {}
    cls = BertForSequenceClassification if labels else BertForMaskedLM
    hf = cls(_config(**labels))
    folder = hf_bert_folder(tmp_path / "hf", hf, CORPUS, 120)
    assert main(["convert", "--from-hf", str(folder), "--to", str(tmp_path / "ckpt")]) == 0
    out = tmp_path / "back"
    assert main(["convert", "--checkpoint", str(tmp_path / "ckpt"), "--to-hf", str(out)]) == 0
    original = BertTokenizerFast.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(out)
    texts = [*TEXTS, "The CAT, unknown-word: Zürich!"]
    assert tokenizer(texts)["input_ids"] == original(texts)["input_ids"]
    assert (
        tokenizer(texts[0], texts[2])["token_type_ids"]
        == original(texts[0], texts[2])["token_type_ids"]
    )
    auto = AutoModelForSequenceClassification if labels else AutoModelForMaskedLM
    again = auto.from_pretrained(out).eval()
    batch = original(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        assert (again(**batch).logits - hf(**batch).logits).abs().max() < 1e-5
    if labels:
        assert again.config.id2label == hf.config.id2label
