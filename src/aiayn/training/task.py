"""What a training job is about, as the one training loop sees it: a *task*.

:class:`~aiayn.training.trainer.Trainer` runs the same loop for every task (token-budget
batches, gradient accumulation normalised by the global target tokens, the eq. (3) schedule,
checkpoints that resume exactly, averaging, DDP/FSDP). What differs between translation,
language modelling, image classification and BERT's two tasks is a :class:`Task` the trainer
receives:

===============  =========================  ========================  ============================
part             translation                language model            image classification
===============  =========================  ========================  ============================
module           ``translation``            ``lm``                    ``images``
data             sentence pairs, joint BPE  token stream in blocks    8×8 digits, normalised
model            Transformer                GPT2                      ViT
objective        TranslationObjective       LanguageModelObjective    ImageClassificationObjective
batches          TokenBatchSampler          BlockBatchSampler         ImageBatchSampler
validation       loss, ppl, greedy BLEU     loss, perplexity          loss, accuracy
best checkpoint  highest BLEU               lowest perplexity         highest accuracy
at the end       the test set's BLEU        test ppl, greedy samples  test accuracy
===============  =========================  ========================  ============================

===============  ==================================  ==========================================
part             masked-LM pre-training              text classification
===============  ==================================  ==========================================
module           ``masked_lm``                       ``text_classification``
data             text lines, WordPiece               label<TAB>text lines, WordPiece
model            BERT, MLM head                      BERT, classifier on the pooled [CLS]
objective        MaskedLMObjective (15% masked)      TextClassificationObjective
batches          EncoderBatchSampler (draw ids)      EncoderBatchSampler
validation       loss, ppl at fixed masks            loss, accuracy
best checkpoint  lowest perplexity                   highest accuracy
at the end       test ppl                            test accuracy
===============  ==================================  ==========================================

All but translation validate and test with one metrics function over a split
(:class:`HeldOutTask`; the two classifiers: :class:`AccuracyTask`).

:func:`make_task` asks the family registry (:mod:`aiayn.models.families`) for the task of the
run config's model family and data section: task modules import this one, never the reverse.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from aiayn.config import ModelConfig
from aiayn.training import distributed as dist
from aiayn.training.config import RunConfig

if TYPE_CHECKING:
    from aiayn.checkpoint import TokenizerSource

Log = Callable[[str], None]


def print_main(message: str) -> None:
    """Print a line on rank 0 (the default ``log`` of a task)."""
    if dist.is_main_process():
        print(message, flush=True)


class TrainBatch(Protocol):
    """A collated batch: host tensors the task's objective reads, and its target count."""

    @property
    def num_tgt_tokens(self) -> int: ...

    def pin_memory(self) -> Any: ...

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Any: ...


class TrainSplit(Protocol):
    """The training examples: collation and host-side target counts, by example index."""

    def __len__(self) -> int: ...

    def collate(self, indices: Iterable[int]) -> Any: ...

    def target_tokens(self, indices: Sequence[int] | NDArray[np.int64]) -> int: ...


class TaskData(Protocol):
    """A task's prepared data: what the loop reads of it (the task reads the rest)."""

    @property
    def tokenizer_file(self) -> TokenizerSource:
        """What checkpoints save beside the weights: a tokenizer file (``tokenizer.json``), or
        an image task's :class:`~aiayn.data.images.ImagePreprocessor`."""
        ...

    @property
    def train(self) -> TrainSplit: ...


_D = TypeVar("_D")


def data_as(data: TaskData, kind: type[_D]) -> _D:
    """``data`` as the ``kind`` of prepared data its task made (a task's own methods get back
    what its :meth:`Task.prepare_data` returned)."""
    assert isinstance(data, kind)
    return data


class BatchSampler(Protocol):
    """An epoch's batches (example indices), deterministic in (seed, epoch)."""

    def __len__(self) -> int: ...

    def batches(self, epoch: int) -> list[list[int]]: ...

    def padding_fraction(self, epoch: int = 0) -> float: ...


@dataclass(frozen=True)
class Criterion:
    """Which validation metric picks the ``best`` checkpoint.

    Attributes:
        metric: its key in the validation metrics ("bleu", "ppl").
        label: its name in messages ("BLEU", "perplexity").
        higher_is_better: the direction.
        plot_title: the title of its panel in ``curves.png``.
    """

    metric: str
    label: str
    higher_is_better: bool
    plot_title: str

    @property
    def state_key(self) -> str:
        """Its key in a checkpoint's state (``best_bleu``, ``best_ppl``)."""
        return f"best_{self.metric}"

    @property
    def worst(self) -> float:
        """The value any first result beats."""
        return -math.inf if self.higher_is_better else math.inf

    def better(self, value: float, than: float) -> bool:
        """``value`` beats ``than``."""
        return value > than if self.higher_is_better else value < than


@dataclass
class FinalOutputs:
    """What a task adds at the end of training (rank 0, with the final or averaged model).

    Attributes:
        test: the test set's metrics (recorded in metrics.jsonl as ``kind: test``), or None.
        samples: (prompt, continuation) pairs to show.
    """

    test: dict[str, Any] | None = None
    samples: list[tuple[str, str]] = field(default_factory=list)


class Task(Protocol):
    """The parts of a training job that depend on what is learnt (see the module docstring)."""

    criterion: Criterion

    def prepare_data(self, run_dir: Path, *, reuse_tokenizer: bool) -> TaskData:
        """Read the data, train (or reload from ``run_dir``) the tokenizer, encode."""
        ...

    def model_config(self, data: TaskData) -> ModelConfig:
        """The model's config for this data (the vocabulary filled in)."""
        ...

    def new_model(self, config: ModelConfig) -> nn.Module:
        """A model to train: fresh weights (or the run's starting weights)."""
        ...

    def objective(self, model: nn.Module) -> nn.Module:
        """The loss module around ``model``: called with :meth:`step_inputs`, gives LossSums."""
        ...

    def sampler(self, data: TaskData, max_tokens: int, seed: int) -> BatchSampler:
        """The training batches under the token budget."""
        ...

    def step_inputs(self, batch: Any) -> tuple[Any, ...]:
        """The objective's arguments for a (device) batch."""
        ...

    def padding(self, batches: Sequence[Any]) -> float:
        """Fraction of padding in collated ``batches``."""
        ...

    def describe(self, data: TaskData) -> str:
        """What the training split holds, for the setup line ("12000 pairs")."""
        ...

    def evaluate(
        self, model: nn.Module, data: TaskData, *, max_tokens: int, **options: Any
    ) -> dict[str, float]:
        """Validation metrics of ``model`` (eval mode, no gradients: the caller's business);
        ``loss``, ``nll`` and ``ppl`` always, and the criterion's metric."""
        ...

    def metrics_line(self, metrics: dict[str, float]) -> str:
        """Validation metrics in one log line."""
        ...

    def finish(self, model: nn.Module, data: TaskData, run_dir: Path) -> FinalOutputs:
        """The end of training (rank 0): test set, samples."""
        ...

    def report(self, result: Any) -> None:
        """Print the end of ``aiayn train``'s output for a finished run (rank 0)."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """Entries every checkpoint's ``state.json`` carries besides the trainer's own (a
        converted starting checkpoint's Hugging Face settings); {} for most tasks."""
        ...


class HeldOutData(TaskData, Protocol):
    """Prepared data with a validation split and an optional test split, which one metrics
    function scores (:class:`HeldOutTask`)."""

    @property
    def valid(self) -> Any: ...

    @property
    def test(self) -> Any: ...


class HeldOutTask:
    """:meth:`Task.evaluate` and :meth:`Task.finish` of a task whose validation and test
    results are one metrics function (:meth:`split_metrics`) of the model and a split: the
    validation split's with the run's label smoothing, the test split's (when there is one)
    without, logged in one line (:meth:`test_line`).

    Subclasses set :attr:`model_class`, :attr:`data_class`, and ``run``, ``log`` and
    ``label_smoothing`` in their ``__init__``.
    """

    model_class: ClassVar[type[nn.Module]]
    data_class: ClassVar[type[HeldOutData]]
    run: RunConfig
    log: Log
    label_smoothing: float

    @staticmethod
    def split_metrics(
        model: Any, split: Any, max_tokens: int, label_smoothing: float = 0.0, /
    ) -> dict[str, float]:
        """The metrics of ``model`` (eval mode) over ``split``, in batches of ``max_tokens``
        (a subclass sets its task's metrics function)."""
        raise NotImplementedError

    def test_line(self, test: Mapping[str, float]) -> str:
        """The test split's metrics in one log line."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict[str, Any]:
        """Nothing beyond the trainer's own state."""
        return {}

    def evaluate(
        self, model: nn.Module, data: TaskData, *, max_tokens: int, **options: Any
    ) -> dict[str, float]:
        """The validation split's metrics."""
        refuse_options(options)
        assert isinstance(model, self.model_class) and isinstance(data, self.data_class)
        return self.split_metrics(model, data.valid, max_tokens, self.label_smoothing)

    def finish(self, model: nn.Module, data: TaskData, run_dir: Path) -> FinalOutputs:
        """The test split's metrics (when there is one)."""
        assert isinstance(model, self.model_class) and isinstance(data, self.data_class)
        out = FinalOutputs()
        if data.test is not None:
            out.test = self.split_metrics(model, data.test, self.run.train.max_tokens)
            self.log(self.test_line(out.test))
        return out


class AccuracyTask(HeldOutTask):
    """A classifier's :class:`HeldOutTask`: the best checkpoint has the highest validation
    accuracy; log lines and the report in accuracy, counting :attr:`unit` ("images")."""

    criterion = Criterion(
        "accuracy", "accuracy", higher_is_better=True, plot_title="validation accuracy (%)"
    )
    unit: ClassVar[str]

    def metrics_line(self, metrics: dict[str, float]) -> str:
        """Loss and accuracy."""
        return accuracy_line(metrics, self.unit)

    def test_line(self, test: Mapping[str, float]) -> str:
        """Accuracy, right / all."""
        return accuracy_on_test(test, self.unit)

    def describe(self, data: TaskData) -> str:
        """The training split's size in :attr:`unit` ("1437 images")."""
        return f"{len(data_as(data, self.data_class).train)} {self.unit}"

    def report(self, result: Any) -> None:
        """Validation accuracy of the last, best and averaged checkpoints, then the test's."""
        print_accuracy_report(result)


def accuracy_line(metrics: Mapping[str, float], unit: str) -> str:
    """A classifier's validation metrics in one log line (``unit``: as in
    :meth:`~aiayn.evaluation.perplexity.EvalTally.metrics`)."""
    return (
        f"loss {metrics['loss']:.3f} accuracy {metrics['accuracy']:.2f}% "
        f"({int(metrics[unit])} {unit})"
    )


def accuracy_on_test(test: Mapping[str, float], unit: str) -> str:
    """A classifier's test result in one log line: accuracy and right / all."""
    return (
        f"test: accuracy {test['accuracy']:.2f}% ({int(test['correct'])}/{int(test[unit])} {unit})"
    )


def print_accuracy_report(result: Any) -> None:
    """A classifier task's :meth:`Task.report`: validation accuracy of the last, best and
    averaged checkpoints, then the test's."""
    v = result.valid
    validation = f"accuracy {v['accuracy']:.2f}%, loss {v['loss']:.3f}"
    print_checkpoint_report(result, validation, lambda m: f"accuracy {m['accuracy']:.2f}%")


def refuse_options(options: Mapping[str, Any]) -> None:
    """Refuse the validation ``options`` a task's :meth:`Task.evaluate` does not know."""
    if options:
        raise TypeError(f"unknown evaluation option(s): {', '.join(sorted(options))}")


def print_checkpoint_report(
    result: Any, validation: str, headline: Callable[[Mapping[str, Any]], str]
) -> None:
    """The lines a task's :meth:`Task.report` starts with, for a finished run ``result`` (a
    :class:`~aiayn.training.trainer.TrainResult`): ``validation`` (the final checkpoint's
    validation metrics in the task's words), then the ``headline`` metric ("accuracy 97.00%")
    of the ``best`` checkpoint (read from its state), of the averaged checkpoint, and of the
    test set, with the checkpoint each came from."""
    print(f"validation: {validation} ({result.final_checkpoint.name})")
    best = Path(result.run_dir) / "checkpoints" / "best" / "state.json"
    if best.is_file():
        state = json.loads(best.read_text(encoding="utf-8"))
        print(
            f"best checkpoint: {headline(state['metrics'])} at step {state['step']} ({best.parent})"
        )
    if result.averaged_valid is not None and result.averaged_checkpoint is not None:
        print(
            f"averaged checkpoint: {headline(result.averaged_valid)} ({result.averaged_checkpoint})"
        )
    if result.test is not None:
        which = "averaged" if result.averaged_checkpoint is not None else "last"
        print(f"test: {headline(result.test)} ({which} checkpoint)")


def make_task(run: RunConfig, log: Log = print_main) -> Task:
    """The task of ``run``'s model family for its data section (the family registry's
    ``training.tasks``); ``log`` prints its data reports and results."""
    task: Task = run.trainer_entry.task_class(run.data)(run, log)
    return task
