"""How a BERT training run (family ``bert``: :mod:`~aiayn.training.masked_lm`,
:mod:`~aiayn.training.text_classification`) starts: its tokenizer and its first weights.

* tokenizer: with ``model.init_from``, the checkpoint's own (a converted BERT's, or one that
  aiayn trained); from scratch, a WordPiece vocabulary learnt from the training text
  (:func:`~aiayn.data.bert_data.train_wordpiece`). Either is saved into the run folder
  (``tokenizer.json`` + ``bert_tokenizer.json``) and beside every checkpoint's weights, in the
  form a converted BERT's is saved, so ``aiayn fill-mask`` and ``aiayn classify-text`` read the
  checkpoints; a resumed run reloads it from the run folder.
* weights: from scratch, BERT's initialisation; with ``model.init_from``, every tensor of the
  checkpoint the new model has a place for: the encoder always, the pooler and the masked-LM
  head when the checkpoint has them, the classifier only when it was trained on the same labels
  (the same names in the same order). The other parts start fresh, and the log says which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.data.bert_data import train_wordpiece
from aiayn.data.bert_tokenizer import MANIFEST, BertTokenizer, load_bert_tokenizer
from aiayn.errors import ConfigError, UserError
from aiayn.models.bert import BERT, BertConfig
from aiayn.training.config import BERT_TASKS, BertDataConfig, RunConfig

Log = Callable[[str], None]

HEAD_PARTS = {"pooler": "pooler", "mlm_head": "masked-LM head", "classifier": "classifier"}
"""A BERT's parts outside the encoder (top-level module name -> its name in messages)."""


def silent(message: str) -> None:
    """A log that prints nothing."""


def max_length(run: RunConfig) -> int:
    """The longest example in tokens: ``data.max_length``, or the model's positions."""
    assert isinstance(run.data, BertDataConfig) and isinstance(run.model, BertConfig)
    return run.data.max_length or run.model.max_len


def run_tokenizer(
    run: RunConfig, run_dir: Path, texts: Callable[[], Sequence[str]], *, reuse: bool, log: Log
) -> BertTokenizer:
    """The run's tokenizer, saved in ``run_dir``: reloaded from there (``reuse``, when it is
    there), the init_from checkpoint's, or a WordPiece vocabulary learnt from ``texts()``."""
    if reuse and (run_dir / MANIFEST).is_file():
        return load_bert_tokenizer(run_dir)
    if run.init_from is not None:
        tokenizer = checkpoint_bert_tokenizer(run.init_from)
        log(f"data: the tokenizer of {run.init_from} ({tokenizer.vocab_size} tokens)")
    else:
        assert isinstance(run.data, BertDataConfig) and isinstance(run.model, BertConfig)
        d, started = run.data, time.perf_counter()
        tokenizer = train_wordpiece(
            texts(),
            d.vocab_size,
            min_frequency=d.min_frequency,
            lowercase=d.lowercase,
            model_max_length=run.model.max_len,
        )
        log(
            f"data: WordPiece vocabulary of {tokenizer.vocab_size} tokens "
            f"({'lowercased, ' if d.lowercase else ''}{time.perf_counter() - started:.1f}s)"
        )
    tokenizer.save(run_dir)
    return tokenizer


def checkpoint_bert_tokenizer(folder: str | Path) -> BertTokenizer:
    """The BERT tokenizer saved with a checkpoint (a run folder: its latest checkpoint).

    Raises:
        UserError: the folder holds no BERT tokenizer (``bert_tokenizer.json``).
    """
    from aiayn.checkpoint import checkpoint_tokenizer, resolve_checkpoint

    path = resolve_checkpoint(folder)
    tokenizer = checkpoint_tokenizer(path)
    if not isinstance(tokenizer, BertTokenizer):
        raise UserError(f"{path} has no BERT vocabulary ({MANIFEST})")
    return tokenizer


def sized_config(run: RunConfig, tokenizer: BertTokenizer, **changes: object) -> BertConfig:
    """The run's model config for ``tokenizer``, with ``changes``: from scratch, the
    vocabulary's size and ``[PAD]``; with init_from, the checkpoint's (whose embedding must
    hold every id of its tokenizer)."""
    config = run.model
    assert isinstance(config, BertConfig)
    if run.init_from is None:
        return config.replace(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **changes)
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(
            f"the tokenizer of {run.init_from} has {tokenizer.vocab_size} tokens, more than the "
            f"model's vocab_size={config.vocab_size}"
        )
    return config.replace(**changes) if changes else config


class StartingBert:
    """Builds a run's BERTs (:meth:`Task.new_model <aiayn.training.task.Task.new_model>`):
    fresh, or holding the ``init_from`` checkpoint's weights (:func:`load_start_weights`), whose
    report is logged for the first model only (FSDP builds more models to fill)."""

    def __init__(self, init_from: str | None, log: Log):
        self.init_from, self._log = init_from, log

    def __call__(self, config: BertConfig) -> BERT:
        """A BERT of ``config``, with the starting weights where the run has them."""
        model = BERT(config)
        if self.init_from is not None:
            load_start_weights(model, self.init_from, self._log)
            self._log = silent
        return model


def load_start_weights(model: BERT, init_from: str, log: Log) -> None:
    """Copy into ``model`` the tensors of the checkpoint ``init_from`` it has a place for (see
    the module docstring); log which parts start fresh and which of the checkpoint go unused."""
    from aiayn.checkpoint import load_checkpoint

    start = load_checkpoint(init_from, expect=BERT, fp32_for="training (init_from)")
    theirs, ours = start.model.state_dict(), model.state_dict()
    same_labels = _same_labels(start.model.config, model.config)
    kept = {
        name: theirs[name]
        for name, tensor in ours.items()
        if name in theirs
        and theirs[name].shape == tensor.shape
        and (same_labels or not name.startswith("classifier."))
    }
    missing = {name.split(".")[0] for name in ours.keys() - kept.keys()}
    if "encoder" in missing:  # the config is the checkpoint's: its encoder fits
        raise UserError(f"{start.path}: its encoder does not fit this run's model")
    model.load_state_dict(kept, strict=False)
    unused = {name.split(".")[0] for name in theirs.keys() - ours.keys()}
    if not same_labels and start.model.classifier is not None:
        unused.add("classifier")
    fresh = " and ".join(HEAD_PARTS[p] for p in HEAD_PARTS if p in missing)
    dropped = " and ".join(HEAD_PARTS[p] for p in HEAD_PARTS if p in unused)
    log(
        f"model: the weights of {start.path}"
        + (f"; new {fresh} (fresh weights)" if fresh else "")
        + _classifier_note(start.model.config, model.config, "classifier" in missing)
        + (f"; not used: its {dropped}" if dropped else "")
    )


def _same_labels(start: BertConfig, new: BertConfig) -> bool:
    """Whether the checkpoint's classifier was trained on ``new``'s labels."""
    return (
        start.head == new.head == "classification"
        and bool(new.id2label)
        and start.id2label == new.id2label
    )


def _classifier_note(start: BertConfig, new: BertConfig, fresh: bool) -> str:
    """Why the classifier starts fresh (empty when it does not, or when there is none)."""
    if new.head != "classification" or not fresh:
        return ""
    if start.head != "classification":
        return f" (the checkpoint has head {start.head!r}, no classifier)"
    if not start.id2label:
        return " (the checkpoint's classifier names no labels)"
    return (
        f" (the checkpoint's classifier has labels {', '.join(start.id2label)}; the training "
        f"file's are {', '.join(new.id2label)})"
    )


def check_bert_run(run: RunConfig) -> None:
    """The model has the head (and pooler) ``data.task`` trains; ``data.max_length`` fits its
    positions."""
    model, data = run.model, run.data
    assert isinstance(model, BertConfig) and isinstance(data, BertDataConfig)
    wanted = BERT_TASKS[data.task_name]
    if (model.head, model.pooler) != (wanted["head"], wanted["pooler"]):
        raise ConfigError(
            f"data.task={data.task} trains a BERT with head {wanted['head']!r} and "
            f"pooler={wanted['pooler']}; the model has head {model.head!r} and "
            f"pooler={model.pooler}"
        )
    if data.max_length is not None and data.max_length > model.max_len:
        raise ConfigError(
            f"data.max_length={data.max_length} exceeds the model's max_len={model.max_len} "
            "positions"
        )


def bert_task_model(model: BertConfig, data: Any, given: Mapping[str, Any]) -> BertConfig:
    """``model`` with the head ``data.task`` trains (:data:`BERT_TASKS`); a ``model.head`` or
    ``model.pooler`` the config gives that does not fit it is an error naming it."""
    wanted = BERT_TASKS[data.task]
    for key, value in wanted.items():
        if key in given and given[key] != value:
            raise ConfigError(
                f"model.{key}={given[key]!r} does not fit data.task={data.task}, which trains "
                f"head {wanted['head']!r} with pooler={wanted['pooler']}: leave model.{key} out"
            )
    return model.replace(**wanted)
