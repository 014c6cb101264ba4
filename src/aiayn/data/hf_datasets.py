"""Parallel corpora in Hugging Face ``datasets`` form and sacreBLEU's test sets: the way to the
paper's data, WMT 2014 English–German (§5.1: about 4.5 million sentence pairs; newstest2013 for
development, newstest2014 for the test of Table 2). See docs/wmt14.md.

A Hugging Face corpus (:class:`HFCorpus`) is one of three things (:func:`locate`):

- a dataset on the Hub, e.g. ``wmt/wmt14`` with config ``de-en``: read by
  ``datasets.load_dataset``, which downloads it once into the Hugging Face cache and reads it from
  there afterwards (offline too, with ``HF_DATASETS_OFFLINE=1``);
- a local folder written by ``save_to_disk`` (a ``DatasetDict`` with one subfolder per split, or
  one ``Dataset``): memory-mapped by ``datasets.load_from_disk``;
- a local folder of parquet files named by split as on the Hub (``train-00000-of-00003.parquet``,
  ``validation-….parquet``, ``test-….parquet``, or one subfolder per split): streamed from the
  files, nothing copied.

For a local folder, the config names a subfolder (the Hub's layout: ``de-en/train-….parquet``).
Rows hold either a ``translation`` column of ``{language: text}`` (the WMT sets) or one text
column per language. Pairs are read in Arrow batches of :data:`BATCH_ROWS` rows: only the two
strings of each pair become Python objects, one batch at a time (:func:`hf_pairs` is a
generator, so :func:`aiayn.data.filter_pairs` keeps the cleaned pairs and nothing else).

A sacreBLEU test set (``sacrebleu:wmt14/full``) is read from sacreBLEU's cache folder
(``$SACREBLEU``, default ``~/.sacrebleu``) when ``sacrebleu -t NAME -l SRC-TGT`` has fetched it
before; otherwise sacreBLEU downloads it, unless ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is
set, which this module takes to mean "no downloads" for sacreBLEU as well.

``datasets`` is an optional dependency (``pip install 'aiayn[wmt]'``); sacreBLEU is a core one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from aiayn.data.corpus import read_parallel
from aiayn.errors import ConfigError, UserError

__all__ = [
    "BATCH_ROWS",
    "EVAL_SOURCE_KINDS",
    "EvalSource",
    "HFCorpus",
    "check_eval_source",
    "downloads_off",
    "hf_pairs",
    "locate",
    "parse_eval_source",
    "read_eval_source",
    "require_datasets",
    "sacrebleu_files",
]

DATASETS_EXTRA = "pip install 'aiayn[wmt]'"
"""What installs the optional ``datasets`` dependency."""

BATCH_ROWS = 10_000
"""Rows converted from Arrow to Python strings at a time."""

EVAL_SOURCE_KINDS = ("sacrebleu", "split")
"""``sacrebleu:NAME`` (a sacreBLEU test set) and ``split:NAME`` (a split of the HF corpus)."""

_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = ("1", "true", "yes", "on")


def require_datasets() -> ModuleType:
    """The ``datasets`` module, or a one-line :class:`UserError` saying how to install it."""
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"reading a Hugging Face dataset needs the `datasets` package: {DATASETS_EXTRA}"
        ) from None
    return datasets


def downloads_off() -> bool:
    """Whether ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set to 1/true/yes/on."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in _OFFLINE_VARIABLES)


@dataclass(frozen=True)
class HFCorpus:
    """A parallel corpus in Hugging Face ``datasets`` form and the two languages taken from it.

    Attributes:
        dataset: a Hub name (``wmt/wmt14``) or a local folder (``save_to_disk`` or parquet).
        config: the Hub config (``de-en``); for a local folder, a subfolder; None = none.
        src_lang, tgt_lang: the language codes of the source and target side (``en``, ``de``).
    """

    dataset: str
    config: str | None
    src_lang: str
    tgt_lang: str


def locate(corpus: HFCorpus) -> tuple[str, str]:
    """``(kind, where)``: kind ``disk`` (a ``save_to_disk`` folder), ``parquet`` (a folder of
    parquet files) or ``hub`` (a Hub name, when no such local path exists).

    Raises:
        UserError: a path that looks local (``/``, ``.``, ``~``) does not exist; the path is a
            file; a local folder has no subfolder named by the config.
    """
    path = Path(corpus.dataset).expanduser()
    if not path.exists():
        if corpus.dataset.startswith(("/", ".", "~")):
            raise UserError(f"Hugging Face dataset folder not found: {path}")
        return "hub", corpus.dataset
    if not path.is_dir():
        raise UserError(
            f"Hugging Face dataset {corpus.dataset!r} is a file; give the folder that holds "
            "the save_to_disk output or the parquet files"
        )
    if corpus.config is not None:
        path = path / corpus.config
        if not path.is_dir():
            raise UserError(
                f"no subfolder {corpus.config!r} in the dataset folder {corpus.dataset} (a local "
                "folder takes data.hf_config as a subfolder; set it to null to read the folder "
                "itself)"
            )
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return "disk", str(path)
    return "parquet", str(path)


def hf_pairs(corpus: HFCorpus, split: str) -> Iterator[tuple[str, str]]:
    """The ``(source, target)`` pairs of one split, in order, read :data:`BATCH_ROWS` rows at a
    time (a missing text is ``""``, which :func:`aiayn.data.filter_pairs` drops as empty).

    Raises:
        UserError: ``datasets`` is not installed; the dataset or split cannot be found or loaded;
            its rows hold neither a ``translation`` column with both languages nor a column per
            language.
    """
    data = _load_split(corpus, split)
    where = f"{corpus.dataset}" + (f" ({corpus.config})" if corpus.config else "") + f" [{split}]"
    for table in data.with_format("arrow").iter(batch_size=BATCH_ROWS):
        sources, targets = _pair_columns(table, corpus.src_lang, corpus.tgt_lang, where)
        yield from zip(sources, targets, strict=True)


def _load_split(corpus: HFCorpus, split: str) -> Any:
    """A ``datasets.Dataset`` (Hub, save_to_disk) or ``IterableDataset`` (parquet) of the split."""
    datasets = require_datasets()
    kind, where = locate(corpus)
    try:
        if kind == "disk":
            return _disk_split(datasets.load_from_disk(where), split, where)
        if kind == "parquet":
            return datasets.load_dataset("parquet", data_dir=where, split=split, streaming=True)
        return datasets.load_dataset(where, corpus.config, split=split)
    except UserError:
        raise
    except (OSError, ValueError) as error:  # not found, offline, bad config or split name
        detail = " ".join(str(error).split())
        what = {"disk": "save_to_disk folder", "parquet": "parquet folder", "hub": "Hub dataset"}
        raise UserError(
            f"cannot read split {split!r} of the {what[kind]} {where!r}"
            + (f" (config {corpus.config})" if kind == "hub" and corpus.config else "")
            + f": {detail}"
        ) from None


def _disk_split(loaded: Any, split: str, where: str) -> Any:
    """The split of a ``load_from_disk`` result: a DatasetDict's entry, or a single Dataset when
    it is that split (a Dataset saved with no split name counts as ``train``)."""
    if hasattr(loaded, "keys"):  # a DatasetDict
        if split not in loaded:
            raise UserError(
                f"the save_to_disk folder {where} has no split {split!r} "
                f"(it has: {', '.join(sorted(loaded.keys()))})"
            )
        return loaded[split]
    own = str(loaded.split) if loaded.split is not None else "train"
    if own != split:
        raise UserError(
            f"the save_to_disk folder {where} holds one split, {own!r}; there is no {split!r}"
        )
    return loaded


def _pair_columns(
    table: Any, src_lang: str, tgt_lang: str, where: str
) -> tuple[list[str], list[str]]:
    """Source and target texts of an Arrow table: ``translation.{lang}`` or ``{lang}``."""
    names = table.column_names
    if "translation" in names:
        flat = table.select(["translation"]).flatten()  # struct -> translation.en, translation.de
        keys = [f"translation.{src_lang}", f"translation.{tgt_lang}"]
    else:
        flat, keys = table, [src_lang, tgt_lang]
    missing = [k for k in keys if k not in flat.column_names]
    if missing:
        raise UserError(
            f"{where}: no {' or '.join(repr(k) for k in missing)} text (columns: "
            f"{', '.join(flat.column_names)}); check data.src_lang and data.tgt_lang"
        )
    src, tgt = (["" if s is None else s for s in flat.column(k).to_pylist()] for k in keys)
    return src, tgt


@dataclass(frozen=True)
class EvalSource:
    """Where validation or test pairs come from: ``kind`` ``sacrebleu`` (``name`` a sacreBLEU
    test set, e.g. ``wmt14/full``) or ``split`` (``name`` a split of the HF corpus)."""

    kind: str
    name: str


def parse_eval_source(spec: str, key: str = "source") -> EvalSource:
    """``"sacrebleu:wmt13"`` -> ``EvalSource("sacrebleu", "wmt13")``; a bad form is a
    :class:`ConfigError` naming ``key`` and the value."""
    kind, sep, name = spec.partition(":")
    if not sep or kind not in EVAL_SOURCE_KINDS or not name.strip() or name != name.strip():
        raise ConfigError(
            f"{key}={spec!r}: expected sacrebleu:TEST_SET (e.g. sacrebleu:wmt14/full) or "
            "split:NAME (a split of data.hf_dataset, e.g. split:validation)"
        )
    return EvalSource(kind, name)


def check_eval_source(
    spec: str, key: str, src_lang: str, tgt_lang: str, *, train_split: str | None
) -> None:
    """Refuse a validation/test source that cannot be read: a bad form, a sacreBLEU test set
    unknown to sacreBLEU or without the language pair, a ``split:`` with no HF corpus
    (``train_split`` None) or naming the training split. Nothing is downloaded."""
    source = parse_eval_source(spec, key)
    if source.kind == "split":
        if train_split is None:
            raise ConfigError(f"{key}={spec!r} names a split of data.hf_dataset, which is not set")
        if source.name == train_split:
            raise ConfigError(f"{key}={spec!r} is the training split (data.hf_split)")
        return
    from sacrebleu.dataset import DATASETS

    if source.name not in DATASETS:
        raise ConfigError(
            f"{key}={spec!r}: sacreBLEU has no test set {source.name!r} "
            "(e.g. wmt13, wmt14, wmt14/full; `sacrebleu --list` lists them)"
        )
    pair, pairs = f"{src_lang}-{tgt_lang}", DATASETS[source.name].langpairs
    if pair not in pairs:
        raise ConfigError(
            f"{key}={spec!r}: sacreBLEU's {source.name} has no language pair {pair} "
            f"(it has: {', '.join(sorted(pairs))})"
        )


def sacrebleu_cache() -> Path:
    """sacreBLEU's cache folder: ``$SACREBLEU``, default ``~/.sacrebleu``."""
    return Path(os.environ.get("SACREBLEU", Path.home() / ".sacrebleu"))


def sacrebleu_files(name: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """The source and (first) reference file of a sacreBLEU test set, plain text one segment a
    line: from the cache when there, else downloaded by sacreBLEU (unless :func:`downloads_off`).

    Raises:
        ConfigError: sacreBLEU does not know the test set or its language pair.
        UserError: it is not cached and downloads are off, or the download failed.
    """
    check_eval_source(f"sacrebleu:{name}", "test set", src_lang, tgt_lang, train_split=None)
    from sacrebleu.dataset import DATASETS

    pair, dataset = f"{src_lang}-{tgt_lang}", DATASETS[name]
    fields = dataset.fieldnames(pair)
    ref = next(f for f in fields if f.startswith("ref"))
    folder, stem = sacrebleu_cache() / name, name.replace("/", "_")
    cached = [folder / f"{stem}.{pair}.{f.replace(':', '-')}" for f in ("src", ref)]
    if all(p.is_file() for p in cached):
        return cached[0], cached[1]
    fetch = f"`sacrebleu -t {name} -l {pair} --echo src > /dev/null` fetches it"
    if downloads_off():
        raise UserError(
            f"sacreBLEU test set {name} ({pair}) is not in the cache {folder} and downloads are "
            f"off ({' / '.join(_OFFLINE_VARIABLES)}); on a machine with a network, {fetch}"
        )
    try:
        files = dict(zip(fields, dataset.get_files(pair), strict=True))
    except (OSError, SystemExit) as error:  # sacreBLEU exits on a bad checksum or SSL error
        raise UserError(
            f"could not download sacreBLEU test set {name} ({pair}): {error or 'see its log'}; "
            f"{fetch} where there is a network"
        ) from None
    return Path(files["src"]), Path(files[ref])


def read_eval_source(
    spec: str, corpus: HFCorpus | None, src_lang: str, tgt_lang: str
) -> list[tuple[str, str]]:
    """The pairs of a validation/test source (:func:`parse_eval_source`'s form), unnormalised:
    a sacreBLEU test set, or a split of ``corpus``."""
    source = parse_eval_source(spec)
    if source.kind == "split":
        if corpus is None:
            raise ConfigError(f"{spec!r} names a split of data.hf_dataset, which is not set")
        return list(hf_pairs(corpus, source.name))
    src_file, ref_file = sacrebleu_files(source.name, src_lang, tgt_lang)
    return read_parallel(src_file, ref_file)
