"""``aiayn classify-text`` on a converted Hugging Face ``BertForSequenceClassification``, offline:
the top labels and probabilities equal transformers' own, for single texts and pairs, from a file
and from standard input; the config's label names are printed; bad requests are one-line
errors."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertTokenizerFast,
)

from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint, save_checkpoint
from aiayn.cli.main import main
from aiayn.models.bert import BERT

RunCli = Callable[..., tuple[int, str, str]]  # the run_cli fixture (tests/cli/conftest.py)

CORPUS = [
    "the cat sat on the mat .",
    "a dog sat on the log .",
    "paris is the capital of france .",
    "she reads a book on the train .",
] * 5
TEXTS = ["the cat sat on the mat .", "paris is a dog", "a book", "she sat on the log ."]
PAIRS = [("the cat sat", "on the mat ."), ("paris is", "the capital"), ("a", "")]


def _config(**extra: Any) -> BertConfig:
    return BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, hf_bert_folder: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("classify_text")
    hf = BertForSequenceClassification(_config(num_labels=3))
    folder = hf_bert_folder(root / "hf", hf, CORPUS, 100)
    assert main(["convert", "--from-hf", str(folder), "--to", str(root / "ckpt")]) == 0
    return {"hf": hf, "tokenizer": BertTokenizerFast.from_pretrained(folder), "ckpt": root / "ckpt"}


HF_NAMES = ("LABEL_0", "LABEL_1", "LABEL_2")  # what transformers writes for num_labels=3


def _check(out: str, probs: torch.Tensor, k: int, names: tuple[str, ...]) -> None:
    lines = out.splitlines()
    assert len(lines) == len(probs)
    for line, row in zip(lines, probs, strict=True):
        fields = line.split("\t")
        assert len(fields) == 2 * k
        top = row.topk(k)
        assert fields[0::2] == [names[i] for i in top.indices.tolist()]
        probabilities = [float(p) for p in fields[1::2]]
        assert probabilities == pytest.approx(top.values.tolist(), abs=1e-4)


@torch.no_grad()
def test_labels_equal_transformers(
    converted: dict[str, Any], tmp_path: Path, run_cli: RunCli
) -> None:
    src = tmp_path / "texts.txt"
    src.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    code, out, err = run_cli(
        "classify-text", "--checkpoint", converted["ckpt"], src, "--top-k", "3",
        "--batch-size", "3",
    )  # fmt: skip
    assert code == 0, err
    enc = converted["tokenizer"](TEXTS, padding=True, return_tensors="pt")
    probs = torch.softmax(converted["hf"](**enc).logits, dim=-1)
    _check(out, probs, 3, HF_NAMES)  # the converted folder's id2label: transformers' names


@torch.no_grad()
def test_pairs_from_standard_input(
    converted: dict[str, Any], monkeypatch: pytest.MonkeyPatch, run_cli: RunCli
) -> None:
    data = "".join(f"{a}\t{b}\n" for a, b in PAIRS).encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, err = run_cli("classify-text", "--checkpoint", converted["ckpt"])
    assert code == 0, err
    first, second = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    enc = converted["tokenizer"](first, second, padding=True, return_tensors="pt")
    probs = torch.softmax(converted["hf"](**enc).logits, dim=-1)
    _check(out, probs, 1, HF_NAMES)


@torch.no_grad()
def test_the_checkpoint_label_names_are_printed(
    converted: dict[str, Any], tmp_path: Path, run_cli: RunCli
) -> None:
    ckpt = load_checkpoint(converted["ckpt"], expect=BERT)
    names = ("negative", "neutral", "positive")
    model = BERT(ckpt.config.replace(id2label=names))
    model.load_state_dict(ckpt.model.state_dict())
    named = save_checkpoint(tmp_path / "named", model, {}, checkpoint_tokenizer(ckpt.path))
    src = tmp_path / "texts.txt"
    src.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    code, out, err = run_cli("classify-text", "--checkpoint", named, src, "--top-k", "2")
    assert code == 0, err
    enc = converted["tokenizer"](TEXTS, padding=True, return_tensors="pt")
    _check(out, torch.softmax(converted["hf"](**enc).logits, dim=-1), 2, names)


def test_refusals_are_one_line(
    converted: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    run_cli: RunCli,
    hf_bert_folder: Any,
) -> None:
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("a text\ntwo\ttexts\n", encoding="utf-8")
    tabs = tmp_path / "tabs.txt"
    tabs.write_text("a\tb\tc\n", encoding="utf-8")
    ckpt = converted["ckpt"]
    cases = [
        ((mixed,), "line 2: a pair where line 1 has one text"),
        ((tabs,), "line 1: more than one tab"),
        ((mixed, "--top-k", "4"), "--top-k must be in 1..3"),
        ((tmp_path / "missing.txt",), "missing.txt"),
    ]
    for args, message in cases:
        code, _, err = run_cli("classify-text", "--checkpoint", ckpt, *args)
        assert code == 2 and message in err and "\n" not in err.strip(), err
    mlm = hf_bert_folder(tmp_path / "mlm_hf", BertForMaskedLM(_config()), CORPUS, 100)
    assert run_cli("convert", "--from-hf", mlm, "--to", tmp_path / "mlm")[0] == 0
    code, _, err = run_cli("classify-text", "--checkpoint", tmp_path / "mlm", mixed)
    assert code == 2 and "head 'mlm'; this needs 'classification'" in err
    with pytest.raises(SystemExit) as exit_:  # argparse: its usage, then the error
        main(["classify-text", "--checkpoint", str(ckpt), str(mixed), "--top-k", "0"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and "argument --top-k: must be >= 1, got 0" in err
