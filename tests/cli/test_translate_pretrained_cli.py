"""``aiayn convert``, ``translate`` and ``evaluate`` end to end on Hugging Face Marian (OPUS-MT)
and T5 folders, offline.

Tiny random models are built with ``transformers`` and saved, with tokenizers made from the
SentencePiece models of ``tests/data/conftest.py`` and a generation config, as Hugging Face
folders; ``aiayn convert`` turns each into a checkpoint, and ``aiayn translate`` on it must give,
line for line, exactly what ``transformers`` gives: the tokenizer, ``model.generate`` with the
folder's generation settings, ``batch_decode(skip_special_tokens=True)``.

The generation configs set ``max_length`` = 20: Hugging Face's limit counts the decoder start
token, so at most 19 new tokens, EOS included; aiayn's limit is min(source length + 50,
``max_length`` − 1), so the same 19 for every sentence here. Hugging Face translates each line
alone (no padding); aiayn batches them. An empty line is translated to an empty line by aiayn
without running the model (Hugging Face would translate the lone EOS), so the references leave
empty lines empty, with ``--prefix`` too. Two bugs these tests found (an empty line translated
as the prefix alone; a tokenizer.json's saved padding and truncation applied) have regression
tests below.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from aiayn.checkpoint import record_checksums, save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Tokenizer, demo_corpus_path, normalize, read_parallel
from aiayn.data.pretrained_tokenizer import MANIFEST
from aiayn.evaluation import corpus_bleu, corpus_chrf
from aiayn.models.gpt2 import GPT2, GPT2Config

transformers = pytest.importorskip("transformers")
# transformers.MarianTokenizer without sacremoses (whose normaliser transformers 5 does not use)
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

MAX_LENGTH = 20  # the generation configs' max_length: 19 new tokens, EOS included
EOS = 0  # Marian's EOS; its pad (the decoder's start token) is the last id
EXTRA_IDS = 100  # T5's sentinels
T5_VOCAB = 512  # 400 pieces + 100 sentinels, padded up as Google's are (32100 -> 32128)
PREFIX = "translate English to German: "
PAIRS = read_parallel(demo_corpus_path())[7::151][:9]
SOURCES = [src for src, _ in PAIRS]
SOURCES[2:2] = [""]  # empty lines stay empty, in place
SOURCES[7:7] = [""]
REFERENCES = [tgt for _, tgt in PAIRS]
REFERENCES[2:2] = [""]
REFERENCES[7:7] = [""]


class HFFolder(NamedTuple):
    """A saved Hugging Face model folder with the model and tokenizer that wrote it."""

    path: Path
    model: Any  # eval mode
    tokenizer: Any


class Converted(NamedTuple):
    """An aiayn checkpoint converted by ``aiayn convert`` from ``hf``, and what it printed."""

    hf: HFFolder
    path: Path
    code: int
    out: str
    err: str


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread is faster, and does not stall when the cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------- models


def _redraw_marian(model: Any) -> None:
    """Every parameter redrawn (Hugging Face's init, norms 1 and biases 0, would hide a tensor
    mapped to the wrong place), at scales that keep a random model's outputs varied: embeddings
    N(0, 0.5), queries and keys N(0, 1) (sharp attention, so each step reads other source
    tokens), values and attention outputs N(0, 0.2), feed-forward N(0, 0.3), biases N(0, 0.05),
    norm gains N(1, 0.1); the logits bias N(0, 0.3), EOS's raised by 6 so that some outputs end
    before the limit, the pad's by 6 so that banning it matters. The sinusoid tables stay as
    Hugging Face builds them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            if "layer_norm.weight" in name:
                p.normal_(1.0, 0.1)
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
            elif "shared" in name or "embed_tokens" in name:
                p.normal_(0, 0.5)
            elif "q_proj" in name or "k_proj" in name:
                p.normal_(0, 1.0)
            elif "v_proj" in name or "out_proj" in name:
                p.normal_(0, 0.2)
            else:
                p.normal_(0, 0.3)
        model.final_logits_bias.normal_(0, 0.3)
        model.final_logits_bias[0, EOS] += 6.0
        model.final_logits_bias[0, -1] += 6.0  # the pad, banned: it would win now and then


@pytest.fixture(scope="module")
def marian(
    sentencepiece_models: dict[str, Path],
    make_marian_vocab: Callable[..., dict[str, int]],
    tmp_path_factory: pytest.TempPathFactory,
) -> HFFolder:
    """A random tiny OPUS-MT-style model (tied embeddings, SiLU, scaled embeddings, pad last)
    with its tokenizer (source.spm, target.spm, one vocab.json) and an OPUS-MT generation config
    (4 beams, pad banned, EOS forced at the limit)."""
    root = tmp_path_factory.mktemp("marian")
    source, target = sentencepiece_models["source"], sentencepiece_models["target"]
    vocab = make_marian_vocab(source, target)
    (root / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(str(source), str(target), str(root / "vocab.json"))
    pad = tokenizer.pad_token_id
    assert (pad, tokenizer.eos_token_id) == (len(vocab) - 1, EOS)
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=EOS,
        forced_eos_token_id=EOS,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    _redraw_marian(model)
    model.generation_config = transformers.GenerationConfig(
        num_beams=4,
        max_length=MAX_LENGTH,
        bad_words_ids=[[pad]],
        forced_eos_token_id=EOS,
        decoder_start_token_id=pad,
        eos_token_id=EOS,
        pad_token_id=pad,
    )
    folder = root / "hf"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return HFFolder(folder, model, tokenizer)


def _raise_t5_eos(model: Any, tokenizer: Any) -> None:
    """Move EOS's embedding row (tied: also its output row) along the decoder's mean output, so
    that EOS wins now and then (T5 has no logits bias to raise)."""
    with torch.no_grad():
        batch = tokenizer([PREFIX + s for s in SOURCES if s], return_tensors="pt", padding=True)
        g = torch.Generator().manual_seed(0)
        decoder_inputs = torch.randint(3, 400, (batch["input_ids"].size(0), 12), generator=g)
        decoder_inputs[:, 0] = model.config.decoder_start_token_id
        out = model(**batch, decoder_input_ids=decoder_inputs, output_hidden_states=True)
        mean = out.decoder_hidden_states[-1].mean((0, 1))  # after the final norm
        scale = model.config.d_model**0.5  # the tied head reads hidden / sqrt(d_model)
        model.shared.weight[model.config.eos_token_id] += 0.7 * scale * mean / mean.norm() ** 2


@pytest.fixture(scope="module")
def t5(
    sentencepiece_models: dict[str, Path],
    make_hf_t5_tokenizer: Callable[[Path, int], Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> HFFolder:
    """A random tiny T5 v1.0 (ReLU, tied and scaled output, relative position buckets; every
    parameter ~ N(0, 0.4), the norms' gains ~ N(1, 0.4)) with a T5 tokenizer as transformers 5
    saves it (tokenizer.json; 400 pieces + 100 sentinels, the model's vocabulary padded to 512)
    and a generation config of 4 beams, length penalty 0.6, early stopping."""
    root = tmp_path_factory.mktemp("t5")
    hub = root / "hub"
    hub.mkdir()
    shutil.copy(sentencepiece_models["t5"], hub / "spiece.model")
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (hub / "tokenizer_config.json").write_text(json.dumps(special | {"extra_ids": EXTRA_IDS}))
    tokenizer = make_hf_t5_tokenizer(hub, EXTRA_IDS)
    assert len(tokenizer) == 400 + EXTRA_IDS
    config = transformers.T5Config(
        vocab_size=T5_VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        feed_forward_proj="relu",
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    folder = root / "hf"
    tokenizer.save_pretrained(folder)  # before a padded call sets its backend's padding
    assert not (folder / "spiece.model").exists()  # transformers 5 writes tokenizer.json
    assert json.loads((folder / "tokenizer.json").read_text())["padding"] is None
    torch.manual_seed(1)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "layer_norm" in name else 0.0, 0.4)
    _raise_t5_eos(model, tokenizer)
    model.generation_config = transformers.GenerationConfig(
        num_beams=4,
        max_length=MAX_LENGTH,
        length_penalty=0.6,
        early_stopping=True,
        decoder_start_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    model.save_pretrained(folder)
    return HFFolder(folder, model, tokenizer)


@pytest.fixture(scope="module")
def t5_spm(t5: HFFolder) -> HFFolder:
    """The T5 folder as on the Hub: spiece.model (read with sentencepiece) and its
    tokenizer_config.json instead of tokenizer.json; the same model and tokenizer."""
    folder = t5.path.with_name("hf-spm")
    shutil.copytree(t5.path, folder, ignore=shutil.ignore_patterns("tokenizer*.json"))
    for name in ("spiece.model", "tokenizer_config.json"):
        shutil.copy(t5.path.with_name("hub") / name, folder / name)
    return HFFolder(folder, t5.model, t5.tokenizer)


def _convert(hf: HFFolder, out: Path) -> Converted:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["convert", "--from-hf", str(hf.path), "--to", str(out)])
    return Converted(hf, out, code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture(scope="module")
def converted(
    marian: HFFolder, t5: HFFolder, t5_spm: HFFolder, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Converted]:
    """The folders converted by ``aiayn convert``."""
    root = tmp_path_factory.mktemp("converted")
    folders = {"marian": marian, "t5": t5, "t5-spm": t5_spm}
    return {name: _convert(hf, root / name) for name, hf in folders.items()}


# ----------------------------------------------------------------------------------- helpers


def _main(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class Hyp(NamedTuple):
    """One of Hugging Face's outputs: its text, its score (nan for greedy), and its length in
    tokens (EOS and padding excluded)."""

    text: str
    score: float
    length: int


@torch.no_grad()
def hf_translate(
    hf: HFFolder, lines: list[str], *, num_beams: int, prefix: str = "", n_best: int = 1
) -> list[list[Hyp]]:
    """Hugging Face's n best for each line, alone, with the folder's generation config and
    ``num_beams``; an empty line gives one empty hypothesis."""
    config = hf.model.config
    results: list[list[Hyp]] = []
    for line in lines:
        if not line:
            results.append([Hyp("", 0.0, 0)])
            continue
        out = hf.model.generate(
            **hf.tokenizer(prefix + line, return_tensors="pt"),
            num_beams=num_beams,
            num_return_sequences=n_best,
            return_dict_in_generate=True,
            output_scores=True,
        )
        assert out.sequences.size(1) <= MAX_LENGTH
        texts = hf.tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
        scores = [math.nan] * n_best if num_beams == 1 else out.sequences_scores.tolist()
        generated = out.sequences[:, 1:]
        lengths = ((generated != config.eos_token_id) & (generated != config.pad_token_id)).sum(1)
        results.append([Hyp(*h) for h in zip(texts, scores, lengths.tolist(), strict=True)])
    return results


def _best(results: list[list[Hyp]]) -> list[str]:
    return [hyps[0].text for hyps in results]


def _nonempty(lines: list[str]) -> list[str]:
    """The lines at the places of the non-empty sources."""
    return [line for line, source in zip(lines, SOURCES, strict=True) if source]


def _assert_varied(results: list[list[Hyp]]) -> None:
    """Hugging Face's outputs can tell a wrong decoder apart: mostly non-empty and different,
    some ended by EOS, some cut at the limit (18 or 19 tokens before EOS)."""
    best = [hyps[0] for hyps, source in zip(results, SOURCES, strict=True) if source]
    assert sum(bool(h.text) for h in best) >= len(best) // 2, best
    assert len({h.text for h in best}) >= len(best) // 2, best
    assert any(h.length < MAX_LENGTH - 2 for h in best), best
    assert any(h.length >= MAX_LENGTH - 2 for h in best), best


# ----------------------------------------------------------------------------------- tests


def test_sources_are_normalised() -> None:
    """aiayn normalises whitespace before tokenizing; Hugging Face does not: the same text."""
    assert all(normalize(s) == s for s in SOURCES) and SOURCES.count("") == 2
    assert len(SOURCES) == len(REFERENCES) == 11


@pytest.mark.parametrize("family", ["marian", "t5", "t5-spm"])
def test_convert_then_refuse_to_overwrite(
    family: str, converted: dict[str, Converted], capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = converted[family]
    model = ckpt.hf.model  # aiayn's count: no sinusoid tables; Marian's logits bias is a parameter
    parameters = sum(p.numel() for n, p in model.named_parameters() if "embed_positions" not in n)
    parameters += model.final_logits_bias.numel() if family == "marian" else 0
    assert ckpt.code == 0, ckpt.err
    assert ckpt.out.startswith(f"converted {ckpt.hf.path} -> {ckpt.path}: ")
    assert f", {parameters:,} parameters, " in ckpt.out and ckpt.out.count("\n") == 1
    assert "warning" not in ckpt.err
    tokenizer_file = {"marian": "source.spm", "t5": "tokenizer.json", "t5-spm": "spiece.model"}
    assert (ckpt.path / MANIFEST).is_file() and (ckpt.path / tokenizer_file[family]).is_file()
    state = json.loads((ckpt.path / "state.json").read_text())
    generation = state["generation"]
    assert (generation["num_beams"], generation["max_length"]) == (4, MAX_LENGTH)
    if family == "marian":
        pad = ckpt.hf.tokenizer.pad_token_id
        assert (generation["banned_ids"], generation["forced_eos"]) == ([pad], True)
    else:
        assert (generation["length_penalty"], generation["early_stopping"]) == (0.6, True)
    code, out, err = _main(capsys, "convert", "--from-hf", ckpt.hf.path, "--to", ckpt.path)
    assert code == 2 and out == ""
    assert err == f"aiayn convert: error: {ckpt.path} exists: pass --force to replace it\n"


CASES = {
    "marian-greedy": ("marian", ["--beam", "1"], 1, ""),
    "marian-recorded": ("marian", [], 4, ""),
    "t5-greedy": ("t5", ["--beam", "1"], 1, ""),
    "t5-recorded": ("t5", [], 4, ""),
    "t5-prefix-greedy": ("t5", ["--beam", "1", "--prefix", PREFIX], 1, PREFIX),
    "t5-prefix-recorded": ("t5", ["--prefix", PREFIX], 4, PREFIX),
    "t5-spm-prefix-recorded": ("t5-spm", ["--prefix", PREFIX], 4, PREFIX),
}


@pytest.mark.parametrize(("family", "args", "num_beams", "prefix"), CASES.values(), ids=CASES)
def test_translate_equals_hugging_face_generate(
    family: str,
    args: list[str],
    num_beams: int,
    prefix: str,
    converted: dict[str, Converted],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt = converted[family]
    src, out = _write_lines(tmp_path / "src.txt", SOURCES), tmp_path / "out.txt"
    code, stdout, err = _main(
        capsys, "translate", "--checkpoint", ckpt.path, "-i", src, "-o", out, *args
    )
    assert code == 0, err
    assert stdout == "" and "warning" not in err
    results = hf_translate(ckpt.hf, SOURCES, num_beams=num_beams, prefix=prefix)
    _assert_varied(results)
    expected = _best(results)
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) == len(SOURCES) + 1
    if prefix:  # empty lines: see test_an_empty_line_stays_empty_with_a_prefix
        got, expected = _nonempty(got[:-1]), _nonempty(expected)
    else:
        got.pop()
        assert got[2] == got[7] == ""
    assert got == expected


def test_marian_n_best_lists_equal_hugging_face(
    converted: dict[str, Converted], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = converted["marian"]
    src = _write_lines(tmp_path / "src.txt", SOURCES)
    code, out, err = _main(
        capsys, "translate", "--checkpoint", ckpt.path, "-i", src, "--n-best", "2"
    )
    assert code == 0, err
    rows = out.split("\n")
    assert rows[-1] == "" and len(rows) == len(SOURCES) + 1
    expected = hf_translate(ckpt.hf, SOURCES, num_beams=4, n_best=2)
    for row, source, best in zip(rows, SOURCES, expected, strict=False):
        fields = row.split("\t")
        if not source:
            assert fields == ["", "0.0000"], row  # one empty hypothesis
            continue
        assert len(fields) == 4, row
        texts, scores = fields[0::2], [float(s) for s in fields[1::2]]
        assert texts == [h.text for h in best]
        assert scores == pytest.approx([h.score for h in best], abs=1e-3)
        assert scores[0] >= scores[1]


@pytest.mark.parametrize(
    ("family", "prefix"), [("marian", ""), ("t5", PREFIX)], ids=["marian", "t5"]
)
def test_evaluate_translates_with_the_checkpoint_and_scores(
    family: str,
    prefix: str,
    converted: dict[str, Converted],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt = converted[family]
    # with a prefix, the sentences only (see test_an_empty_line_stays_empty_with_a_prefix)
    sources, references = (
        (_nonempty(SOURCES), _nonempty(REFERENCES)) if prefix else (SOURCES, REFERENCES)
    )
    src = _write_lines(tmp_path / "src.txt", sources)
    ref = _write_lines(tmp_path / "ref.txt", references)
    args = ["evaluate", "--checkpoint", ckpt.path, "--src", src, "--ref", ref, "--prefix", prefix]
    code, out, err = _main(capsys, *args)
    assert code == 0, err
    hyps = _best(hf_translate(ckpt.hf, sources, num_beams=4, prefix=prefix))
    written = (tmp_path / "src.txt.hyp").read_text(encoding="utf-8")
    assert written == "".join(h + "\n" for h in hyps)
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("BLEU = ") and lines[1].startswith("chrF")
    assert lines == [str(corpus_bleu(hyps, references)), str(corpus_chrf(hyps, references))]


# ------------------------------------------------------------------------ regressions


def test_an_empty_line_stays_empty_with_a_prefix(
    converted: dict[str, Converted], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _write_lines(tmp_path / "src.txt", ["I won!", "", "Is Tom hot?"])
    args = ["translate", "--checkpoint", converted["t5"].path, "-i", src, "--beam", "1"]
    code, out, err = _main(capsys, *args, "--prefix", PREFIX)
    assert code == 0, err
    assert out.split("\n")[1] == ""


def test_a_tokenizer_json_saved_with_padding_translates_each_line_as_alone(
    converted: dict[str, Converted], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = converted["t5"].hf
    folder = tmp_path / "hf"
    shutil.copytree(hf.path, folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf.path)
    # a padded, truncated call sets its backend's padding and truncation ...
    tokenizer(["I won!", "Is Tom hot?"], padding=True, truncation=True, max_length=6)
    tokenizer.save_pretrained(folder)  # ... which tokenizer.json then records
    saved = json.loads((folder / "tokenizer.json").read_text())
    assert saved["padding"] is not None and saved["truncation"]["max_length"] == 6
    assert _main(capsys, "convert", "--from-hf", folder, "--to", tmp_path / "ckpt")[0] == 0
    sources = _nonempty(SOURCES)
    src = _write_lines(tmp_path / "src.txt", sources)
    args = ["translate", "--checkpoint", tmp_path / "ckpt", "-i", src, "--beam", "1"]
    code, out, err = _main(capsys, *args)
    assert code == 0, err
    assert out.splitlines() == _best(hf_translate(hf, sources, num_beams=1))


# ----------------------------------------------------------------------------------- refusals


def _assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("aiayn translate: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_a_gpt2_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = Tokenizer.train(["a small dog runs", "hello world"] * 10, 300, min_frequency=1)
    tokenizer.save(tmp_path / "tok.json")
    config = GPT2Config(
        vocab_size=tokenizer.vocab_size,
        max_len=16,
        d_model=32,
        num_heads=4,
        num_layers=1,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
    )
    ckpt = save_checkpoint(tmp_path / "gpt2", GPT2(config), {}, tmp_path / "tok.json")
    src = _write_lines(tmp_path / "src.txt", ["hello world"])
    result = _main(capsys, "translate", "--checkpoint", ckpt, "-i", src)
    _assert_one_line_error(*result, "gpt2")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("deleted", "file not found"),  # the checkpoint's file list (state.json) names it
        ("not json", f"{MANIFEST}: not a readable JSON file"),
        ("wrong eos", "eos_id"),
    ],
)
def test_a_damaged_tokenizer_manifest_is_refused(
    damage: str,
    message: str,
    converted: dict[str, Converted],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(converted["marian"].path, ckpt)
    manifest = ckpt / MANIFEST
    if damage == "deleted":
        manifest.unlink()
    elif damage == "not json":
        manifest.write_text("{", encoding="utf-8")
    else:
        manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"eos_id": 7}))
    record_checksums(ckpt)  # an edit by hand, accepted: the manifest's own checks answer
    src = _write_lines(tmp_path / "src.txt", ["I won!"])
    result = _main(capsys, "translate", "--checkpoint", ckpt, "-i", src)
    _assert_one_line_error(*result, message)


def test_an_unknown_length_penalty_is_an_argparse_error(
    converted: dict[str, Converted], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--checkpoint", str(converted["t5"].path), "--length-penalty", "bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("aiayn translate: error: argument --length-penalty: invalid choice")


@pytest.mark.parametrize("family", ["marian", "t5", "t5-spm"])
def test_written_back_the_folder_translates_as_the_original(
    family: str, converted: dict[str, Converted], tmp_path: Path
) -> None:
    """``aiayn convert --checkpoint --to-hf``: the tokenizer files the folder came with, its
    generation settings and its weights go back; transformers' tokenizer gives the original's
    ids, and ``generate`` with the written generation config the original's outputs."""
    ckpt, out = converted[family], tmp_path / "back"
    assert main(["convert", "--checkpoint", str(ckpt.path), "--to-hf", str(out)]) == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    prefix = "" if family == "marian" else PREFIX
    lines = [prefix + s for s in SOURCES if s]
    assert tokenizer(lines)["input_ids"] == ckpt.hf.tokenizer(lines)["input_ids"]
    assert model.generation_config.num_beams == 4
    back = HFFolder(out, model, tokenizer)
    for beams in (1, 4):
        expected = hf_translate(ckpt.hf, SOURCES, num_beams=beams, prefix=prefix)
        assert hf_translate(back, SOURCES, num_beams=beams, prefix=prefix) == expected
