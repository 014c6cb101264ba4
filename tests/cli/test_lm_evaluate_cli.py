"""`aiayn evaluate --text`: the perplexity of a GPT-2 checkpoint equals the one computed from
Hugging Face's own logits on the same windows, and bad combinations are one-line errors."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.models import Transformer

transformers = pytest.importorskip("transformers")

LINES = [
    "the quick brown fox jumps over the lazy dog",
    "",
    "a stitch in time saves nine",
    "all that glitters is not gold, and the early bird catches the worm",
    "où est la gare ? 🚂",
    "to be or not to be",
]
CONTEXT = 16  # the model's n_positions: windows of 16 predicted tokens


def _gpt2_style_tokenizer(folder: Path) -> Path:
    """A byte-level BPE whose only special token is GPT-2's <|endoftext|> (id 0)."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator([line for line in LINES if line] * 5, trainer)
    path = folder / "tokenizer.json"
    hf.save(str(path))
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path, HFTokenizer]:
    """A random GPT2LMHeadModel, converted into an aiayn checkpoint with the tokenizer."""
    from aiayn.convert.gpt2 import gpt2_from_hf

    folder = tmp_path_factory.mktemp("gpt2")
    tokenizer_file = _gpt2_style_tokenizer(folder)
    tokenizer = HFTokenizer.from_file(str(tokenizer_file))
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=CONTEXT,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.3,  # far from uniform predictions: the windows matter
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(folder / "hf")
    model, _ = gpt2_from_hf(folder / "hf")
    checkpoint = save_checkpoint(folder / "ckpt", model, {}, tokenizer_file)
    return hf, checkpoint, tokenizer


def _hf_perplexity(hf: object, tokenizer: HFTokenizer, window: int) -> tuple[float, int]:
    """exp(mean NLL) from Hugging Face's logits: lines + <|endoftext|> as one stream, windows
    k·L … k·L + L, each predicting its last L tokens from the ones before within it."""
    ids: list[int] = []
    for line in LINES:
        if line.strip():
            ids += [*tokenizer.encode(line, add_special_tokens=False).ids, 0]
    nll = 0.0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = torch.tensor(ids[start : start + window + 1])
            logits = hf(chunk[None, :-1]).logits[0].double()  # type: ignore[operator]
            nll += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
    return math.exp(nll / (len(ids) - 1)), len(ids) - 1


def _reported(out: str) -> tuple[float, int]:
    ppl = float(re.search(r"perplexity: ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    tokens = int(re.search(r"tokens: (\d+) predicted", out).group(1))  # type: ignore[union-attr]
    return ppl, tokens


@pytest.mark.parametrize("block", [None, 5])
def test_perplexity_equals_hugging_face_on_the_same_windows(
    converted: tuple[object, Path, HFTokenizer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    block: int | None,
) -> None:
    hf, checkpoint, tokenizer = converted
    text = tmp_path / "text.txt"
    text.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    args = ["evaluate", "--checkpoint", str(checkpoint), "--text", str(text), "--device", "cpu"]
    args += [] if block is None else ["--block-size", str(block), "--max-tokens", "12"]
    assert main(args) == 0
    ppl, tokens = _reported(capsys.readouterr().out)
    want, want_tokens = _hf_perplexity(hf, tokenizer, block or CONTEXT)
    assert tokens == want_tokens and tokens > 3 * CONTEXT  # several windows and a tail
    assert ppl == pytest.approx(want, rel=1e-4)
    assert abs(math.log(want / tokenizer.get_vocab_size())) > 0.5  # far from a uniform model


def test_bad_combinations_are_one_line_errors(
    converted: tuple[object, Path, HFTokenizer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, checkpoint, _ = converted
    text = tmp_path / "t.txt"
    text.write_text("hello there\n", encoding="utf-8")
    tok = Tokenizer.train(["hello there"] * 5, 270, min_frequency=1)
    tok.save(tmp_path / "tok.json")
    config = preset("tiny", vocab_size=tok.vocab_size, d_model=32, d_ff=64, num_heads=4)
    translation = save_checkpoint(tmp_path / "tr", Transformer(config), {}, tmp_path / "tok.json")
    ck, tx = str(checkpoint), str(text)
    cases = [
        (["--text", tx], "--text needs --checkpoint"),
        (["--checkpoint", ck, "--text", tx, "--ref", tx], "leave out --ref"),
        (["--checkpoint", ck, "--text", tx, "--block-size", "99"], "--block-size must be in 1..16"),
        (["--checkpoint", str(translation), "--text", tx], "holds a transformer model"),
        (["--hyp", tx], "give --ref FILE"),
        (["--hyp", tx, "--ref", tx, "--block-size", "4"], "--block-size goes with --text"),
    ]
    for args, needle in cases:
        assert main(["evaluate", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err, (args, err)
