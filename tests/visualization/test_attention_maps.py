"""aiayn.visualization.attention_maps / html_report and ``aiayn attention``: the maps' invariants
(rows sum to 1, causal decoder self-attention), the files written, the CLI and its errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.models import Transformer
from aiayn.visualization.attention_maps import (
    KINDS,
    AttentionMaps,
    attention_filename,
    check_length,
    collect_attention,
    greedy_translation,
    token_label,
    write_attention_pngs,
)
from aiayn.visualization.html_report import attention_html, report_data

SOURCE = "the cat sat on the mat"
TARGET = "die katze sass auf der matte"


@pytest.fixture(scope="module")
def model_and_tokenizer(checkpoint_dir: Path) -> tuple[Transformer, Tokenizer]:
    checkpoint = load_checkpoint(checkpoint_dir)
    return checkpoint.model, Tokenizer.load(checkpoint.tokenizer_path)


@pytest.fixture(scope="module")
def maps(model_and_tokenizer: tuple[Transformer, Tokenizer]) -> AttentionMaps:
    model, tokenizer = model_and_tokenizer
    return collect_attention(model, tokenizer, SOURCE, TARGET)


def test_shapes_and_labels(
    maps: AttentionMaps, model_and_tokenizer: tuple[Transformer, Tokenizer]
) -> None:
    _, tokenizer = model_and_tokenizer
    s = len(tokenizer.encode(SOURCE)) + 1  # + EOS
    t = len(tokenizer.encode(TARGET)) + 1  # + BOS
    assert len(maps.encoder_self) == 1 and len(maps.decoder_self) == len(maps.cross) == 2
    assert all(w.shape == (2, s, s) for w in maps.encoder_self)
    assert all(w.shape == (2, t, t) for w in maps.decoder_self)
    assert all(w.shape == (2, t, s) for w in maps.cross)
    assert maps.source_labels[-1] == "</s>" and maps.target_labels[0] == "<s>"
    assert len(maps.source_labels) == s and len(maps.target_labels) == t
    assert maps.source_labels[0] == "the" and maps.source_labels[1].startswith("▁")
    assert maps.target == TARGET and not maps.target_from_model


@pytest.mark.parametrize("kind", KINDS)
def test_every_row_sums_to_one(maps: AttentionMaps, kind: str) -> None:
    for weights in maps.maps(kind):  # (H, R, C)
        assert bool((weights >= 0).all())
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]))


def test_decoder_self_attention_is_causal(maps: AttentionMaps) -> None:
    for weights in maps.decoder_self:  # (H, T, T)
        above = torch.triu(torch.ones_like(weights[0], dtype=torch.bool), diagonal=1)  # (T, T)
        assert bool((weights[:, above] == 0).all()), "a position attends to a later one"
        assert bool((weights[:, 0, 0] == 1).all())  # BOS can only see itself
        assert bool((weights[:, ~above] > 0).any())
    # The other two kinds are not masked: something above the diagonal is non-zero.
    assert bool((torch.triu(maps.encoder_self[0], diagonal=1) > 0).any())


def test_maps_are_the_models_returned_weights_in_eval_mode(
    model_and_tokenizer: tuple[Transformer, Tokenizer], maps: AttentionMaps
) -> None:
    model, tokenizer = model_and_tokenizer
    model.train()  # dropout 0.1 in the config: the maps must not depend on it
    try:
        again = collect_attention(model, tokenizer, SOURCE, TARGET)
        assert model.training, "collect_attention must restore the model's mode"
    finally:
        model.eval()
    src = torch.tensor([[*tokenizer.encode(SOURCE), tokenizer.eos_id]])  # (1, S)
    expected = model.encode(src, need_weights=True).self_weights
    assert expected is not None
    for ours, theirs, direct in zip(maps.encoder_self, again.encoder_self, expected, strict=True):
        torch.testing.assert_close(ours, theirs)
        torch.testing.assert_close(ours, direct[0])


def test_default_target_is_the_models_greedy_translation(
    model_and_tokenizer: tuple[Transformer, Tokenizer],
) -> None:
    model, tokenizer = model_and_tokenizer
    src_ids = tokenizer.encode("tom is my friend")
    out = greedy_translation(model, tokenizer, src_ids, extra_len=3)
    assert len(out) <= len(src_ids) + 3 and tokenizer.eos_id not in out
    maps = collect_attention(model, tokenizer, "  tom  is my friend ")
    assert maps.target_from_model and maps.source == "tom is my friend"
    expected = greedy_translation(model, tokenizer, src_ids)
    assert maps.target_labels == ["<s>", *(token_label(tokenizer, i) for i in expected)]
    assert maps.target == tokenizer.decode(expected)


def test_length_limits() -> None:
    check_length("the source sentence", 10, model_limit=10, max_tokens=10)  # at the limits
    check_length("the source sentence", 500, model_limit=None, max_tokens=None)
    with pytest.raises(UserError, match="source sentence has 11 tokens; this model's limit is 10"):
        check_length("the source sentence", 11, model_limit=10, max_tokens=None)
    with pytest.raises(UserError, match="has 11 tokens, more than --max-tokens 10"):
        check_length("the target sentence", 11, model_limit=None, max_tokens=10)


def test_a_sentence_past_learned_positions_is_refused(
    model_and_tokenizer: tuple[Transformer, Tokenizer],
) -> None:
    _, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, d_model=16, d_ff=32, num_heads=2)
    s, t = len(tokenizer.encode(SOURCE)) + 1, len(tokenizer.encode(TARGET)) + 1  # EOS, BOS
    learned = Transformer(replace(config, positional="learned", max_len=min(s, t) - 1))
    limit = f"this model's limit is {min(s, t) - 1}"
    with pytest.raises(UserError, match=f"source sentence has {s} tokens; {limit}"):
        collect_attention(learned, tokenizer, SOURCE, "der")
    with pytest.raises(UserError, match=f"target sentence has {t} tokens; {limit}"):
        collect_attention(learned, tokenizer, "the", TARGET)


def test_maps_show_the_whole_sentence_past_sinusoidal_max_len(
    model_and_tokenizer: tuple[Transformer, Tokenizer],
) -> None:
    """Sinusoidal positions go on past max_len: the source is drawn whole, and the model's own
    translation is of that whole source (translating a file truncates it at max_len, with a
    warning; here that would draw one sentence and translate another)."""
    model, tokenizer = model_and_tokenizer
    assert model.config.positional == "sinusoidal"
    long = " ".join(["cat"] * model.config.max_len)
    n = len(tokenizer.encode(long))
    assert n >= model.config.max_len
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no truncation warning
        maps = collect_attention(model, tokenizer, long)
    assert len(maps.source_labels) == n + 1 and maps.cross[0].shape[-1] == n + 1


@pytest.mark.parametrize("side", ["source", "target", "translation"])
def test_max_tokens_refuses_each_side(
    model_and_tokenizer: tuple[Transformer, Tokenizer], side: str
) -> None:
    model, tokenizer = model_and_tokenizer
    s, t = len(tokenizer.encode(SOURCE)) + 1, len(tokenizer.encode(TARGET)) + 1  # EOS, BOS
    if side == "source":
        with pytest.raises(UserError, match=f"source sentence has {s} tokens, more than"):
            collect_attention(model, tokenizer, SOURCE, SOURCE, max_tokens=s - 1)
    elif side == "target":
        with pytest.raises(UserError, match=f"target sentence has {t} tokens, more than"):
            collect_attention(model, tokenizer, SOURCE, TARGET, max_tokens=t - 1)
    else:
        own = len(greedy_translation(model, tokenizer, tokenizer.encode(SOURCE))) + 1  # + BOS
        with pytest.raises(UserError, match=f"model's translation .* has {own} tokens"):
            collect_attention(model, tokenizer, SOURCE, max_tokens=own - 1)
    maps = collect_attention(model, tokenizer, SOURCE, TARGET, max_tokens=max(s, t))  # fits
    assert (len(maps.source_labels), len(maps.target_labels)) == (s, t)


def test_token_labels(model_and_tokenizer: tuple[Transformer, Tokenizer]) -> None:
    _, tokenizer = model_and_tokenizer
    assert token_label(tokenizer, tokenizer.bos_id) == "<s>"
    assert token_label(tokenizer, tokenizer.pad_id) == "<pad>"
    ids = tokenizer.encode("cat cat")
    assert [token_label(tokenizer, i) for i in ids] == ["cat", "▁cat"]


def test_pngs_have_the_expected_names(maps: AttentionMaps, tmp_path: Path) -> None:
    written = write_attention_pngs(maps, tmp_path)
    expected = {attention_filename("encoder_self", 1, h) for h in (1, 2)}
    expected |= {
        attention_filename(k, layer, h) for k in KINDS[1:] for layer in (1, 2) for h in (1, 2)
    }
    expected |= {f"{kind}_all.png" for kind in KINDS}
    assert "encoder_self_L1_H2.png" in expected
    assert {p.name for p in written} == expected
    assert {p.name for p in tmp_path.iterdir()} == expected
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_page_is_self_contained(maps: AttentionMaps) -> None:
    page = attention_html(maps)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "http://" not in page and "https://" not in page
    blob = re.search(
        r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S
    )
    assert blob is not None
    data = json.loads(blob.group(1))
    assert data == json.loads(json.dumps(report_data(maps)))
    assert [k["name"] for k in data["kinds"]] == list(KINDS)
    cross = data["kinds"][2]
    assert len(cross["layers"]) == 2 and len(cross["layers"][0]) == 2  # N × H
    assert cross["rows"] == maps.target_labels and cross["cols"] == maps.source_labels


def test_html_escapes_the_sentences(maps: AttentionMaps) -> None:
    nasty = AttentionMaps(
        source="a </script><script>alert(1)</script> & <b>",
        target=maps.target,
        target_from_model=False,
        source_labels=["</script>", *maps.source_labels[1:]],
        target_labels=maps.target_labels,
        encoder_self=maps.encoder_self,
        decoder_self=maps.decoder_self,
        cross=maps.cross,
    )
    page = attention_html(nasty)
    assert page.count("</script>") == 3  # the data block's and the two scripts' own
    assert "alert(1)</script>" not in page and "&lt;b&gt;" in page


# -- the command ---------------------------------------------------------------------------
def test_cli_with_target(
    checkpoint_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "maps"
    argv = ["attention", "--checkpoint", str(checkpoint_dir), "--src", SOURCE, "--tgt", TARGET]
    assert main([*argv, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"Target (given): {TARGET}" in stdout
    names = {p.name for p in out.iterdir()}
    assert {"attention.html", "encoder_self_L1_H2.png", "decoder_self_L2_H1.png"} <= names
    assert "cross_L2_H2.png" in names and len(names) == 1 + 10 + 3


def test_cli_without_target_translates(
    checkpoint_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "maps"
    argv = ["attention", "--checkpoint", str(checkpoint_dir), "--src", "tom is my friend"]
    assert main([*argv, "--out", str(out), "--no-png"]) == 0
    assert "Target (the model's own greedy translation):" in capsys.readouterr().out
    assert [p.name for p in out.iterdir()] == ["attention.html"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--src", "   "], "--src is empty"),
        (["--src", "a cat", "--tgt", ""], "--tgt is empty"),
    ],
)
def test_cli_rejects_empty_sentences(
    checkpoint_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    argv = ["attention", "--checkpoint", str(checkpoint_dir), "--out", str(tmp_path), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn attention: error: ") and message in err
    assert "Traceback" not in err


def test_cli_refuses_sentences_too_long_to_draw_before_writing(
    checkpoint_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default --max-tokens: a paragraph-long sentence is one line and exit 2 (before, a
    600-token sentence drew for minutes in gigabytes, and 3,000 tokens ran out of memory)."""
    long = " ".join(["cat"] * 200)
    out = tmp_path / "maps"
    argv = ["attention", "--checkpoint", str(checkpoint_dir), "--src", long, "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "source sentence has 201 tokens, more than --max-tokens 160" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main([*argv, "--tgt", TARGET, "--max-tokens", "201", "--no-png"]) == 0


def test_cli_missing_checkpoint_exits_2_without_traceback(tmp_path: Path) -> None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": src if not path else os.pathsep.join([src, path])}
    missing = tmp_path / "no_such_checkpoint"
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "attention", "--checkpoint", str(missing), "--src", "hi"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "aiayn attention: error: checkpoint not found" in done.stderr
    assert "Traceback" not in done.stderr
