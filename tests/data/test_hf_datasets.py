"""Hugging Face ``datasets`` corpora (save_to_disk folders, parquet files) and sacreBLEU test sets
read from its cache: the same pairs from every form, in both directions, and one-line errors.
Nothing is downloaded: the sacreBLEU downloader is replaced by one that fails the test."""

from __future__ import annotations

import socket
import sys
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from aiayn.data import demo_corpus_path, read_parallel
from aiayn.data import hf_datasets as hf
from aiayn.data.hf_datasets import HFCorpus, hf_pairs, locate, read_eval_source, sacrebleu_files
from aiayn.errors import ConfigError, UserError

datasets = pytest.importorskip("datasets")

SPLITS = {"train": slice(0, 300), "validation": slice(300, 340), "test": slice(340, 370)}


def go_offline(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """No network: the HF offline flags (in the environment and in the modules that read them at
    import), a private ``datasets`` cache, sacreBLEU's downloader and every internet socket
    refused (a test that tries to go online fails)."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setattr(datasets.config, name, True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)

    def no_download(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a test tried to download {args[:1]}")

    def no_connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"a test tried to connect to {address}")
        return real_connect(sock, address)

    real_connect = socket.socket.connect
    monkeypatch.setattr("sacrebleu.dataset.base.download_file", no_download)
    monkeypatch.setattr(socket.socket, "connect", no_connect)


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go_offline(monkeypatch, tmp_path / "hf_cache")


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    """370 English-German pairs of the shipped demo corpus."""
    return read_parallel(demo_corpus_path())[:370]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]]) -> Path:
    """``disk/`` (save_to_disk of a DatasetDict) and ``parquet/de-en/SPLIT-….parquet``."""
    root = tmp_path_factory.mktemp("hf_sample")
    splits = {}
    for split, part in SPLITS.items():
        rows = [{"translation": {"de": de, "en": en}} for en, de in pairs[part]]
        splits[split] = datasets.Dataset.from_list(rows)
        (root / "parquet" / "de-en").mkdir(parents=True, exist_ok=True)
        splits[split].to_parquet(
            str(root / "parquet" / "de-en" / f"{split}-00000-of-00001.parquet")
        )
    datasets.DatasetDict(splits).save_to_disk(str(root / "disk"))
    return root


@pytest.mark.parametrize("form", ["disk", "parquet"])
def test_every_form_reads_the_same_pairs_in_both_directions(
    sample: Path, pairs: list[tuple[str, str]], form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf, "BATCH_ROWS", 64)  # several Arrow batches, the last one short
    config = "de-en" if form == "parquet" else None
    corpus = HFCorpus(str(sample / form), config, "en", "de")
    assert locate(corpus)[0] == form
    assert list(hf_pairs(corpus, "train")) == pairs[:300]
    assert list(hf_pairs(corpus, "test")) == pairs[340:370]
    backwards = HFCorpus(str(sample / form), config, "de", "en")
    assert list(hf_pairs(backwards, "validation")) == [(de, en) for en, de in pairs[300:340]]
    assert read_eval_source("split:validation", corpus, "en", "de") == pairs[300:340]


def test_one_column_per_language_and_missing_texts(tmp_path: Path) -> None:
    rows = {"en": ["A cat.", None, "Two dogs."], "de": ["Eine Katze.", "Leer.", "Zwei Hunde."]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "flat"))  # one Dataset: train
    corpus = HFCorpus(str(tmp_path / "flat"), None, "en", "de")
    got = list(hf_pairs(corpus, "train"))
    assert got == [("A cat.", "Eine Katze."), ("", "Leer."), ("Two dogs.", "Zwei Hunde.")]
    with pytest.raises(UserError, match="holds one split, 'train'; there is no 'validation'"):
        list(hf_pairs(corpus, "validation"))


def test_local_folder_errors_name_the_value(sample: Path) -> None:
    def read(
        dataset: str, config: str | None = None, split: str = "train", tgt: str = "de"
    ) -> None:
        list(hf_pairs(HFCorpus(dataset, config, "en", tgt), split))

    with pytest.raises(UserError, match=r"no split 'dev' .*it has: test, train, validation"):
        read(str(sample / "disk"), split="dev")
    with pytest.raises(UserError, match=r"split 'dev' of the parquet folder .*de-en"):
        read(str(sample / "parquet"), "de-en", split="dev")
    with pytest.raises(UserError, match=r"no 'translation\.fr' text .*translation\.de"):
        read(str(sample / "disk"), tgt="fr")
    with pytest.raises(UserError, match="no subfolder 'fr-en' in the dataset folder"):
        read(str(sample / "parquet"), "fr-en")
    with pytest.raises(UserError, match=r"dataset folder not found: .*nowhere"):
        read(str(sample / "nowhere"))
    with pytest.raises(UserError, match="is a file"):
        read(str(next((sample / "parquet" / "de-en").iterdir())))


def test_hub_name_offline_is_one_line_error() -> None:
    with pytest.raises(
        UserError, match=r"cannot read split 'train' of the Hub dataset 'wmt/wmt14'"
    ):
        list(hf_pairs(HFCorpus("wmt/wmt14", "de-en", "en", "de"), "train"))


def test_without_datasets_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(
        UserError, match=r"needs the `datasets` package: pip install 'aiayn\[wmt\]'"
    ):
        list(hf_pairs(HFCorpus("wmt/wmt14", "de-en", "en", "de"), "train"))


def write_sacrebleu_cache(root: Path, name: str, pair: str, lines: list[tuple[str, str]]) -> None:
    """sacreBLEU's processed files: ``ROOT/NAME/NAME_.PAIR.src`` and ``.ref``."""
    folder, stem = root / name, name.replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)
    for field, column in (("src", 0), ("ref", 1)):
        text = "".join(f"{p[column]}\n" for p in lines)
        (folder / f"{stem}.{pair}.{field}").write_text(text, encoding="utf-8")


def test_sacrebleu_test_set_from_the_cache(
    tmp_path: Path, pairs: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SACREBLEU", str(tmp_path / "sb"))
    write_sacrebleu_cache(tmp_path / "sb", "wmt14/full", "en-de", pairs[:25])
    src, ref = sacrebleu_files("wmt14/full", "en", "de")
    assert (src.name, ref.name) == ("wmt14_full.en-de.src", "wmt14_full.en-de.ref")
    assert read_eval_source("sacrebleu:wmt14/full", None, "en", "de") == pairs[:25]
    # not cached and downloads off: a one-line error with the command that fetches it
    with pytest.raises(
        UserError, match=r"wmt13 \(en-de\) is not in the cache .*sacrebleu -t wmt13"
    ):
        sacrebleu_files("wmt13", "en", "de")


def test_sacrebleu_download_failure_is_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("SACREBLEU", str(tmp_path / "sb"))

    def offline(*args: Any, **kwargs: Any) -> None:
        raise urllib.error.URLError("no network here")

    monkeypatch.setattr("sacrebleu.dataset.base.download_file", offline)
    with pytest.raises(
        UserError, match=r"could not download sacreBLEU test set wmt13 .*no network"
    ):
        sacrebleu_files("wmt13", "en", "de")


def test_eval_source_forms_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"data\.test='wmt14': expected sacrebleu:TEST_SET"):
        hf.check_eval_source("wmt14", "data.test", "en", "de", train_split=None)
    with pytest.raises(ConfigError, match="sacreBLEU has no test set 'wmt99'"):
        hf.check_eval_source("sacrebleu:wmt99", "data.test", "en", "de", train_split=None)
    with pytest.raises(ConfigError, match=r"wmt14 has no language pair en-ja .*en-de"):
        hf.check_eval_source("sacrebleu:wmt14", "data.test", "en", "ja", train_split=None)
    with pytest.raises(ConfigError, match=r"names a split of data\.hf_dataset, which is not set"):
        hf.check_eval_source("split:test", "data.test", "en", "de", train_split=None)
    with pytest.raises(ConfigError, match=r"is the training split"):
        hf.check_eval_source("split:train", "data.valid", "en", "de", train_split="train")
