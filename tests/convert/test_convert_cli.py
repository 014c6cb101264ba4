"""``aiayn convert``: Hugging Face folder -> aiayn checkpoint (loadable, equal logits), refusing
to overwrite without --force, and back to a folder transformers loads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import GPT2LMHeadModel, GPT2TokenizerFast

from aiayn.checkpoint import load_checkpoint
from aiayn.cli.main import main
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.models.gpt2 import GPT2

MakeHF = Callable[..., Any]
Gap = Callable[[GPT2LMHeadModel, GPT2], float]


def test_convert_writes_a_checkpoint_with_equal_logits(
    make_hf: MakeHF, logit_gap: Gap, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = make_hf(tokenizer=True, tie_word_embeddings=False)
    out = tmp_path / "ckpt"
    assert main(["convert", "--from-hf", str(hf.path), "--to", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    parameters = sum(p.numel() for p in hf.model.parameters())
    assert (
        line == f"converted {hf.path} -> {out}: gpt2, {parameters:,} parameters, 29 tensors mapped"
    )
    loaded = load_checkpoint(out, expect=GPT2)
    assert logit_gap(hf.model, loaded.model) < 1e-4
    assert loaded.state["converted_from"] == str(hf.path)
    assert loaded.state["hf_config"] == json.loads((hf.path / "config.json").read_text())
    assert loaded.family == "gpt2" and sorted(p.name for p in out.iterdir()) == [
        "SHA256SUMS",
        "model.safetensors",
        "state.json",
        "tokenizer.json",
    ]
    ours, theirs = (
        TextTokenizer.load(loaded.tokenizer_path),
        GPT2TokenizerFast.from_pretrained(hf.path),
    )
    text = "café  東京\n😀<|endoftext|> the end"
    assert ours.encode(text) == theirs(text)["input_ids"]


def test_an_existing_destination_needs_force(
    make_hf: MakeHF, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = make_hf(tokenizer=True)
    capsys.readouterr()  # transformers' progress bars
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["convert", "--from-hf", str(hf.path), "--to", str(out)]) == 2
    error = capsys.readouterr().err
    assert error == f"aiayn convert: error: {out} exists: pass --force to replace it\n"
    assert (out / "keep.txt").read_text() == "mine"
    # --force replaces a checkpoint, never a folder of something else (it would be deleted)
    assert main(["convert", "--from-hf", str(hf.path), "--to", str(out), "--force"]) == 2
    assert "is a folder that is not an aiayn checkpoint" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert main(["convert", "--from-hf", str(hf.path), "--to", str(out), "--force"]) == 0
    (out / "model.safetensors").write_bytes(b"old")
    assert main(["convert", "--from-hf", str(hf.path), "--to", str(out), "--force"]) == 0
    assert (out / "state.json").is_file() and (out / "model.safetensors").stat().st_size > 3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-hf", "HF"], "give --from-hf DIR_OR_NAME --to DIR, or --checkpoint DIR --to-hf"),
        (["--from-hf", "HF", "--to", "A", "--to-hf", "B"], "give --from-hf DIR_OR_NAME --to DIR"),
        (["--from-hf", "HF", "--to", "OUT"], "has no tokenizer"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    make_hf: MakeHF,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    hf = make_hf()  # no tokenizer
    capsys.readouterr()  # transformers' progress bars
    args = [str(hf.path) if a == "HF" else str(tmp_path / a) if a.isupper() else a for a in args]
    assert main(["convert", *args]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("tied", [True, False])
def test_checkpoint_back_to_hugging_face(
    make_hf: MakeHF, logit_gap: Gap, tmp_path: Path, capsys: pytest.CaptureFixture[str], tied: bool
) -> None:
    hf = make_hf(tokenizer=True, tie_word_embeddings=tied)
    ckpt, back = tmp_path / "ckpt", tmp_path / "back"
    assert main(["convert", "--from-hf", str(hf.path), "--to", str(ckpt)]) == 0
    back.mkdir()
    assert main(["convert", "--checkpoint", str(ckpt), "--to-hf", str(back)]) == 2
    assert main(["convert", "--checkpoint", str(ckpt), "--to-hf", str(back), "--force"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"wrote {ckpt} -> {back}: gpt2, ")
    model, info = GPT2LMHeadModel.from_pretrained(back, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert logit_gap(model.eval(), load_checkpoint(ckpt, expect=GPT2).model) < 1e-4
    assert logit_gap(hf.model, load_checkpoint(ckpt, expect=GPT2).model) < 1e-4
    assert (back / "tokenizer.json").is_file() and not (tmp_path / "back.tmp").exists()
