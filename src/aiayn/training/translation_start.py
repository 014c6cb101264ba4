"""How a translation run starts: its tokenizer, its first weights, and the checks of a run that
starts from a checkpoint (``model.init_from``: fine-tuning).

* tokenizer: from scratch, a joint BPE learnt from the training pairs (§5.1); with
  ``model.init_from``, the checkpoint's own: aiayn's joint BPE (``tokenizer.json``) of a model
  aiayn trained, or the SentencePiece vocabularies of a converted Marian (OPUS-MT) model or
  the ``spiece.model``/``tokenizer.json`` of a converted T5
  (:mod:`aiayn.data.pretrained_tokenizer`), which code the source and the target side as
  ``transformers`` does (``tokenizer(text)`` and ``tokenizer(text_target=...)``). The run
  folder keeps a copy (``tokenizer.json``, or the pretrained tokenizer's files in the
  subfolder :data:`PRETRAINED_TOKENIZER_DIR`); a resumed run reloads it from there, and every
  checkpoint saves it beside the weights, so ``aiayn translate`` reads the checkpoints as it
  reads the converted one.
* weights: from scratch, the family's initialisation; with ``model.init_from``, every tensor of
  the checkpoint (the architecture is the checkpoint's: only its dropout rates may be set).
* what a converted checkpoint records about the model beyond its weights (its Hugging Face
  config and generation settings, ``hf_config`` and ``generation`` in ``state.json``) goes on
  into every checkpoint of the run, so that ``aiayn translate`` decodes the fine-tuned model
  with the converted model's settings.

Families whose models aiayn cannot train from scratch (T5: no aiayn tokenizer or initialisation
fits it) train only from a checkpoint (:func:`check_fine_tuning_run`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import nn

from aiayn.config import ModelConfig
from aiayn.data import Tokenizer
from aiayn.data.pretrained_tokenizer import (
    MANIFEST,
    MarianTokenizer,
    T5Tokenizer,
    TranslationTokenizer,
    load_pretrained_tokenizer,
)
from aiayn.errors import ConfigError, UserError
from aiayn.training.config import DataConfig, RunConfig, checkpoint_model_config

Log = Callable[[str], None]

BPE_FILE = "tokenizer.json"
"""aiayn's joint BPE in the run folder."""

PRETRAINED_TOKENIZER_DIR = "tokenizer"
"""The run folder's subfolder holding a converted model's tokenizer files (with their
manifest, as in a checkpoint folder)."""

CARRIED_STATE = ("hf_config", "generation")
"""The ``state.json`` entries of the ``init_from`` checkpoint that every checkpoint of the run
carries on: what ``aiayn convert`` recorded about the model (not about a run)."""

LEARNT_VOCABULARY = ("vocab_size", "min_frequency")
"""The data keys that shape a vocabulary learnt from the data: no use with ``init_from``."""


def run_tokenizer(
    run: RunConfig,
    run_dir: Path,
    texts: Callable[[], Sequence[str]],
    *,
    reuse: bool,
    log: Log,
) -> tuple[TranslationTokenizer, Path | T5Tokenizer | MarianTokenizer]:
    """(the run's tokenizer, what checkpoints save of it), kept in ``run_dir``: reloaded from
    there (``reuse``, when it is there), the ``init_from`` checkpoint's, or a joint BPE learnt
    from ``texts()`` (both sides of the training pairs)."""
    bpe_file, pretrained = run_dir / BPE_FILE, run_dir / PRETRAINED_TOKENIZER_DIR
    if reuse and (pretrained / MANIFEST).is_file():
        loaded = load_pretrained_tokenizer(pretrained)
        return loaded, loaded
    if reuse and bpe_file.is_file():
        return Tokenizer.load(bpe_file), bpe_file
    run_dir.mkdir(parents=True, exist_ok=True)
    if run.init_from is not None:
        return _checkpoint_tokenizer(run.init_from, run_dir, log)
    d = run.data
    assert isinstance(d, DataConfig)
    started = time.perf_counter()
    tokenizer = Tokenizer.train(texts(), d.vocab_size, min_frequency=d.min_frequency)
    tokenizer.save(bpe_file)
    log(
        f"data: joint BPE vocabulary of {tokenizer.vocab_size} tokens "
        f"({time.perf_counter() - started:.1f}s)"
    )
    return tokenizer, bpe_file


def _checkpoint_tokenizer(
    init_from: str, run_dir: Path, log: Log
) -> tuple[TranslationTokenizer, Path | T5Tokenizer | MarianTokenizer]:
    """The tokenizer saved with the checkpoint ``init_from``, copied into ``run_dir``."""
    from aiayn.checkpoint import checkpoint_tokenizer, resolve_checkpoint

    folder = resolve_checkpoint(init_from)
    source = checkpoint_tokenizer(folder)
    if isinstance(source, Path):
        file = run_dir / BPE_FILE
        tokenizer = Tokenizer.load(source)
        shutil.copyfile(source, file)
        log(f"data: the joint BPE of {folder} ({tokenizer.vocab_size} tokens)")
        return tokenizer, file
    if not isinstance(source, (T5Tokenizer, MarianTokenizer)):
        raise UserError(f"model.init_from: {folder} holds an encoder-only model's inputs")
    source.save(run_dir / PRETRAINED_TOKENIZER_DIR)
    log(f"data: the tokenizer of {folder} ({source!r})")
    return source, source


def start_config(run: RunConfig, tokenizer: TranslationTokenizer) -> ModelConfig:
    """The run's model config with ``init_from``'s tokenizer: the checkpoint's, whose embeddings
    must hold every id of the tokenizer and which must pad with the tokenizer's pad id."""
    config = run.model
    assert isinstance(config, _Vocabulary)  # every encoder-decoder's config
    target_rows = getattr(config, "tgt_vocab_size", None) or config.vocab_size
    if isinstance(tokenizer, MarianTokenizer):
        target_ids = tokenizer.target_vocab_size
    else:
        target_ids = tokenizer.vocab_size
    for what, ids, rows in (
        ("source", tokenizer.vocab_size, config.vocab_size),
        ("target", target_ids, target_rows),
    ):
        if ids > rows:
            raise UserError(
                f"model.init_from: the tokenizer of {run.init_from} has {ids} {what} ids, more "
                f"than the model's {rows} embedding rows"
            )
    if tokenizer.pad_id != config.pad_id:
        raise UserError(
            f"model.init_from: the tokenizer of {run.init_from} pads with id {tokenizer.pad_id}, "
            f"the model with pad_id={config.pad_id}"
        )
    return config


@runtime_checkable
class _Vocabulary(Protocol):
    """What the encoder-decoders' configs say of their vocabulary."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...


class StartingModel:
    """Builds a run's models (:meth:`Task.new_model <aiayn.training.task.Task.new_model>`):
    the family's fresh model, holding the ``init_from`` checkpoint's weights when the run has
    one (logged for the first model only: FSDP builds more)."""

    def __init__(self, run: RunConfig, log: Log):
        self.run, self._log = run, log

    def __call__(self, config: ModelConfig) -> nn.Module:
        """A model of ``config``, with the starting weights where the run has them."""
        model = self.run.trainer_entry.build(config)
        if self.run.init_from is None:
            return model
        from aiayn.checkpoint import load_checkpoint
        from aiayn.models.transformer import EncoderDecoder

        start = load_checkpoint(self.run.init_from, expect=EncoderDecoder)
        model.load_state_dict(start.model.state_dict())
        self._log(f"model: the weights of {start.path}")
        self._log = _silent
        return model


def _silent(message: str) -> None:
    """A log that prints nothing."""


def carried_state(run: RunConfig) -> dict[str, Any]:
    """The entries of :data:`CARRIED_STATE` that the ``init_from`` checkpoint has ({} without
    one)."""
    if run.init_from is None:
        return {}
    from aiayn.checkpoint import read_checkpoint_config

    state = read_checkpoint_config(run.init_from)[3]
    return {key: state[key] for key in CARRIED_STATE if key in state}


def check_translation_run(run: RunConfig) -> None:
    """With ``model.init_from``: the model section changes none of the checkpoint's
    architecture (only its dropout rates), and the data section sets nothing of a vocabulary
    to learn (:data:`LEARNT_VOCABULARY`): the checkpoint brings its tokenizer."""
    if run.init_from is None:
        return
    start = checkpoint_model_config(run.init_from, run.family).to_dict()
    for key, value in run.model.to_dict().items():
        if value != start[key] and not key.endswith("dropout"):
            raise ConfigError(
                f"model.{key}={value!r} differs from the {start[key]!r} of {run.init_from}: "
                "with model.init_from the checkpoint gives the model (only its dropout rates "
                "may be set)"
            )
    defaults = DataConfig()
    for key in LEARNT_VOCABULARY:
        if getattr(run.data, key) != getattr(defaults, key):
            raise ConfigError(
                f"data.{key} does not apply with model.init_from, whose checkpoint brings its "
                f"tokenizer: leave data.{key} out"
            )


def check_fine_tuning_run(run: RunConfig) -> None:
    """A family that trains only from a checkpoint has ``model.init_from``; then
    :func:`check_translation_run`."""
    if run.init_from is None:
        raise ConfigError(
            f"family {run.family} trains only from a checkpoint: set model.init_from to a "
            "folder written by aiayn convert"
        )
    check_translation_run(run)
