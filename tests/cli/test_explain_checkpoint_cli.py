"""``aiayn explain --checkpoint``: the first layer of a real checkpoint, for every family.

Tiny random Hugging Face models (GPT-2, BERT, ViT, T5, Marian; every parameter drawn at random,
not transformers' init) are saved with their tokenizers (or image processor) and converted with
``aiayn convert``; the paper's own model is saved by aiayn with its BPE. For each, the command
prints the walk-through and its three checks pass, and the walk-through's explicit weights of
every head equal transformers' eager attention weights of the first layer (``output_attentions``)
for the same token ids, within 1e-5.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.models import Transformer
from aiayn.models.families import family_of, resolve
from aiayn.visualization.first_layer import check_first_layer, trace_first_layer

RunCli = Callable[..., tuple[int, str, str]]

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

TEXT = "A man rides a horse."
CORPUS = [TEXT, "Two dogs play in the snow.", "A woman reads a book.", "the cat sat on the mat"]
SMALL = dict(d_model=32, heads=4, layers=2, d_ff=64)


def _redraw(model: Any, seed: int = 0) -> Any:
    """Every parameter ~ N(0, 0.3), norm gains ~ N(1, 0.2); eval mode, eager attention."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = ("norm" in name.lower()) and name.endswith("weight")
            p.normal_(1.0, 0.2) if gain else p.normal_(0.0, 0.3)
    model.set_attn_implementation("eager")
    return model.eval()


def _gpt2(root: Path) -> Any:
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 4, vocab_size=300, min_frequency=1)
    bpe.save_model(str(root))
    config = transformers.GPT2Config(
        vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return _redraw(transformers.GPT2LMHeadModel(config))


def _bert(root: Path) -> Any:
    from tokenizers import BertWordPieceTokenizer

    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(CORPUS, vocab_size=120, min_frequency=1)
    trainer.save_model(str(root))
    transformers.BertTokenizerFast(vocab_file=str(root / "vocab.txt")).save_pretrained(root)
    config = transformers.BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32,
    )  # fmt: skip
    return _redraw(transformers.BertForMaskedLM(config))


def _vit(root: Path) -> Any:
    transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(root)
    config = transformers.ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3,
    )  # fmt: skip
    return _redraw(transformers.ViTForImageClassification(config))


def _t5(root: Path, spm: dict[str, Path], make_tokenizer: Callable[[Path, int], Any]) -> Any:
    hub = root.with_name(root.name + "_hub")
    hub.mkdir()
    shutil.copy(spm["t5"], hub / "spiece.model")
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "extra_ids": 100}
    (hub / "tokenizer_config.json").write_text(json.dumps(special))
    make_tokenizer(hub, 100).save_pretrained(root)
    config = transformers.T5Config(
        vocab_size=512, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        feed_forward_proj="relu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return _redraw(transformers.T5ForConditionalGeneration(config))


def _marian(root: Path, spm: dict[str, Path], make_vocab: Callable[..., dict[str, int]]) -> Any:
    vocab = make_vocab(spm["source"], spm["target"])
    (root / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        str(spm["source"]), str(spm["target"]), str(root / "vocab.json")
    )
    tokenizer.save_pretrained(root)
    pad = len(vocab) - 1
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, scale_embedding=True, pad_token_id=pad,
        decoder_start_token_id=pad, eos_token_id=0,
    )  # fmt: skip
    model = transformers.MarianMTModel(config)
    tables = {n: p.clone() for n, p in model.named_parameters() if "embed_positions" in n}
    _redraw(model)
    with torch.no_grad():  # the sinusoid tables stay as Hugging Face builds them
        for name, p in model.named_parameters():
            if name in tables:
                p.copy_(tables[name])
    return model


@pytest.fixture(scope="module")
def folders(
    sentencepiece_models: dict[str, Path],
    make_hf_t5_tokenizer: Callable[[Path, int], Any],
    make_marian_vocab: Callable[..., dict[str, int]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, Any]]:
    """name -> (aiayn checkpoint, the Hugging Face model or None) for every family."""
    from aiayn.cli.main import main

    root = tmp_path_factory.mktemp("explain_ckpt")
    builders: dict[str, Callable[[Path], Any]] = {
        "gpt2": _gpt2,
        "bert": _bert,
        "vit": _vit,
        "t5": lambda r: _t5(r, sentencepiece_models, make_hf_t5_tokenizer),
        "marian": lambda r: _marian(r, sentencepiece_models, make_marian_vocab),
    }
    out: dict[str, tuple[Path, Any]] = {}
    for name, build in builders.items():
        (root / f"hf_{name}").mkdir()
        hf = build(root / f"hf_{name}")
        hf.save_pretrained(root / f"hf_{name}")
        assert (
            main(["convert", "--from-hf", str(root / f"hf_{name}"), "--to", str(root / name)]) == 0
        )
        out[name] = (root / name, hf)
    tokenizer = Tokenizer.train(CORPUS * 20, 300, min_frequency=1)
    tokenizer.save(root / "tok.json")
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4)
    out["paper"] = (
        save_checkpoint(root / "paper", Transformer(config), {}, root / "tok.json"),
        None,
    )
    pixels = np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "img.png")
    return out


def _source(name: str, folders: dict[str, tuple[Path, Any]]) -> str:
    return str(folders["paper"][0].parent / "img.png") if name == "vit" else TEXT


FAMILIES = ["paper", "gpt2", "bert", "vit", "t5", "marian"]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_walk_through_prints_and_its_checks_pass(
    name: str, folders: dict[str, tuple[Path, Any]], run_cli: RunCli
) -> None:
    flag = "--image" if name == "vit" else "--text"
    code, out, err = run_cli(
        "explain", "--checkpoint", folders[name][0], flag, _source(name, folders), "--head", 2
    )
    assert (code, err) == (0, ""), err
    assert out.startswith("First layer, step by step: the ")
    for step in (
        "Step 1.",
        "Step 2.1.",
        "Step 3.",
        "Step 4. Head 2",
        "Step 5.",
        "Step 7.",
        "Step 9.",
    ):
        assert step in out, step
    checks = [line for line in out.splitlines() if line.startswith("check: ")]
    assert len(checks) == 3 and all(" equals " in line for line in checks), checks
    assert "DIFFERS" not in out
    sums = next(line for line in out.splitlines() if "row sums:" in line).split()[2:]
    assert set(sums) == {"1.0000"}
    if name == "t5":
        assert "Relative position bias of head 2" in out and "this family's scale is 1" in out
        assert "No positional encoding" in out
    if name == "gpt2":
        assert "Causal mask" in out and "-inf" in out
    if name in ("paper", "marian"):
        assert "E · √d_model = E × 5.6569" in out and "÷ √d_k = ÷ 2.8284" in out
    if name == "bert":
        assert "[CLS]" in out and "[SEP]" in out and "LayerNorm(E + P + type)" in out


def _hf_first_layer_weights(name: str, hf: Any, ids: list[int], image: Path) -> torch.Tensor:
    """transformers' eager attention weights of the first layer, (H, T, T)."""
    with torch.no_grad():
        if name == "vit":
            pixels = transformers.ViTImageProcessor.from_pretrained(image.parent / "hf_vit")(
                Image.open(image), return_tensors="pt"
            )["pixel_values"]
            return hf(pixel_values=pixels, output_attentions=True).attentions[0][0]
        tokens = torch.tensor([ids])
        if name in ("t5", "marian"):
            out = hf(input_ids=tokens, decoder_input_ids=tokens[:, :1], output_attentions=True)
            return out.encoder_attentions[0][0]
        return hf(input_ids=tokens, output_attentions=True).attentions[0][0]


@pytest.mark.parametrize("name", ["gpt2", "bert", "vit", "t5", "marian"])
def test_every_heads_weights_equal_transformers_eager_attention(
    name: str, folders: dict[str, tuple[Path, Any]]
) -> None:
    folder, hf = folders[name]
    checkpoint = load_checkpoint(folder, expect=torch.nn.Module)
    family = family_of(checkpoint.model)
    assert family.first_layer is not None
    source = _source(name, folders)
    inputs = resolve(family.first_layer)(checkpoint.model.eval(), checkpoint.path, source)
    trace = trace_first_layer(inputs, head=3)
    assert check_first_layer(trace).passed
    image = folders["paper"][0].parent / "img.png"
    expected = _hf_first_layer_weights(name, hf, list(inputs.ids or []), image)
    assert expected.shape == trace.weights.shape
    torch.testing.assert_close(trace.weights.float(), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        trace.weights.sum(-1), torch.ones_like(trace.weights[..., 0]).double()
    )
