"""`aiayn generate` end to end on a tiny GPT-2 checkpoint with its own tokenizer.json."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.models import Transformer
from aiayn.models.gpt2 import GPT2, GPT2Config

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]
PROMPTS = ["the cat", "two men play", "a"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpt2")
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(folder / "tok.json")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=tokenizer.vocab_size,
        max_len=40,
        d_model=32,
        num_heads=4,
        num_layers=2,
        dropout=0.0,
        embedding_dropout=0.0,
        attention_dropout=0.0,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
    )
    model = GPT2(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:  # random LayerNorm biases make one token win everywhere
                p.normal_(0, 0.3)
    return save_checkpoint(folder / "step_1", model, {"step": 1}, folder / "tok.json")


def _expected(checkpoint: Path, prompts: list[str], options: GenerateOptions) -> list[str]:
    """The library's continuations, which the command must print."""
    ckpt = load_checkpoint(checkpoint, expect=GPT2)
    return generate(ckpt.model, TextTokenizer.load(ckpt.tokenizer_path), prompts, options)


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_prompts_as_arguments_print_prompt_and_continuation(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(capsys, "--checkpoint", str(checkpoint), "--max-new-tokens", "8", *PROMPTS)
    new = _expected(checkpoint, PROMPTS, GenerateOptions(max_new_tokens=8))
    assert code == 0 and out == "".join(p + n + "\n" for p, n in zip(PROMPTS, new, strict=True))
    assert sum(len(n) for n in new) > 10  # something was generated
    code, only, _ = _main(
        capsys, "--checkpoint", str(checkpoint), "--max-new-tokens", "8", "--only-new", *PROMPTS
    )
    assert code == 0 and only == "".join(n + "\n" for n in new)


def _generate_in_a_subprocess(
    checkpoint: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "aiayn", "generate", "--checkpoint", str(checkpoint), *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300)


def test_prompts_from_stdin_in_a_subprocess(checkpoint: Path) -> None:
    stdin = "".join(p + "\n" for p in PROMPTS)
    args = ("--max-new-tokens", "6", "--only-new", "--beam", "2")
    result = _generate_in_a_subprocess(checkpoint, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    new = _expected(
        checkpoint, PROMPTS, GenerateOptions(max_new_tokens=6, method="beam", beam_size=2)
    )
    assert result.stdout == "".join(n + "\n" for n in new)


def test_prompts_from_a_file_and_an_empty_line(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["two men play", "", "hello"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["--checkpoint", str(checkpoint), "-i", str(tmp_path / "in.txt"), "--only-new"]
    code, out, _ = _main(capsys, *args, "--min-new-tokens", "4", "--max-new-tokens", "5")
    new = _expected(checkpoint, lines, GenerateOptions(max_new_tokens=5, min_new_tokens=4))
    assert code == 0 and out == "".join(n + "\n" for n in new)
    assert new[1]  # the empty line: unconditional text, from BOS


def test_stdin_read_in_process(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the cat\nhello\n")))
    code, out, _ = _main(capsys, "--checkpoint", str(checkpoint), "--max-new-tokens", "4")
    new = _expected(checkpoint, ["the cat", "hello"], GenerateOptions(max_new_tokens=4))
    assert code == 0 and out == f"the cat{new[0]}\nhello{new[1]}\n"


def test_seeded_sampling_is_reproducible(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--checkpoint", str(checkpoint), "--sample", "--top-p", "0.9", "--top-k", "40"]
    args += ["--temperature", "1.2", "--max-new-tokens", "10", "--only-new", *PROMPTS]
    code, first, _ = _main(capsys, *args, "--seed", "5")
    _, again, _ = _main(capsys, *args, "--seed", "5")
    _, other, _ = _main(capsys, *args, "--seed", "6")
    options = GenerateOptions(
        max_new_tokens=10, method="sample", top_p=0.9, top_k=40, temperature=1.2, seed=5
    )
    assert code == 0 and first == again == "".join(
        n + "\n" for n in _expected(checkpoint, PROMPTS, options)
    )
    assert other != first


UNDERFLOW = [
    ["--temperature", "1e-38"], ["--temperature", "1e-300"], ["--temperature", "5e-324"],
    ["--top-p", "1e-300"], ["--top-p", "5e-324", "--top-k", "5", "--temperature", "0.5"],
]  # fmt: skip


@pytest.mark.parametrize("values", UNDERFLOW, ids=[" ".join(v) for v in UNDERFLOW])
def test_sampling_values_that_underflow_give_the_top_token(
    checkpoint: Path, capsys: pytest.CaptureFixture[str], values: list[str]
) -> None:
    """Issue 62: these ended in an internal-error traceback (exit 1: NaN probabilities drawn
    from). A temperature whose ``log_prob / T`` overflows, or a nucleus of probability 0, means
    the top token: greedy search's text."""
    args = ["--checkpoint", str(checkpoint), "--sample", "--seed", "3", *values]
    code, out, err = _main(capsys, *args, "--max-new-tokens", "8", "--only-new", *PROMPTS)
    greedy = _expected(checkpoint, PROMPTS, GenerateOptions(max_new_tokens=8))
    assert code == 0, err
    assert out == "".join(n + "\n" for n in greedy)


BAD = [
    (["--max-new-tokens", "39"], r"prompt 0 has \d+ tokens: with 39 new tokens it needs \d+"),
    (["--min-new-tokens", "60"], r"min_new_tokens must be between 0 and 50 \(max_new_tokens\)"),
    (["--temperature", "0.7"], "--temperature applies to --sample only"),
    (["--beam", "2", "--seed", "1"], "--seed applies to --sample only"),
    (["--alpha", "0.5"], "--alpha applies to --beam only"),
    (["-i", "prompts.txt"], "give prompts as arguments or with --input, not both"),
]

# refused by the flag's type (GenerateOptions' own field rules), before the command runs
BAD_FLAGS = [
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
    (["--beam", "0"], "argument --beam: must be in \\[1, 1000\\], got 0"),
    (["--sample", "--top-p", "1.5"], r"argument --top-p: must be in \(0, 1\], got 1.5"),
    (["--sample", "--temperature", "nan"], "--temperature: must be finite and > 0, got nan"),
    (["--sample", "--top-k", "0"], "argument --top-k: must be >= 1, got 0"),
    (["--sample", "--seed", "-1"], r"argument --seed: must be in \[0, 2\*\*63\), got -1"),
    (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["--device", "nonsense"], "argument --device: unknown device 'nonsense'"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_are_one_line_errors(
    checkpoint: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = _main(capsys, "--checkpoint", str(checkpoint), *args, "the cat")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("aiayn generate: error: ")
    assert re.search(message, err), err


@pytest.mark.parametrize(("args", "message"), BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flag_values_are_argparse_errors(
    checkpoint: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--checkpoint", str(checkpoint), *args, "the cat"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1].startswith("aiayn generate: error: ")
    assert re.search(message, err.splitlines()[-1]), err


def test_a_translation_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = Tokenizer.train(TEXTS * 5, 300, min_frequency=1)
    tokenizer.save(tmp_path / "tok.json")
    config = preset("tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4)
    folder = save_checkpoint(
        tmp_path / "mt", Transformer(config), {"step": 1}, tmp_path / "tok.json"
    )
    code, _, err = _main(capsys, "--checkpoint", str(folder), "hello")
    assert code == 2 and err.count("\n") == 1
    assert "holds a transformer model; this needs a checkpoint of gpt2" in err


def test_a_bad_option_exits_2_without_traceback_in_a_subprocess(checkpoint: Path) -> None:
    result = _generate_in_a_subprocess(checkpoint, "--top-p", "0.5", "x")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "aiayn generate: error: --top-p applies to --sample only\n"


def test_an_unparsable_number_is_argparse_s_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--checkpoint", "x", "--beam", "four", "hi"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.splitlines()[-1] == "aiayn generate: error: argument --beam: invalid int value: 'four'"
    )
    assert "Traceback" not in err
