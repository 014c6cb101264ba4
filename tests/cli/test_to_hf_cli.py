"""``aiayn convert --checkpoint --to-hf`` on aiayn's own translation model, end to end: the
folder transformers loads (MarianMTModel for the paper's post-norm model, Pegasus for pre-norm)
with its tokenizer translates, line for line, as ``aiayn translate --length-penalty hf`` does
(transformers' rules: log P / length^α, α 0.6, early stopping, PAD and BOS banned), greedy and
with 4 beams. Each line goes alone through ``generate`` with aiayn's length limit for it (source
tokens + 50, EOS included); the paper's GNMT penalty has no transformers equivalent.

The model is random (tiny), with EOS's embedding row moved along the decoder's mean output so
that some translations end before the limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import TransformerConfig
from aiayn.data import Tokenizer, demo_corpus_path, read_parallel
from aiayn.models import Transformer

transformers = pytest.importorskip("transformers")

PAIRS = read_parallel(demo_corpus_path())[::50]
SOURCES = [src for src, _ in PAIRS[3:10]]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread is faster, and does not stall when the cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(tokenizer: Tokenizer, norm_first: bool) -> Transformer:
    config = TransformerConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, dropout=0.0, max_len=128, norm_first=norm_first,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(config).eval()
    with torch.no_grad():
        src = torch.tensor([[*ids, 2] for ids in tokenizer.encode_batch(SOURCES[:1])])
        tgt = torch.randint(4, config.vocab_size, (1, 12))
        tgt[:, 0] = 1
        hidden = model.decode(tgt, model.encode(src).memory, None).hidden  # (1, 12, D)
        mean = hidden.mean((0, 1))
        model.output_proj.weight[2] += 3.0 * mean / mean.norm() ** 2  # EOS's row (tied)
    return model


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    Tokenizer.train([s for p in PAIRS for s in p], 400).save(path)
    return path


@torch.no_grad()
def hf_translate(folder: Path, lines: list[str], beams: int) -> list[str]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    texts = []
    for line in lines:
        batch = tokenizer(line, return_tensors="pt")
        limit = batch["input_ids"].size(1) - 1 + 50  # aiayn's: source tokens (no EOS) + 50
        out = model.generate(**batch, num_beams=beams, max_new_tokens=limit)
        texts.append(tokenizer.decode(out[0], skip_special_tokens=True))
    return texts


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_transformers_translates_as_aiayn_does(
    norm_first: bool, tokenizer_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = Tokenizer.load(tokenizer_file)
    ckpt = save_checkpoint(tmp_path / "ckpt", _model(tokenizer, norm_first), {}, tokenizer_file)
    out = tmp_path / "hf"
    assert main(["convert", "--checkpoint", str(ckpt), "--to-hf", str(out)]) == 0
    kind = "pegasus" if norm_first else "marian"
    assert f'"model_type": "{kind}"' in (out / "config.json").read_text()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    for line in [*SOURCES, "spelled </s> and <pad> as text"]:
        assert hf_tokenizer(line)["input_ids"] == [*tokenizer.encode(line), tokenizer.eos_id]
    source = tmp_path / "src.txt"
    source.write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
    capsys.readouterr()
    for beams in (1, 4):
        args = ["--checkpoint", str(ckpt), "-i", str(source), "--length-penalty", "hf"]
        assert main(["translate", *args, "--beam", str(beams)]) == 0
        ours = capsys.readouterr().out.splitlines()
        assert ours == hf_translate(out, SOURCES, beams)
        assert len(set(ours)) > 1 and any(len(t.split()) < 20 for t in ours), ours


def test_an_existing_folder_is_kept_without_force(
    tokenizer_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = Tokenizer.load(tokenizer_file)
    ckpt = save_checkpoint(tmp_path / "ckpt", _model(tokenizer, False), {}, tokenizer_file)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["convert", "--checkpoint", str(ckpt), "--to-hf", str(out)]) == 2
    assert main(["convert", "--checkpoint", str(ckpt), "--to-hf", str(out), "--force"]) == 2
    assert (out / "mine.txt").read_text() == "keep"
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "--force" in err


def test_help_lists_what_goes_each_way(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Back to Hugging Face: Transformer, GPT-2, T5, BERT, ViT." in text
    assert "Transformer (marian, pegasus)" in text
