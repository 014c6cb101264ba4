"""The paper's data path: configs/base.yaml's data section (WMT14 EN-DE from Hugging Face
``datasets``, newstest2013/2014 from sacreBLEU) drives ``aiayn train`` end to end, here on a
local sample of a few hundred pairs saved as a ``save_to_disk`` folder and as parquet files, and
sacreBLEU-style test set files in a private cache; the model is shrunk with ``--set``. Nothing
goes online: the HF offline flags are on, sacreBLEU's downloader and internet sockets fail the
test. Also: the data section's rules and one-line errors."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli.main import main
from aiayn.data import demo_corpus_path, read_parallel
from aiayn.errors import ConfigError
from aiayn.training.config import DataConfig, load_run_config

ROOT = Path(__file__).resolve().parents[2]
BASE = str(ROOT / "configs" / "base.yaml")

SHRINK = [
    "model.d_model=32",
    "model.d_ff=64",
    "model.num_heads=4",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "data.vocab_size=300",
    "data.min_frequency=1",
    "data.bleu_sentences=8",
    "train.max_tokens=400",
    "train.max_steps=3",
    "train.warmup_steps=10",
    "train.eval_every=0",
    "train.save_every=0",
    "train.average_last=0",
    "train.keep_last=1",
    "train.log_every=1",
    "train.device=cpu",
    "train.progress=false",
]


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Downloads off (see the module docstring); returns the private sacreBLEU cache folder."""
    datasets = pytest.importorskip("datasets")
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(datasets.config, name, True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setenv("SACREBLEU", str(tmp_path / "sacrebleu"))
    real_connect = socket.socket.connect

    def no_connect(sock: socket.socket, address: Any) -> None:
        assert sock.family not in (socket.AF_INET, socket.AF_INET6), f"went online: {address}"
        return real_connect(sock, address)

    def no_download(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"tried to download {args[:1]}")

    monkeypatch.setattr(socket.socket, "connect", no_connect)
    monkeypatch.setattr("sacrebleu.dataset.base.download_file", no_download)
    return tmp_path / "sacrebleu"


@pytest.fixture
def sample(tmp_path: Path, offline: Path) -> Path:
    """300 training + 20 validation + 20 test pairs (the shipped demo corpus) as
    ``disk/`` (save_to_disk) and ``parquet/de-en/SPLIT-00000-of-00001.parquet`` (the Hub's
    layout); newstest-like sacreBLEU cache files: wmt13 (14 pairs) and wmt14/full (12 pairs)."""
    import datasets

    pairs = read_parallel(demo_corpus_path())[:366]
    parts = {"train": pairs[:300], "validation": pairs[300:320], "test": pairs[320:340]}
    parquet = tmp_path / "parquet" / "de-en"
    parquet.mkdir(parents=True)
    splits = {}
    for split, part in parts.items():
        splits[split] = datasets.Dataset.from_list(
            [{"translation": {"de": de, "en": en}} for en, de in part]
        )
        splits[split].to_parquet(str(parquet / f"{split}-00000-of-00001.parquet"))
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "disk"))
    for name, part in (("wmt13", pairs[340:354]), ("wmt14/full", pairs[354:366])):
        folder, stem = offline / name, name.replace("/", "_")
        folder.mkdir(parents=True)
        for field, side in (("src", 0), ("ref", 1)):
            lines = "".join(p[side] + "\n" for p in part)
            (folder / f"{stem}.en-de.{field}").write_text(lines, encoding="utf-8")
    return tmp_path


def train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> tuple[Path, str]:
    """``aiayn train --config configs/base.yaml`` shrunk; (run folder, the trainer's log)."""
    lines: list[str] = []
    monkeypatch.setattr("aiayn.training.trainer.log", lines.append)  # the tests' conftest mutes it
    run_dir = tmp_path / "run"
    sets = [*SHRINK, f"run_dir={run_dir}", *overrides]
    code = main(["train", "--config", BASE, *(a for s in sets for a in ("--set", s))])
    assert code == 0
    return run_dir, "\n".join(lines)


def test_base_config_trains_from_a_save_to_disk_folder(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = (f"data.hf_dataset={sample / 'disk'}", "data.hf_config=null")
    run_dir, out = train(sample, monkeypatch, *disk)
    assert f"data: {sample / 'disk'} [train], en -> de" in out
    assert "train kept 300 of 300 pairs" in out
    assert "valid kept 14 of 14 pairs" in out  # sacrebleu:wmt13 from the cache
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [m["step"] for m in metrics if m["kind"] == "train"][-1] == 3
    hyps = (run_dir / "test.hyp.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 12  # sacrebleu:wmt14/full, translated and scored
    assert "test: BLEU = " in out and "test: chrF" in out


def test_base_config_trains_from_parquet_files(
    sample: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """base.yaml's hf_config de-en is the parquet folder's subfolder; valid from a split."""
    overrides = (f"data.hf_dataset={sample / 'parquet'}", "data.valid=split:validation")
    run_dir, out = train(sample, monkeypatch, *overrides)
    assert f"data: {sample / 'parquet'} (de-en) [train], en -> de" in out
    assert "valid kept 20 of 20 pairs" in out
    assert len((run_dir / "test.hyp.txt").read_text(encoding="utf-8").splitlines()) == 12


def test_missing_pieces_are_one_line_errors(
    sample: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    disk = [f"data.hf_dataset={sample / 'disk'}", "data.hf_config=null"]
    cases = [
        ([*disk, "data.test=sacrebleu:wmt14"], "sacreBLEU test set wmt14 (en-de) is not in the"),
        ([f"data.hf_dataset={sample / 'nowhere'}"], "dataset folder not found"),
    ]
    for overrides, needle in cases:
        sets = [*SHRINK, f"run_dir={sample / 'err'}", *overrides]
        assert main(["train", "--config", BASE, *(a for s in sets for a in ("--set", s))]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and err.count("\n") == 1, err
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the extra were not installed
    sets = [*SHRINK, f"run_dir={sample / 'err2'}", *disk]
    assert main(["train", "--config", BASE, *(a for s in sets for a in ("--set", s))]) == 2
    assert "pip install 'aiayn[wmt]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.train_src=a.en"], "data.hf_dataset and data.train_src exclude each other"),
        (["data.valid_src=v.en"], "data.valid and data.valid_src exclude each other"),
        (["data.src_lang=null"], "data.hf_dataset needs data.src_lang and data.tgt_lang"),
        (["data.tgt_lang=en"], "data.src_lang and data.tgt_lang are both 'en'"),
        (["data.test=newstest2014"], r"data.test='newstest2014': expected sacrebleu:TEST_SET"),
        (["data.test=sacrebleu:wmt99"], "sacreBLEU has no test set 'wmt99'"),
        (["data.tgt_lang=ja"], "sacreBLEU's wmt13 has no language pair en-ja"),
        (["data.valid=split:train"], "data.valid='split:train' is the training split"),
        (["data.hf_dataset=null"], "data.hf_config is set but data.hf_dataset is not"),
        (["data.hf_split=' train'"], "data.hf_split must be a name without surrounding spaces"),
        (["data.hf_datset=x"], "unknown data config key.*hf_datset"),
        (["data.hf_config=3"], "data.hf_config has the wrong type"),
    ],
)
def test_data_section_rules(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run_config(BASE, overrides)


def test_shipped_wmt14_configs_name_the_paper_data() -> None:
    for name in ("base", "big"):
        data = load_run_config(ROOT / "configs" / f"{name}.yaml").data
        assert isinstance(data, DataConfig)
        assert (data.hf_dataset, data.hf_config, data.hf_split) == ("wmt/wmt14", "de-en", "train")
        assert (data.src_lang, data.tgt_lang) == ("en", "de")
        assert (data.valid, data.test) == ("sacrebleu:wmt13", "sacrebleu:wmt14/full")
