"""``aiayn export`` of an int8 checkpoint (``aiayn quantize``) is refused up front, in one line
naming the checkpoint as int8 and the fp32 checkpoint to export instead (CTranslate2: with its
own ``--quantization int8``; ONNX: fp32 only), exit status 2, nothing written; the library's
``export_ct2`` / ``export_onnx`` refuse a model with int8 layers likewise. Neither needs the
engines installed: the refusal comes before them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.convert.export import export_ct2, export_onnx
from aiayn.data import Tokenizer
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.errors import UserError
from aiayn.inference.quantize import quantize_model
from aiayn.models import BERT, BertConfig, Transformer

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "."]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random fp32 checkpoints, the paper's model (``mt``) and a BERT (``bert``), and
    their int8 copies written by ``aiayn quantize`` (``mt8``, ``bert8``)."""
    root = tmp_path_factory.mktemp("int8_export")
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(root / "tok.json")
    torch.manual_seed(0)
    config = preset(
        "tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4, max_len=12
    )
    bert = BertConfig(vocab_size=len(WORDS), max_len=32, d_model=32, num_heads=4, num_layers=1)
    vocab = HFTokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    folders = {
        "mt": save_checkpoint(root / "mt", Transformer(config), {}, root / "tok.json"),
        "bert": save_checkpoint(root / "bert", BERT(bert), {}, BertTokenizer(vocab)),
    }
    for name in ("mt", "bert"):
        argv = ["quantize", "--checkpoint", str(folders[name]), "--out", str(root / f"{name}8")]
        assert main(argv) == 0
        folders[f"{name}8"] = root / f"{name}8"
    return folders


@pytest.mark.parametrize(
    ("checkpoint", "to", "extra", "advice"),
    [
        ("mt8", "ct2", [], " with --to ct2 --quantization int8 (or int8_float32) for int8 weights "
         "in CTranslate2"),
        ("mt8", "ct2", ["--quantization", "int8"], " with --to ct2 --quantization int8 (or "
         "int8_float32) for int8 weights in CTranslate2"),
        ("bert8", "ct2", [], " with --to ct2 --quantization int8 (or int8_float32) for int8 "
         "weights in CTranslate2"),
        ("bert8", "onnx", [], "; the ONNX export is fp32 only (--quantization is for --to ct2)"),
    ],
    ids=["mt to ct2", "mt to ct2 int8", "bert to ct2", "bert to onnx"],
)  # fmt: skip
def test_exporting_an_int8_checkpoint_is_refused_in_one_line(
    checkpoint: str,
    to: str,
    extra: list[str],
    advice: str,
    ckpts: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fp32 = ckpts[checkpoint.removesuffix("8")]
    out = tmp_path / "out"
    capsys.readouterr()
    argv = ["export", "--checkpoint", str(ckpts[checkpoint]), "--to", to, str(out), *extra]
    assert main(argv) == 2
    printed, err = capsys.readouterr()
    assert printed == ""
    assert err == (
        f"aiayn export: error: {ckpts[checkpoint]} holds an int8-quantised model (aiayn "
        "quantize); aiayn export reads fp32 checkpoints only: export the fp32 checkpoint it was "
        f"quantised from ({fp32}){advice}\n"
    )
    assert sorted(tmp_path.iterdir()) == []  # nothing written, nothing staged


def test_the_library_refuses_to_export_a_model_with_int8_layers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=50, d_model=32, d_ff=64, num_heads=4, max_len=12)
    bert = BertConfig(vocab_size=len(WORDS), max_len=32, d_model=32, num_heads=4, num_layers=1)
    with pytest.raises(UserError) as refused:
        export_ct2(quantize_model(Transformer(config)), None, tmp_path / "ct2", "int8")
    assert str(refused.value) == (
        "the model holds int8 layers (aiayn quantize, --quantize int8), which export does not "
        "read: export the fp32 model with quantization='int8' (or 'int8_float32') for int8 "
        "weights in CTranslate2"
    )
    with pytest.raises(UserError) as refused:
        export_onnx(quantize_model(BERT(bert)), None, tmp_path / "onnx")
    assert str(refused.value) == (
        "the model holds int8 layers (aiayn quantize, --quantize int8), which export does not "
        "read: export the fp32 model; the ONNX export is fp32 only"
    )
    assert sorted(tmp_path.iterdir()) == []
