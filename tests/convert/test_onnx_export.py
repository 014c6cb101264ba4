"""``aiayn export --to onnx``: ONNX Runtime's outputs of the exported BERT (the encoder's states,
its pooler, and its masked-LM head or classifier) and ViT (with a classifier) against aiayn's,
within 1e-4, at batch sizes and sequence lengths (image sizes) other than the example the
exporter traced, with padded rows and a row whose every position is masked (aiayn's attention
gives it zeros, never NaN). Tiny models with every parameter drawn at random; each export takes
seconds (the ``torch.export`` tracer), so each model is exported once per module.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.images import ImagePreprocessor
from aiayn.models.bert import BERT, bert_preset
from aiayn.models.vit import ViT, ViTConfig

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(45))]
IMAGE, PATCH = 8, 2


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter redrawn: norm gains N(1, 0.2), everything else N(0, 0.3)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = "norm" in name and name.endswith("weight")
            p.normal_(1.0 if gain else 0.0, 0.2 if gain else 0.3)


def _bert(head: str) -> BERT:
    config = bert_preset(
        "bert-tiny", vocab_size=len(WORDS), max_len=24, d_model=32, num_heads=4, num_layers=2,
        d_ff=64, head=head, num_labels=3, dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = BERT(config)
    _randomise(model, 1)
    return model.eval()


def _vit() -> ViT:
    config = ViTConfig(
        image_size=IMAGE, patch_size=PATCH, num_channels=3, d_model=32, num_heads=4,
        num_layers=2, d_ff=64, num_labels=5, dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = ViT(config)
    _randomise(model, 2)
    return model.eval()


def _export(checkpoint: Path, out: Path) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["export", "--checkpoint", str(checkpoint), "--to", "onnx", str(out)])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name -> (aiayn model, exported folder, exit status, stdout, stderr)."""
    root = tmp_path_factory.mktemp("onnx")
    vocab = HFTokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    made = {
        "bert-mlm": (_bert("mlm"), BertTokenizer(vocab)),
        "bert-classifier": (_bert("classification"), BertTokenizer(vocab)),
        "vit": (_vit(), ImagePreprocessor(size=(IMAGE, IMAGE))),
    }
    out: dict[str, Any] = {}
    for name, (model, inputs) in made.items():
        checkpoint = save_checkpoint(root / f"ckpt-{name}", model, {}, inputs)
        out[name] = (model, root / name, *_export(checkpoint, root / name))
    return out


def _session(folder: Path) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )


def _bert_inputs(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Random ids and segments; row 0 padded at its end, row 2 (if any) fully masked."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(WORDS), (batch, length), generator=g)
    types = torch.randint(0, 2, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length // 2 :] = 0
    if batch > 2:
        mask[2] = 0
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


@pytest.mark.parametrize("name", ["bert-mlm", "bert-classifier"])
@pytest.mark.parametrize(("batch", "length"), [(3, 5), (1, 11), (4, 24)])
def test_bert_outputs_equal_aiayns(
    exported: dict[str, Any], name: str, batch: int, length: int
) -> None:
    model, folder, code, _, err = exported[name]
    assert code == 0, err
    inputs = _bert_inputs(batch, length, seed=batch * length)
    with torch.no_grad():
        out = model(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
        expected = {"last_hidden_state": out.hidden, "pooler_output": out.pooled}
        if model.classifier is not None:
            expected["logits"] = model.classifier(out.pooled)  # (B, C)
        if model.mlm_head is not None:
            expected["logits"] = model.mlm_logits(out.hidden)  # (B, S, V)
    session = _session(folder)
    assert [i.name for i in session.get_inputs()] == list(inputs)
    assert [o.name for o in session.get_outputs()] == list(expected)
    got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    for (key, want), have in zip(expected.items(), got, strict=True):
        assert np.isfinite(have).all(), key
        np.testing.assert_allclose(have, want.numpy(), atol=1e-4, err_msg=key)
    error = max(
        float(np.abs(h - w.numpy()).max()) for w, h in zip(expected.values(), got, strict=True)
    )
    print(f"\n{name} B={batch} S={length}: max |ONNX Runtime - aiayn| = {error:.1e}")
    if batch > 2:  # the fully masked row: aiayn's attention gives zeros, here too
        np.testing.assert_allclose(got[0][2], out.hidden[2].numpy(), atol=1e-4)


@pytest.mark.parametrize(
    ("batch", "side"), [(3, IMAGE), (1, IMAGE + 2 * PATCH), (2, IMAGE - PATCH)]
)
def test_vit_outputs_equal_aiayns(exported: dict[str, Any], batch: int, side: int) -> None:
    model, folder, code, _, err = exported["vit"]
    assert code == 0, err
    pixels = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(side))
    with torch.no_grad():
        out = model(pixels)
    session = _session(folder)
    names = [o.name for o in session.get_outputs()]
    assert names == ["last_hidden_state", "pooler_output", "logits"]
    got = session.run(None, {"pixel_values": pixels.numpy()})
    assert got[0].shape == (batch, 1 + (side // PATCH) ** 2, 32)  # the sequence follows the image
    for want, have in zip((out.hidden, out.pooled, out.logits), got, strict=True):
        np.testing.assert_allclose(have, want.numpy(), atol=1e-4)
    error = max(float(np.abs(h - w.numpy()).max()) for w, h in zip(out[:3], got, strict=True))
    print(f"\nvit B={batch} {side}x{side}: max |ONNX Runtime - aiayn| = {error:.1e}")


def test_the_folder_holds_the_graph_and_the_input_processing(exported: dict[str, Any]) -> None:
    _, bert, code, stdout, _ = exported["bert-mlm"]
    assert code == 0 and "bert, ONNX" in stdout and stdout.count("\n") == 1  # one line, no noise
    assert {p.name for p in bert.iterdir()} >= {
        "model.onnx",
        "tokenizer.json",
        "bert_tokenizer.json",
    }
    _, vit, *_ = exported["vit"]
    config = json.loads((vit / "preprocessor_config.json").read_text())
    assert config["size"] == {"height": IMAGE, "width": IMAGE}
