"""Hugging Face folders: sources (folder or Hub name), weight files, and the tokenizer giving the
ids transformers gives."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, GPT2TokenizerFast

from aiayn.convert import gpt2_from_hf, gpt2_to_hf
from aiayn.convert.checks import check_field_types
from aiayn.convert.hf_folder import (
    folder_file,
    read_hf_config,
    read_hf_weights,
    resolve_hf_source,
)
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.errors import UserError

MakeHF = Callable[..., Any]

TRICKY = [
    "Hello world",
    " leading space",
    "double  spaces   and three",
    "new\nline\n\n and \r\n crlf\ttab",
    "café naïve façade Ærø",
    "東京と北京",
    "😀🚀 emoji 👍🏽",
    "text<|endoftext|>more <|endoftext|> and <|endoftext|>",
    "   ",
    "'s 've 're n't 123 4567",
]


def test_a_folder_is_used_as_it_is_and_a_name_goes_to_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_hf_source(tmp_path) == tmp_path
    calls: list[tuple[str, list[str]]] = []

    def fake_download(name: str, allow_patterns: list[str]) -> str:
        calls.append((name, allow_patterns))
        (tmp_path / "model.safetensors").touch()
        return str(tmp_path)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_download)
    assert resolve_hf_source("openai-community/gpt2") == tmp_path
    assert calls[0][0] == "openai-community/gpt2"
    assert "model.safetensors" in calls[0][1] and "pytorch_model.bin" not in calls[0][1]
    for path in (tmp_path / "missing", "./gpt2", "runs/a/b"):
        with pytest.raises(UserError, match=r"no such folder$"):
            resolve_hf_source(path)
    assert len(calls) == 1
    (tmp_path / "file").touch()
    with pytest.raises(UserError, match="a file, not a Hugging Face model folder"):
        resolve_hf_source(tmp_path / "file")


def test_a_hub_repository_without_safetensors_is_fetched_as_pytorch_bin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patterns: list[list[str]] = []

    def fake_download(name: str, allow_patterns: list[str]) -> str:
        patterns.append(allow_patterns)
        return str(tmp_path)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_download)
    resolve_hf_source("gpt2")
    assert len(patterns) == 2 and "pytorch_model.bin" in patterns[1]
    assert not any(p.endswith(".bin") for p in patterns[0])


def test_an_unknown_hub_name_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(name: str, allow_patterns: list[str]) -> str:
        raise OSError("404 Client Error\nmore detail")

    monkeypatch.setattr("huggingface_hub.snapshot_download", failing)
    with pytest.raises(UserError, match=r"^nobody/nothing: no such folder.*404 Client Error\)$"):
        resolve_hf_source("nobody/nothing")


def test_folders_without_config_or_weights_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"config\.json: cannot read the model config"):
        read_hf_config(tmp_path)
    with pytest.raises(UserError, match=r"no weights in .*expected model\.safetensors"):
        read_hf_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(UserError, match=r"model\.safetensors: cannot read the weights"):
        read_hf_weights(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(UserError, match="not a readable shard index"):
        read_hf_weights(tmp_path)


def _assert_same_ids(ours: TextTokenizer, theirs: Any) -> None:
    for text in TRICKY:
        assert ours.encode(text) == theirs(text)["input_ids"], text
        assert ours.decode(ours.encode(text)) == text.replace("<|endoftext|>", "")


def test_tokenizer_from_vocab_and_merges_matches_transformers(make_hf: MakeHF) -> None:
    hf = make_hf(tokenizer=True)
    _, tokenizer = gpt2_from_hf(hf.path)
    assert tokenizer is not None
    assert tokenizer.token_to_id("<|endoftext|>") == 0
    _assert_same_ids(tokenizer, GPT2TokenizerFast.from_pretrained(hf.path))


def test_tokenizer_json_written_by_transformers_matches(make_hf: MakeHF) -> None:
    hf = make_hf(tokenizer=True)
    GPT2TokenizerFast.from_pretrained(hf.path).save_pretrained(hf.path)
    for name in ("vocab.json", "merges.txt"):
        (hf.path / name).unlink(missing_ok=True)
    assert (hf.path / "tokenizer.json").is_file()
    _, tokenizer = gpt2_from_hf(hf.path)
    assert tokenizer is not None
    _assert_same_ids(tokenizer, AutoTokenizer.from_pretrained(hf.path))


def test_tokenizer_written_back_loads_in_transformers(make_hf: MakeHF, tmp_path: Path) -> None:
    hf = make_hf(tokenizer=True)
    model, tokenizer = gpt2_from_hf(hf.path)
    assert tokenizer is not None
    out = gpt2_to_hf(model, tmp_path / "back", tokenizer)
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    _assert_same_ids(tokenizer, AutoTokenizer.from_pretrained(out))
    _assert_same_ids(TextTokenizer.load(out), GPT2TokenizerFast.from_pretrained(hf.path))


# -- files from others: only regular files inside the folder, typed fields, finite tensors --------


def test_folder_file_takes_only_regular_files_inside_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "a.safetensors").write_bytes(b"x")
    (tmp_path / "out.safetensors").write_bytes(b"x")
    (folder / "inner").symlink_to("a.safetensors")
    (folder / "outer").symlink_to("../out.safetensors")
    os.mkfifo(folder / "fifo")
    assert folder_file(folder, "a.safetensors") == folder / "a.safetensors"
    assert folder_file(folder, "inner") == folder / "inner"  # a link that stays inside
    for name, why in [
        ("../out.safetensors", "is not a file name inside the folder"),
        (str(tmp_path / "out.safetensors"), "is not a file name inside the folder"),
        ("", "is not a file name inside the folder"),
        ("outer", "leads out of the folder"),
        ("fifo", "is not a regular file"),
        ("missing", "cannot read the shard"),
    ]:
        with pytest.raises(UserError, match=why):
            folder_file(folder, name, what="shard")


def test_a_hub_snapshot_may_link_to_its_blobs(tmp_path: Path) -> None:
    repo = tmp_path / "models--x"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_bytes(b"x")
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/abc")
    assert folder_file(snapshot, "model.safetensors") == snapshot / "model.safetensors"
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "model.safetensors").symlink_to("../models--x/blobs/abc")
    with pytest.raises(UserError, match="leads out of the folder"):
        folder_file(tmp_path / "plain", "model.safetensors")


def test_a_shard_index_outside_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"wte.weight": "../../etc/passwd"}})
    )
    with pytest.raises(UserError, match=r"shard '\.\./\.\./etc/passwd' is not a file name"):
        read_hf_weights(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"wte.weight": 3}})
    )
    with pytest.raises(UserError, match="not a readable shard index"):
        read_hf_weights(tmp_path)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_tensors_are_refused_by_name(tmp_path: Path, value: float) -> None:
    tensors = {"a": torch.zeros(3), "b": torch.ones(2, 2), "ids": torch.arange(3)}
    tensors["b"][1, 0] = value
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(UserError, match=r"model\.safetensors: tensor 'b' holds NaN or infinite"):
        read_hf_weights(tmp_path)
    tensors["b"][1, 0] = 0.0
    save_file(tensors, tmp_path / "model.safetensors")
    assert read_hf_weights(tmp_path).keys() == {"a", "b", "ids"}


def test_fields_of_the_wrong_type_are_named() -> None:
    defaults = {"vocab_size": 10, "dropout": 0.1, "tied": True, "act": "gelu", "inner": None}
    check_field_types(
        {"vocab_size": 5, "dropout": 0, "tied": False, "act": "relu", "inner": 3}, defaults
    )
    check_field_types({"inner": None, "other": "anything"}, defaults)
    for field, value, expected in [
        ("vocab_size", "400", "an integer"),
        ("vocab_size", 4.0, "an integer"),
        ("vocab_size", True, "an integer"),
        ("dropout", "0.1", "a number"),
        ("tied", 1, "true or false"),
        ("act", ["gelu"], "a string"),
        ("inner", "3", "a number or null"),
    ]:
        wrong = rf"config\.json: {field}=.* has the wrong type \(expected {expected}\)"
        with pytest.raises(UserError, match=wrong):
            check_field_types({field: value}, defaults)
    check_field_types({"vocab_size": "x"}, defaults, skip=("vocab_size",))
