"""`aiayn translate` and `aiayn evaluate` end to end on a tiny checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.models import Transformer

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(folder / "tok.json")
    torch.manual_seed(0)
    config = preset(
        "tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4, max_len=24
    )
    return save_checkpoint(folder / "step_1", Transformer(config), {"step": 1}, folder / "tok.json")


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiayn", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_translate_file_keeps_order_and_empty_lines(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("two men play chess\n\na small dog runs\n" + "word " * 40 + "\n")
    out = tmp_path / "out.txt"
    assert (
        main(
            [
                "translate",
                "--checkpoint",
                str(checkpoint),
                "-i",
                str(src),
                "-o",
                str(out),
                "--beam",
                "2",
            ]
        )
        == 0
    )
    lines = out.read_text().split("\n")
    assert len(lines) == 5 and lines[-1] == "" and lines[1] == ""  # 4 lines, one empty
    assert "truncated to 23" in capsys.readouterr().err  # max_len 24 - 1 for EOS
    # the same sentence translated alone gives the same line (batch independence)
    single = tmp_path / "one.txt"
    single.write_text("a small dog runs\n")
    assert (
        main(
            [
                "translate",
                "--checkpoint",
                str(checkpoint),
                "-i",
                str(single),
                "-o",
                str(tmp_path / "o1.txt"),
                "--beam",
                "2",
            ]
        )
        == 0
    )
    assert (tmp_path / "o1.txt").read_text().strip() == lines[2].strip()


def test_translate_stdin_nbest_and_errors(checkpoint: Path) -> None:
    result = _run(
        "translate",
        "--checkpoint",
        str(checkpoint),
        "--beam",
        "3",
        "--n-best",
        "2",
        stdin="hello world\nthe cat\n",
    )
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert len(rows) == 2 and all(len(r.split("\t")) == 4 for r in rows)
    scores = [float(r.split("\t")[1]) for r in rows], [float(r.split("\t")[3]) for r in rows]
    assert all(a >= b for a, b in zip(*scores, strict=True))
    bad = _run("translate", "--checkpoint", str(checkpoint.parent / "nope"), stdin="x\n")
    assert bad.returncode == 2 and "no checkpoint found" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad_beam = _run("translate", "--checkpoint", str(checkpoint), "--beam", "0", stdin="x\n")
    assert bad_beam.returncode == 2 and "Traceback" not in bad_beam.stderr
    assert bad_beam.stderr.splitlines()[-1] == (
        "aiayn translate: error: argument --beam: must be in [1, 1000], got 0"
    )


def test_evaluate_files_and_checkpoint(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = tmp_path / "ref.txt"
    ref.write_text("Ein Mann fährt.\nZwei Hunde.\n")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("Ein Mann fährt.\nZwei Katzen.\n")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--paper-bleu"]) == 0
    out = capsys.readouterr().out
    assert "BLEU = " in out and "nrefs:1|case:mixed" in out and "chrF = " in out
    assert "paper BLEU" in out
    src = tmp_path / "src.txt"
    src.write_text("a small dog runs\nhello world\n")
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(checkpoint),
                "--src",
                str(src),
                "--ref",
                str(ref),
                "--beam",
                "1",
            ]
        )
        == 0
    )
    assert "BLEU = " in capsys.readouterr().out
    assert (tmp_path / "src.txt.hyp").read_text().count("\n") == 2
    short = tmp_path / "short.txt"
    short.write_text("eins\n")
    assert main(["evaluate", "--hyp", str(short), "--ref", str(ref)]) == 2
    assert "1 hypotheses but 2 references" in capsys.readouterr().err


def test_stdin_and_file_inputs_split_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A form feed or U+2028 inside a line does not split it, on stdin as in a file; a BOM goes."""
    import io

    from aiayn.cli.translate import read_input

    data = "\ufeffone\x0cline\nsecond\u2028line\r\n".encode()
    file = tmp_path / "in.txt"
    file.write_bytes(data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert read_input(None) == read_input(str(file)) == ["one\x0cline", "second\u2028line"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    file.write_bytes(b"")
    assert read_input(None) == read_input(str(file)) == []


class _ClosingReader:
    """Standard output read by ``head -1``: the first line is taken, then the pipe is closed."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        if self.lines:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("no descriptor")


def test_translate_streams_in_input_order_and_stops_quietly_on_a_closed_pipe(
    checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each batch's lines are written as soon as every line before them is done (in input
    order, the same lines as ``-o``); a reader that goes away after one line ends the command
    with status 0, nothing on stderr, having translated only the first batches."""
    import io

    import aiayn.decoding.translate as translate

    text = "".join(f"{TEXTS[i % 4]}{' word' * (i % 5)}\n" for i in range(60))
    src = tmp_path / "in.txt"
    src.write_text(text)

    def stdin() -> None:  # standard input: no progress bar on stderr
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))

    batches: list[int] = []
    real = translate._translate_batch

    def counted(*args: object, **kwargs: object) -> object:
        batches.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(translate, "_translate_batch", counted)
    common = ["translate", "--checkpoint", str(checkpoint), "--beam", "1", "--max-tokens", "24"]
    assert main([*common, "-i", str(src), "-o", str(tmp_path / "out.txt")]) == 0
    whole, total = (tmp_path / "out.txt").read_text(), len(batches)
    assert len(whole.splitlines()) == 60 and total >= 10
    capsys.readouterr()
    stdin()
    assert main(common) == 0
    assert capsys.readouterr().out == whole  # streamed: the same lines, in input order
    batches.clear()
    reader = _ClosingReader()
    monkeypatch.setattr(sys, "stdout", reader)
    stdin()
    assert main(common) == 0
    assert capsys.readouterr().err == ""
    assert reader.lines == [whole.splitlines(keepends=True)[0]]
    assert len(batches) < total  # stopped early, not after translating every line


def test_translate_into_a_real_closed_pipe_exits_0_quietly(
    checkpoint: Path, tmp_path: Path
) -> None:
    text = "".join(f"{TEXTS[i % 4]}{' word' * (i % 5)}\n" for i in range(400))
    args = ["--checkpoint", str(checkpoint), "--beam", "1", "--max-tokens", "24"]
    with subprocess.Popen(
        [sys.executable, "-m", "aiayn", "translate", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdin and process.stdout and process.stderr
        process.stdin.write(text)
        process.stdin.close()
        first = process.stdout.readline()
        process.stdout.close()  # `| head -1`
        err = process.stderr.read()
        status = process.wait(timeout=300)
    assert first.strip() and status == 0 and err == "", err
