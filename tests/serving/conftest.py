"""Fixtures for the service tests: tiny checkpoints of every served family (random weights), and
the apps serving them through FastAPI's in-process test client.

The Hugging Face BERT folder builder of the command tests is loaded from its file (the test
folders are not packages)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.decoding import GenerateOptions
from aiayn.decoding.generate import continuation, generate_ids
from aiayn.models import Transformer
from aiayn.models.gpt2 import GPT2, GPT2Config
from aiayn.serving import ServeOptions, create_app, load_served_model
from aiayn.serving.metrics import Metrics
from data_builders import load_test_file

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]
BERT_CORPUS = [
    "the cat sat on the mat .",
    "a dog sat on the log .",
    "paris is the capital of france .",
    "she reads a book on the train .",
] * 5


def _cli_conftest() -> ModuleType:
    return load_test_file("cli/conftest.py")


def _tokenizer(folder: Path) -> Tokenizer:
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(folder / "tok.json")
    return tokenizer


def make_translation(folder: Path) -> Path:
    """A tiny paper's model (random weights) with its tokenizer."""
    tokenizer = _tokenizer(folder)
    torch.manual_seed(0)
    config = preset(
        "tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4, max_len=24
    )
    return save_checkpoint(folder / "mt", Transformer(config), {"step": 1}, folder / "tok.json")


def make_gpt2(folder: Path) -> Path:
    """A tiny GPT-2 (random weights, LayerNorms left at 1 and 0) with its tokenizer."""
    tokenizer = _tokenizer(folder)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=tokenizer.vocab_size, max_len=40, d_model=32, num_heads=4, num_layers=2,
        dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0, bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
    )  # fmt: skip
    model = GPT2(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.3)
    return save_checkpoint(folder / "lm", model, {"step": 1}, folder / "tok.json")


def make_bert(folder: Path, head: str) -> Path:
    """A converted Hugging Face BERT (``mlm`` or ``classification`` with 3 labels)."""
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
        **({"num_labels": 3} if head == "classification" else {}),
    )  # fmt: skip
    hf = BertForMaskedLM(config) if head == "mlm" else BertForSequenceClassification(config)
    hf_folder = _cli_conftest()._hf_bert_folder(folder / f"hf-{head}", hf, BERT_CORPUS, 100)
    assert main(["convert", "--from-hf", str(hf_folder), "--to", str(folder / head)]) == 0
    return folder / head


def make_vit(folder: Path) -> Path:
    """A converted Hugging Face ViT classifier of 32 × 32 images, 4 labels."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    labels = {0: "cat", 1: "dog", 2: "fox", 3: "owl"}
    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=4, id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )  # fmt: skip
    torch.manual_seed(0)
    hf = ViTForImageClassification(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "layernorm" in name and name.endswith("weight") else 0.0, 0.3)
    hf.save_pretrained(folder / "hf-vit")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder / "hf-vit")
    assert main(["convert", "--from-hf", str(folder / "hf-vit"), "--to", str(folder / "vit")]) == 0
    return folder / "vit"


def png(seed: int, size: tuple[int, int] = (40, 30)) -> bytes:
    """A random RGB PNG image's bytes."""
    import io

    from PIL import Image

    array = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every served family's tiny checkpoint, by model name."""
    root = tmp_path_factory.mktemp("serving")
    folders = {name: root / name for name in ("mt", "lm", "bert", "vit")}
    for folder in folders.values():
        folder.mkdir()
    return {
        "mt": make_translation(folders["mt"]),
        "lm": make_gpt2(folders["lm"]),
        "mlm": make_bert(folders["bert"], "mlm"),
        "cls": make_bert(folders["bert"], "classification"),
        "vit": make_vit(folders["vit"]),
    }


def serve(
    checkpoints: dict[str, Path], names: Any = None, api_key: str | None = None, **options: Any
) -> TestClient:
    """A test client of an app serving the ``names`` checkpoints (default: all)."""
    opts = ServeOptions(**options)
    metrics = Metrics()
    names = list(checkpoints) if names is None else names
    models = [load_served_model(n, checkpoints[n], opts, metrics) for n in names]
    return TestClient(create_app(models, opts, metrics, api_key=api_key))


@pytest.fixture(scope="module")
def client(checkpoints: dict[str, Path]) -> Iterator[TestClient]:
    """Every checkpoint served with the default options, workers running."""
    with serve(checkpoints) as c:
        yield c


Serve = Any
"""``serve(checkpoints, names=None, api_key=None, **options)``: see :func:`serve`."""


@pytest.fixture(scope="session")
def serve_app() -> Serve:
    """:func:`serve`, for the tests (the test folders are not packages: no imports between)."""
    return serve


def _stop_that_leaks(model: Any, tokenizer: Any, prompts: list[str], max_tokens: int) -> Any:
    """(prompt, stop): a 3-character stop string whose first occurrence in the greedy
    continuation starts after its first character, in the text of an earlier step (that text
    ends with the stop's beginning: the issue's ``" on"`` for ``"n o"``), so that a stream
    without the hold-back sends more than the unstreamed text, which is not empty."""
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        new = generate_ids(model, [ids], GenerateOptions(max_new_tokens=max_tokens))[0][0].tokens
        steps = [continuation(tokenizer, ids, new[:k]) for k in range(1, len(new) + 1)]
        full = steps[-1]
        for text in steps:
            for start in (len(text) - 1, len(text) - 2):
                stop = full[start : start + 3]
                clean = len(stop) == 3 and "\ufffd" not in stop and stop.strip() == stop
                if clean and start > 0 and full.find(stop) == start and full.startswith(text):
                    return prompt, stop
    raise AssertionError("no stop string spans a step's end")


@pytest.fixture(scope="session")
def stop_that_leaks() -> Any:
    """:func:`_stop_that_leaks`."""
    return _stop_that_leaks


@pytest.fixture(scope="session")
def png_bytes() -> Any:
    """:func:`png`."""
    return png
