"""Run configuration for ``aiayn train``: model, data and training sections, from YAML.

A YAML file has the three sections plus ``run_dir``::

    run_dir: runs/multi30k_small
    model: {preset: small, dropout: 0.1}       # a preset (§Table 3 or CPU-sized) + overrides
    data:  {train_src: train.en.gz, train_tgt: train.de.gz, vocab_size: 8000}
    train: {max_tokens: 4096, warmup_steps: 4000, lr_scale: 2.0}

``--set train.max_steps=100`` overrides one key (the value is parsed as YAML). Unknown keys and
wrong types are errors naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aiayn.config import TransformerConfig, check_field_types, preset
from aiayn.errors import ConfigError


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
    """

    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    test_src: str | None = None
    test_tgt: str | None = None
    valid_size: int = 500
    bleu_sentences: int = 500
    vocab_size: int = 8000
    min_frequency: int = 2
    max_words: int = 100
    max_ratio: float = 9.0
    max_tokens_per_sentence: int = 200
    lowercase: bool = False

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.train_tgt is not None and self.train_src is None:
            raise ConfigError("data.train_tgt is set but data.train_src is not")
        for name in ("valid_size", "vocab_size", "min_frequency", "max_words"):
            if getattr(self, name) < 1:
                raise ConfigError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_ratio < 1:
            raise ConfigError(f"data.max_ratio must be >= 1, got {self.max_ratio}")


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
        average_last: at the end, average the last N checkpoints into ``averaged`` (§6.1).
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
            memory). See :func:`aiayn.training.performance.keep_freed_memory`.
    """

    max_tokens: int = 4096
    accum_steps: int = 1
    max_steps: int = 100_000
    max_epochs: int | None = None
    max_minutes: float | None = None
    warmup_steps: int = 4000
    lr_scale: float = 1.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float | None = None
    seed: int = 1
    log_every: int = 100
    eval_every: int = 1000
    save_every: int = 1000
    keep_last: int = 5
    average_last: int = 0
    device: str = "auto"
    precision: str = "auto"
    threads: int | None = None
    progress: bool = True
    distributed: str = "ddp"
    compile: bool = False
    keep_freed_memory: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.adam_betas, list):
            object.__setattr__(self, "adam_betas", tuple(self.adam_betas))
        check_field_types(self)
        for name in (
            "max_tokens",
            "accum_steps",
            "max_steps",
            "warmup_steps",
            "log_every",
            "keep_last",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "save_every", "average_last"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ConfigError(
                f"train.precision must be auto/fp32/bf16/fp16, got {self.precision!r}"
            )
        if self.lr_scale <= 0:
            raise ConfigError(f"train.lr_scale must be positive, got {self.lr_scale}")
        if self.distributed not in ("ddp", "fsdp"):
            raise ConfigError(f"train.distributed must be ddp or fsdp, got {self.distributed!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything ``aiayn train`` needs; ``model_preset`` + ``model`` fields give the model."""

    run_dir: str = "runs/demo"
    model_preset: str = "small"
    model: TransformerConfig = field(default_factory=lambda: preset("small"))
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        """A YAML/JSON-friendly dict that :func:`run_config_from_dict` reads back."""
        return {
            "run_dir": self.run_dir,
            "model": {"preset": self.model_preset, **_diff(self.model, preset(self.model_preset))},
            "data": dataclasses.asdict(self.data),
            "train": {**dataclasses.asdict(self.train), "adam_betas": list(self.train.adam_betas)},
        }


def _diff(config: TransformerConfig, base: TransformerConfig) -> dict[str, Any]:
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
    model_values = dict(values.get("model") or {})
    model_preset = model_values.pop("preset", "small")
    try:
        model = preset(model_preset, **model_values)
    except TypeError as error:  # pragma: no cover - from_dict rejects unknown keys first
        raise ConfigError(str(error)) from error
    return RunConfig(
        run_dir=str(values.get("run_dir", "runs/demo")),
        model_preset=model_preset,
        model=model,
        data=_section(DataConfig, values.get("data"), "data"),
        train=_section(TrainConfig, values.get("train"), "train"),
    )


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


def apply_overrides(values: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (value parsed as YAML) to nested config values."""
    result = {k: dict(v) if isinstance(v, Mapping) else v for k, v in values.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        dotted, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw.strip() else None
        parts = dotted.strip().split(".")
        if len(parts) == 1 and parts[0] == "run_dir":
            result["run_dir"] = value
        elif len(parts) == 2:
            result.setdefault(parts[0], {})[parts[1]] = value
        else:
            raise ConfigError(f"--set key must be run_dir or section.key, got {dotted!r}")
    return result


def load_run_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config (None = the built-in demo) and apply ``--set`` overrides."""
    values: dict[str, Any] = dict(DEMO_CONFIG)
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise ConfigError(f"{file}: not valid YAML: {error}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{file}: expected a mapping with model/data/train sections")
        values = loaded
    return run_config_from_dict(apply_overrides(values, overrides))


# The built-in demo: a small pre-norm model on the shipped Tatoeba EN→DE subset, about 8 minutes
# on a 2-core CPU. Pre-norm because it tolerates the high peak learning rate a few hundred steps
# need (post-norm at the same rate reached perplexity 92 where pre-norm reached 32). Keep
# configs/demo.yaml identical (a test checks).
DEMO_CONFIG: dict[str, Any] = {
    "run_dir": "runs/demo",
    "model": {
        "preset": "small",
        "d_model": 256,
        "d_ff": 1024,
        "num_heads": 4,
        "num_encoder_layers": 3,
        "num_decoder_layers": 3,
        "dropout": 0.1,
        "norm_first": True,
    },
    "data": {"vocab_size": 4000, "valid_size": 500, "bleu_sentences": 200},
    "train": {
        "max_tokens": 1500,
        "warmup_steps": 400,
        "lr_scale": 1.0,
        "max_minutes": 7.0,
        "eval_every": 500,
        "save_every": 250,
        "log_every": 50,
        "keep_last": 3,
        "average_last": 3,
    },
}
