"""Run configuration for ``aiayn train``: model, data and training sections, from YAML.

A YAML file has the three sections plus ``run_dir``::

    run_dir: runs/multi30k_small
    model: {preset: small, dropout: 0.1}       # a preset (§Table 3 or CPU-sized) + overrides
    data:  {train_src: train.en.gz, train_tgt: train.de.gz, vocab_size: 8000}
    train: {max_tokens: 4096, warmup_steps: 4000, lr_scale: 2.0}

``model.family`` picks the model family and with it the task: ``transformer`` (the default: the
paper's encoder–decoder, translation, :class:`DataConfig`), ``gpt2`` (a decoder-only language
model, :class:`LMDataConfig`), ``vit`` (a Vision Transformer classifying images,
:class:`ImageDataConfig`) or ``bert`` (BERT: masked-LM pre-training or text classification,
:class:`BertDataConfig`; ``data.task`` says which)::

    model: {family: gpt2, preset: gpt2-tiny, d_model: 128}
    data:  {train_text: book.txt, block_size: 128, vocab_size: 8000}

    model: {family: vit, preset: vit-tiny-digits}
    data:  {dataset: digits, valid_size: 180, test_size: 180, shift: 1}

    model: {family: bert, init_from: checkpoints/bert-base-uncased}
    data:  {task: classification, train: train.tsv, valid: valid.tsv}

``--set train.max_steps=100`` overrides one key (the value is parsed as YAML). Unknown keys, keys
of the other family's data section and wrong types are errors naming the key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Protocol, runtime_checkable

import yaml

from aiayn.config import ModelConfig, preset
from aiayn.data.tokenizer import MIN_VOCAB_SIZE
from aiayn.errors import ConfigError, UserError
from aiayn.models.families import (
    DEFAULT_FAMILY,
    Family,
    demo_runs,
    family_of_config,
    resolve,
    trainable,
)
from aiayn.validation import (
    Bounds,
    Choice,
    Device,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Rate,
    Seed,
    validate,
    validated,
)

VocabSize = Annotated[int, Bounds(ge=MIN_VOCAB_SIZE)]
"""A BPE vocabulary to learn: at least the 4 specials and the 256 bytes."""


@validated("data")
@dataclass(frozen=True)
class DataConfig:
    """Where the parallel corpus comes from and how it is tokenised (§5.1).

    Attributes:
        train_src, train_tgt: line-aligned files (plain or .gz); ``train_src`` alone = a TSV
            file "source<TAB>target". None for both = the built-in Tatoeba EN→DE demo corpus.
        valid_src, valid_tgt: validation files (same forms); None = hold out ``valid_size``
            pairs from the training data.
        test_src, test_tgt: optional test set, translated and scored at the end of training.
        valid_size: pairs held out when no validation files are given.
        bleu_sentences: validation sentences decoded for BLEU at each evaluation (0 = all).
        vocab_size: size of the joint BPE vocabulary to learn.
        min_frequency: BPE merges need at least this many occurrences.
        max_words: drop pairs with more words than this on either side.
        max_ratio: drop pairs whose word-length ratio exceeds this.
        max_tokens_per_sentence: drop pairs with more subword tokens than this on either side.
        lowercase: lowercase both sides before anything else (off: cased BLEU, as reported).
        hf_dataset: instead of ``train_src``: a Hugging Face ``datasets`` corpus: a Hub name
            (``wmt/wmt14``), a ``save_to_disk`` folder or a folder of parquet files (see
            :mod:`aiayn.data.hf_datasets` and docs/wmt14.md; needs ``pip install 'aiayn[wmt]'``).
        hf_config: the Hub config (``de-en``); for a local folder, a subfolder of it.
        hf_split: the split of ``hf_dataset`` trained on.
        src_lang, tgt_lang: the language codes of source and target (``en``, ``de``): the
            direction, taken from ``hf_dataset``'s rows and sacreBLEU test sets.
        valid, test: instead of the ``*_src``/``*_tgt`` files: ``sacrebleu:NAME`` (a sacreBLEU
            test set, e.g. ``sacrebleu:wmt13``, ``sacrebleu:wmt14/full``) or ``split:NAME`` (a
            split of ``hf_dataset``, e.g. ``split:validation``).
    """

    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    test_src: str | None = None
    test_tgt: str | None = None
    valid_size: PositiveInt = 500
    bleu_sentences: NonNegativeInt = 500
    vocab_size: VocabSize = 8000
    min_frequency: PositiveInt = 2
    max_words: PositiveInt = 100
    max_ratio: Annotated[float, Bounds(ge=1)] = 9.0
    max_tokens_per_sentence: PositiveInt = 200
    lowercase: bool = False
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_split: str = "train"
    src_lang: str | None = None
    tgt_lang: str | None = None
    valid: str | None = None
    test: str | None = None

    @property
    def task_name(self) -> str:
        """The training task this section feeds (the family registry's key)."""
        return "translation"

    def __post_init__(self) -> None:
        validate(self)
        if self.train_tgt is not None and self.train_src is None:
            raise ConfigError("data.train_tgt is set but data.train_src is not")
        _check_corpus_sources(self)


def _check_corpus_sources(d: DataConfig) -> None:
    """Each split comes from one place; a Hugging Face corpus or a sacreBLEU test set has the
    languages it needs; ``valid``/``test`` name a readable source (nothing is downloaded)."""
    from aiayn.data.hf_datasets import check_eval_source

    for new, old in (("hf_dataset", "train_src"), ("valid", "valid_src"), ("test", "test_src")):
        if getattr(d, new) is not None and getattr(d, old) is not None:
            raise ConfigError(f"data.{new} and data.{old} exclude each other: set one of them")
    if d.hf_config is not None and d.hf_dataset is None:
        raise ConfigError("data.hf_config is set but data.hf_dataset is not")
    for name in ("hf_dataset", "hf_config", "hf_split", "src_lang", "tgt_lang"):
        value = getattr(d, name)
        if value is not None and (not value.strip() or value != value.strip()):
            raise ConfigError(
                f"data.{name} must be a name without surrounding spaces, got {value!r}"
            )
    users = [k for k in ("hf_dataset", "valid", "test") if getattr(d, k) is not None]
    if users and (d.src_lang is None or d.tgt_lang is None):
        raise ConfigError(f"data.{users[0]} needs data.src_lang and data.tgt_lang (e.g. en and de)")
    if d.src_lang is not None and d.src_lang == d.tgt_lang:
        raise ConfigError(f"data.src_lang and data.tgt_lang are both {d.src_lang!r}")
    train_split = d.hf_split if d.hf_dataset is not None else None
    for key in ("valid", "test"):
        spec = getattr(d, key)
        if spec is not None:
            assert d.src_lang is not None and d.tgt_lang is not None
            check_eval_source(spec, f"data.{key}", d.src_lang, d.tgt_lang, train_split=train_split)


DEMO_SIDES = ("en", "de", "both")


@validated("data")
@dataclass(frozen=True)
class LMDataConfig:
    """The text a language model (family ``gpt2``) learns from, and how it is cut into blocks
    (see :mod:`aiayn.data.lm`: one document per line, EOS after each, blocks of
    ``block_size`` targets).

    Attributes:
        train_text: a UTF-8 text file (plain or .gz), one document per line (blank lines
            skipped). None = the built-in Tatoeba demo corpus, the side(s) ``demo_side`` names
            (each sentence once: the file repeats a sentence for each of its translations).
        valid_text: validation text (same form); None = hold out ``valid_lines`` lines of the
            training text, chosen at random with the seed.
        test_text: optional test text, its perplexity reported at the end of training.
        valid_lines: lines held out when no validation file is given.
        block_size: L, the input positions of a training block (at most ``model.max_len``).
        vocab_size: size of the byte-level BPE vocabulary learnt from the training text (not
            used with ``model.init_from``, which brings its checkpoint's tokenizer).
        min_frequency: BPE merges need at least this many occurrences.
        demo_side: of the demo corpus: "en", "de" or "both".
    """

    train_text: str | None = None
    valid_text: str | None = None
    test_text: str | None = None
    valid_lines: PositiveInt = 500
    block_size: PositiveInt = 128
    vocab_size: VocabSize = 8000
    min_frequency: PositiveInt = 2
    demo_side: Annotated[str, Choice(DEMO_SIDES)] = "en"

    @property
    def task_name(self) -> str:
        """The training task this section feeds (the family registry's key)."""
        return "language-model"

    def __post_init__(self) -> None:
        validate(self)


IMAGE_DATASETS = ("digits",)
"""The image data sets family ``vit`` trains on."""


@validated("data")
@dataclass(frozen=True)
class ImageDataConfig:
    """The images an image classifier (family ``vit``) learns from (see
    :mod:`aiayn.data.digits`): one target per image, so ``train.max_tokens`` is the number of
    images in a batch.

    Attributes:
        dataset: "digits": scikit-learn's 8×8 grayscale handwritten digits (1,797 images, ten
            classes 0–9, values 0–16; shipped with scikit-learn, no download). The model must
            match it: ``image_size`` 8, ``num_channels`` 1, ``num_labels`` 10.
        valid_size: images held out for validation (every class in its share).
        test_size: images held out for the test at the end of training (0 = none).
        split_seed: seeds the split; apart from ``train.seed``, so that runs with different
            training seeds share their validation and test images.
        shift: augmentation: each training image moves by a random whole number of pixels in
            [−shift, shift] along each axis (0 = none).
    """

    dataset: Annotated[str, Choice(IMAGE_DATASETS)] = "digits"
    valid_size: PositiveInt = 180
    test_size: NonNegativeInt = 180
    split_seed: Seed = 0
    shift: NonNegativeInt = 0

    @property
    def task_name(self) -> str:
        """The training task this section feeds (the family registry's key)."""
        return "image-classification"

    def __post_init__(self) -> None:
        validate(self)
        from aiayn.data.digits import DIGITS_COUNT, DIGITS_LABELS

        left = DIGITS_COUNT - self.valid_size - self.test_size
        if left < len(DIGITS_LABELS):
            raise ConfigError(
                f"data.valid_size={self.valid_size} and data.test_size={self.test_size} leave "
                f"{left} of the {DIGITS_COUNT} digits for training"
            )


BERT_TASKS: dict[str, dict[str, Any]] = {
    "masked-lm": {"head": "mlm", "pooler": False},
    "classification": {"head": "classification", "pooler": True},
}
"""What family ``bert`` trains (``data.task``) -> the model fields the task sets: masked-LM
pre-training trains the MLM head and no pooler (nothing would train it); classification
trains the classifier on the pooled state."""


@validated("data")
@dataclass(frozen=True)
class BertDataConfig:
    """The text BERT (family ``bert``) learns from, and which of its two tasks (see
    :mod:`aiayn.training.masked_lm` and :mod:`aiayn.training.text_classification`).

    Attributes:
        task: "masked-lm" (pre-training: ``train``/``valid``/``test`` are UTF-8 text files,
            one example per non-blank line) or "classification" (``label<TAB>text`` lines, or
            ``label<TAB>text<TAB>second text`` for pairs; the label set is the training
            file's, sorted). Required; it sets ``model.head`` (and ``model.pooler``).
        train, valid: the training and validation files (plain or .gz); required.
        test: an optional test file, scored at the end of training.
        max_length: the longest example in tokens, ``[CLS]`` and ``[SEP]`` included (longer
            ones are cut); None = the model's ``max_len``.
        vocab_size: size of the WordPiece vocabulary learnt from the training text (not used
            with ``model.init_from``, which brings its checkpoint's tokenizer).
        min_frequency: WordPiece merges need at least this many occurrences.
        lowercase: the learnt vocabulary lowercases and strips accents (BERT "uncased").
        mlm_probability: (masked-lm) the share of tokens that are prediction targets.
    """

    task: Annotated[str, Choice(tuple(BERT_TASKS))] | None = None
    train: str | None = None
    valid: str | None = None
    test: str | None = None
    max_length: Annotated[int, Bounds(ge=3)] | None = None
    vocab_size: PositiveInt = 8000
    min_frequency: PositiveInt = 2
    lowercase: bool = True
    mlm_probability: Annotated[float, Bounds(gt=0, lt=1)] = 0.15

    @property
    def task_name(self) -> str:
        """The training task this section feeds (the family registry's key): ``task``."""
        assert self.task is not None  # required, checked at construction
        return self.task

    def __post_init__(self) -> None:
        validate(self)
        if self.task is None:
            raise ConfigError(
                "data.task is required for family bert: masked-lm (pre-training on text lines) "
                "or classification (label<TAB>text lines)"
            )
        for name in ("train", "valid"):
            if getattr(self, name) is None:
                raise ConfigError(f"data.{name} is required for family bert (a file)")
        if self.task != "masked-lm" and self.mlm_probability != 0.15:
            raise ConfigError("data.mlm_probability applies to data.task masked-lm only")


@validated("train")
@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping (§5.2–5.4).

    Attributes:
        max_tokens: token budget of one micro-batch, per side (§5.1: ≈25000 per step on 8 GPUs).
        accum_steps: micro-batches per optimizer step (effective batch = their sum).
        max_steps: stop after this many optimizer steps.
        max_epochs: stop after this many passes over the data (None = no limit).
        max_minutes: stop after this much wall-clock training time (None = no limit).
        warmup_steps: of eq. (3) (4000 in the paper).
        lr_scale: factor on eq. (3); 1 = the paper.
        adam_betas, adam_eps: §5.3: (0.9, 0.98) and 1e-9.
        weight_decay: decoupled weight decay (0 in the paper).
        clip_norm: clip the gradient's global norm to this (None = no clipping).
        seed: seeds the model's initialisation, dropout and the batch order.
        log_every: steps between training-metric lines.
        eval_every: steps between validations (loss and greedy BLEU); 0 = only at the end.
        save_every: steps between checkpoints; 0 = only at the end.
        keep_last: checkpoints kept (older ones are deleted; ``best`` is kept apart).
        average_last: at the end, average N checkpoints into ``averaged`` (§6.1; 0 or 1 = no
            averaging): N weights-only checkpoints written for it, evenly spaced over the last
            ``average_window`` of the run (:mod:`aiayn.training.averaging`).
        average_window: the fraction of the run's budget (``max_steps``, ``max_epochs`` or
            ``max_minutes``, whichever ends it) over whose end the averaged checkpoints are
            written; nothing from before it is averaged (the paper: 5 checkpoints 10 minutes
            apart at the end of 12 hours, about 7%).
        device: "auto" (CUDA if available), "cpu" or "cuda[:i]".
        precision: "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32", "bf16" or "fp16".
        threads: torch intra-op threads on CPU (None = torch's default).
        progress: show a progress bar.
        distributed: how several processes started by torchrun train together: "ddp"
            (DistributedDataParallel: every rank holds the whole model) or "fsdp" (FSDP2
            ``fully_shard``: parameters, gradients and optimizer state sharded over the ranks;
            for models that do not fit one GPU, e.g. the ``big`` preset). Ignored with one
            process. See docs/distributed.md.
        compile: run the training step through ``torch.compile`` (measured in
            docs/performance.md; compilation costs time at the start and needs a C++ compiler on
            CPU).
        keep_freed_memory: on CPU (Linux/glibc), let the allocator keep freed memory for the
            next step instead of returning it to the OS (faster; the process keeps its peak
            memory). See :func:`aiayn.performance.keep_freed_memory`.
        label_smoothing: ε_ls of the loss; None = the task's default: 0.1 for translation
            (§5.4), 0 (plain cross-entropy) for a language model and an image classifier. A
            training setting, so it is not part of the model config (nor of its checkpoints'
            config).
        max_bad_steps: stop the run (:class:`~aiayn.training.trainer.TrainingDiverged`) after
            this many steps in a row skipped for a non-finite loss or gradient norm (a skipped
            step changes no weight; see docs/reliability.md).
    """

    max_tokens: PositiveInt = 4096
    accum_steps: PositiveInt = 1
    max_steps: PositiveInt = 100_000
    max_epochs: PositiveInt | None = None
    max_minutes: PositiveFloat | None = None
    warmup_steps: PositiveInt = 4000
    lr_scale: Annotated[float, Bounds(gt=0, le=1e4)] = 1.0
    adam_betas: tuple[Rate, Rate] = (0.9, 0.98)
    adam_eps: Annotated[float, Bounds(ge=1e-30, le=1)] = 1e-9
    weight_decay: Annotated[float, Bounds(ge=0, le=1)] = 0.0
    clip_norm: PositiveFloat | None = None
    seed: Seed = 1
    log_every: PositiveInt = 100
    eval_every: NonNegativeInt = 1000
    save_every: NonNegativeInt = 1000
    keep_last: PositiveInt = 5
    average_last: NonNegativeInt = 0
    average_window: Annotated[float, Bounds(gt=0, le=1)] = 0.1
    device: Device = "auto"
    precision: Annotated[str, Choice(("auto", "fp32", "bf16", "fp16"))] = "auto"
    threads: Annotated[int, Bounds(ge=1, le=1024)] | None = None
    progress: bool = True
    distributed: Annotated[str, Choice(("ddp", "fsdp"))] = "ddp"
    compile: bool = False
    keep_freed_memory: bool = True
    label_smoothing: Rate | None = None
    max_bad_steps: PositiveInt = 5

    def __post_init__(self) -> None:
        validate(self)


@runtime_checkable
class DataSection(Protocol):
    """What every family's data section has: the training task it feeds."""

    @property
    def task_name(self) -> str: ...


@validated(None)
@dataclass(frozen=True)
class RunConfig:
    """Everything ``aiayn train`` needs; ``model_preset`` + ``model`` fields give the model.

    Attributes:
        run_dir: where checkpoints, metrics and plots go.
        model_preset: the preset the model section started from ("" with ``init_from``).
        model: the model's config; its class is the family (:attr:`family`).
        data: the family's data section (:class:`DataConfig`, :class:`LMDataConfig`,
            :class:`ImageDataConfig` or :class:`BertDataConfig`).
        train: optimisation and bookkeeping.
        init_from: (families gpt2 and bert) a checkpoint folder whose weights, architecture
            and tokenizer the run starts from (fine-tuning, e.g. a GPT-2 or a BERT converted by
            ``aiayn convert``; a BERT's heads that do not fit the task start fresh).
    """

    run_dir: str = "runs/demo"
    model_preset: str = "small"
    model: ModelConfig = field(default_factory=lambda: preset("small"))
    data: DataSection = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    init_from: str | None = None

    def __post_init__(self) -> None:
        validate(self)
        training = self.trainer_entry.training
        assert training is not None  # trainable() holds only families with training
        want = resolve(training.data)
        if not isinstance(self.data, want):
            raise ConfigError(f"a {self.family} model needs a {want.__name__} data section")
        if self.init_from is not None and not training.init_from:
            raise ConfigError(
                f"model.init_from is supported for families {' and '.join(_init_from_families())} "
                "only"
            )
        if training.check is not None:
            resolve(training.check)(self)

    @property
    def trainer_entry(self) -> Family:
        """The model's family (registry entry); a family ``aiayn train`` cannot train is a
        :class:`ConfigError` naming it."""
        family = family_of_config(self.model)
        if family.name not in trainable():
            raise ConfigError(
                f"family {family.name} cannot be trained (trainable: {', '.join(trainable())})"
            )
        return family

    @property
    def family(self) -> str:
        """The model family's name (the registry's, :mod:`aiayn.models.families`)."""
        return family_of_config(self.model).name

    def to_dict(self) -> dict[str, Any]:
        """A YAML/JSON-friendly dict that :func:`run_config_from_dict` reads back."""
        assert dataclasses.is_dataclass(self.data)
        return {
            "run_dir": self.run_dir,
            "model": self._model_dict(),
            "data": dataclasses.asdict(self.data),
            "train": {**dataclasses.asdict(self.train), "adam_betas": list(self.train.adam_betas)},
        }

    def _model_dict(self) -> dict[str, Any]:
        if self.init_from is not None:  # every field: the checkpoint's config may change
            return {"family": self.family, "init_from": self.init_from, **self.model.to_dict()}
        base = self.trainer_entry.presets.build(self.model_preset)
        head = {} if self.family == DEFAULT_FAMILY else {"family": self.family}
        return {**head, "preset": self.model_preset, **_diff(self.model, base)}


def _init_from_families() -> list[str]:
    """The families whose runs may start from a checkpoint (``model.init_from``)."""
    return [n for n, f in trainable().items() if f.training and f.training.init_from]


def _diff(config: ModelConfig, base: ModelConfig) -> dict[str, Any]:
    new, old = config.to_dict(), base.to_dict()
    return {k: v for k, v in new.items() if v != old[k]}


def run_config_from_dict(values: Mapping[str, Any]) -> RunConfig:
    """Build a :class:`RunConfig` from nested mappings; unknown keys are errors."""
    unknown = sorted(set(values) - {"run_dir", "model", "data", "train"})
    if unknown:
        raise ConfigError(
            f"unknown top-level config key(s): {', '.join(unknown)} "
            "(valid: run_dir, model, data, train)"
        )
    for name in ("model", "data", "train"):
        section = values.get(name)
        if section is not None and not isinstance(section, Mapping):
            raise ConfigError(
                f"config section {name!r} must be a mapping of keys to values, "
                f"got {type(section).__name__} {section!r}"
            )
    model_values = dict(values.get("model") or {})
    name = model_values.pop("family", DEFAULT_FAMILY)
    if not isinstance(name, str) or name not in trainable():
        raise ConfigError(f"unknown model.family {name!r} (trainable: {', '.join(trainable())})")
    family = trainable()[name]
    init_from = model_values.pop("init_from", None)
    model_preset, model = _model_section(family, model_values, init_from)
    data = _data_section(family, values.get("data"))
    assert family.training is not None
    if family.training.adapt is not None:
        model = resolve(family.training.adapt)(model, data, model_values)
    return RunConfig(
        run_dir=str(values.get("run_dir", "runs/demo")),
        model_preset=model_preset,
        model=model,
        data=data,
        train=_section(TrainConfig, values.get("train"), "train"),
        init_from=init_from,
    )


def _model_section(family: Family, values: dict[str, Any], init_from: Any) -> tuple[str, Any]:
    """(preset name, config) of the model section (``family`` and ``init_from`` popped)."""
    if "label_smoothing" in values:
        raise ConfigError(
            "model.label_smoothing is a training setting: set train.label_smoothing instead"
        )
    if init_from is None:
        name = values.pop("preset", family.default_preset)
        if not isinstance(name, str):
            raise ConfigError(f"model.preset must be a preset name, got {name!r}")
        try:
            return name, family.presets.build(name, **values)
        except TypeError as error:  # pragma: no cover - from_dict rejects unknown keys first
            raise ConfigError(str(error)) from error
    assert family.training is not None
    if not family.training.init_from or not isinstance(init_from, str):
        raise ConfigError(
            f"model.init_from must be a checkpoint folder of family "
            f"{' or '.join(_init_from_families())}, got {init_from!r} for family {family.name}"
        )
    if "preset" in values:
        raise ConfigError(
            "model.preset and model.init_from exclude each other: the checkpoint gives the model"
        )
    return "", checkpoint_model_config(init_from, family.name).replace(**values)


def checkpoint_model_config(path: str, family: str) -> ModelConfig:
    """The config of ``family`` recorded in a checkpoint folder (or a run folder's latest)."""
    from aiayn.checkpoint import read_checkpoint_config

    try:
        folder, found, config, _ = read_checkpoint_config(path)
    except UserError as error:
        raise ConfigError(f"model.init_from: {error}") from None
    if found.name != family:
        raise ConfigError(f"model.init_from: {folder} holds a {found.name} model, not {family}")
    return config


def _data_section(family: Family, values: Mapping[str, Any] | None) -> Any:
    """The family's data section; a key of another family's section is named as such."""
    assert family.training is not None
    cls = resolve(family.training.data)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values or {}) - known
    for other in trainable().values():
        assert other.training is not None
        other_cls = resolve(other.training.data)
        misplaced = sorted(unknown & {f.name for f in dataclasses.fields(other_cls)})
        if misplaced and other_cls is not cls:
            raise ConfigError(
                f"data.{misplaced[0]} is {_a(other.training.label)} key (family {other.name}); "
                f"{_a(family.training.label)} run (family {family.name}) takes data keys "
                f"{', '.join(sorted(known))}"
            )
    return _section(cls, values, "data")


def _a(noun: str) -> str:
    """``noun`` after its indefinite article."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _section(cls: type[Any], values: Mapping[str, Any] | None, name: str) -> Any:
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown {name} config key(s): {', '.join(unknown)} "
            f"(valid keys: {', '.join(sorted(known))})"
        )
    try:
        return cls(**values)
    except ConfigError as error:
        message = str(error)
        if not message.startswith(f"{name}."):
            message = f"{name}.{message}"
        raise ConfigError(message) from None


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, which also reads a float without a dot (``1e-4``, YAML 1.2) as a
    number: PyYAML's YAML 1.1 makes it a string, which the float fields would refuse."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def apply_overrides(values: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (value parsed as YAML) to nested config values."""
    result = {k: dict(v) if isinstance(v, Mapping) else v for k, v in values.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        dotted, raw = item.split("=", 1)
        try:
            value = yaml.load(raw, _YamlLoader) if raw.strip() else None
        except yaml.YAMLError:
            raise ConfigError(f"--set {dotted.strip()}: {raw!r} is not a YAML value") from None
        parts = dotted.strip().split(".")
        if len(parts) == 1 and parts[0] == "run_dir":
            result["run_dir"] = value
        elif len(parts) == 2:
            result.setdefault(parts[0], {})[parts[1]] = value
        else:
            raise ConfigError(f"--set key must be run_dir or section.key, got {dotted!r}")
    return result


def yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: "line L, column C: problem" (1-based, as editors
    count), or the message's first line when it carries no position."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None or problem is None:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    context = getattr(error, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return f"{where}: {problem}" + (f" ({context})" if context else "")


def load_run_config(
    path: str | Path | None, overrides: Sequence[str] = (), *, demo: str | None = None
) -> RunConfig:
    """Read a YAML run config (None = the built-in ``demo`` run, one of the family registry's
    :func:`~aiayn.models.families.demo_runs`) and apply ``--set`` overrides."""
    demos = demo_runs()
    demo = next(iter(demos)) if demo is None else demo
    if demo not in demos:
        raise ConfigError(f"unknown demo {demo!r} (choose from {', '.join(demos)})")
    values: dict[str, Any] = dict(resolve(demos[demo]))
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
        try:
            loaded = yaml.load(file.read_text(encoding="utf-8"), _YamlLoader)
        except yaml.YAMLError as error:
            raise ConfigError(f"{file}: not valid YAML: {yaml_problem(error)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{file}: expected a mapping with model/data/train sections")
        values = loaded
    return run_config_from_dict(apply_overrides(values, overrides))
