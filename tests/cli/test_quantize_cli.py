"""``aiayn quantize`` and ``--quantize int8`` on every command that runs a model: an int8
checkpoint translates as the fp32 one quantised on load does, and every command runs with int8
weights (their outputs are held to the quantised models' own forward in tests/inference)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.images import ImagePreprocessor
from aiayn.layers.quantized import QuantizedLinear
from aiayn.models import BERT, GPT2, BertConfig, GPT2Config, Transformer
from aiayn.models.vit import ViT, ViTConfig

RunCli = Callable[..., tuple[int, str, str]]  # the run_cli fixture (tests/cli/conftest.py)
TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "."]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random fp32 checkpoints: mt (the paper's), gpt2, bert (MLM), bert-cls, vit."""
    root = tmp_path_factory.mktemp("ckpts")
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(root / "tok.json")
    torch.manual_seed(0)
    v = tokenizer.vocab_size
    mt = preset("tiny", vocab_size=v, d_model=32, d_ff=64, num_heads=4, max_len=12)
    ids = {"bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id}
    gpt2 = GPT2Config(v, 40, 32, 4, 2, **ids)
    bert = BertConfig(vocab_size=len(WORDS), max_len=32, d_model=32, num_heads=4, num_layers=1)
    vit = ViTConfig(
        image_size=16, patch_size=8, d_model=32, num_heads=4, num_layers=1, d_ff=64,
        num_labels=3, id2label=("a", "b", "c"),
    )  # fmt: skip
    vocab = BertTokenizer(
        HFTokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    )
    cls = bert.replace(head="classification", num_labels=2)
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(root / "img.png")
    return {
        "root": root,
        "mt": save_checkpoint(root / "mt", Transformer(mt), {}, root / "tok.json"),
        "gpt2": save_checkpoint(root / "gpt2", GPT2(gpt2), {}, root / "tok.json"),
        "bert": save_checkpoint(root / "bert", BERT(bert.replace(head="mlm")), {}, vocab),
        "cls": save_checkpoint(root / "cls", BERT(cls), {}, vocab),
        "vit": save_checkpoint(root / "vit", ViT(vit), {}, ImagePreprocessor(size=(16, 16))),
    }


def test_a_quantised_checkpoint_translates_as_quantising_on_load(
    ckpts: dict[str, Path], run_cli: RunCli, tmp_path: Path
) -> None:
    source = tmp_path / "src.txt"
    source.write_text("".join(t + "\n" for t in TEXTS))
    code, out, err = run_cli("quantize", "--checkpoint", ckpts["mt"], "--out", tmp_path / "q8")
    assert code == 0, err
    assert out.startswith(f"quantised {ckpts['mt']} -> {tmp_path / 'q8'}: transformer, int8")
    state = json.loads((tmp_path / "q8" / "state.json").read_text())
    assert state["quantization"] == "int8" and state["quantized_from"] == str(ckpts["mt"])
    assert isinstance(load_checkpoint(tmp_path / "q8").model.output_proj, QuantizedLinear)
    common = ("translate", "--input", source, "--device", "cpu", "--beam", "2")
    _, stored, _ = run_cli(*common, "--checkpoint", tmp_path / "q8")
    _, on_load, _ = run_cli(*common, "--checkpoint", ckpts["mt"], "--quantize", "int8")
    _, unpacked, _ = run_cli(*common, "--checkpoint", tmp_path / "q8", "--no-pack")
    assert stored == on_load == unpacked and len(stored.splitlines()) == len(TEXTS)


def test_an_empty_out_is_refused_by_name(
    ckpts: dict[str, Path], run_cli: RunCli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--out ''`` is no folder: not the current one, which "exists" (nor, with --force, one
    replaced by the checkpoint)."""
    monkeypatch.chdir(tmp_path)
    for force in ((), ("--force",)):
        code, out, err = run_cli("quantize", "--checkpoint", ckpts["mt"], "--out", "", *force)
        assert (code, out) == (2, "")
        assert err == "aiayn quantize: error: --out is empty: give a folder for the checkpoint\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "checkpoint", "extra"),
    [
        ("generate", "gpt2", ["a small", "--max-new-tokens", "3"]),
        ("embed", "bert", ["--input", "{root}/texts.txt"]),
        ("fill-mask", "bert", ["the [MASK] sat"]),
        ("classify-text", "cls", ["{root}/texts.txt"]),
        ("classify-image", "vit", ["{root}/img.png"]),
        ("evaluate", "gpt2", ["--text", "{root}/texts.txt"]),
    ],
)
def test_every_model_command_runs_int8(
    command: str, checkpoint: str, extra: list[str], ckpts: dict[str, Path], run_cli: RunCli
) -> None:
    root = ckpts["root"]
    (root / "texts.txt").write_text("the cat sat on the mat .\nthe mat\n")
    args = [a.format(root=root) for a in extra]
    ran = {}
    for mode in ("none", "int8"):
        code, out, err = run_cli(
            command, "--checkpoint", ckpts[checkpoint], *args, "--device", "cpu", "--quantize", mode
        )
        assert code == 0, err
        ran[mode] = out
    assert len(ran["int8"].splitlines()) == len(ran["none"].splitlines()) > 0
