"""Loading the checkpoints ``aiayn serve`` serves: each becomes a :class:`ServedModel` with one task
per endpoint its family serves (the registry's ``commands``, :data:`TASKS`), each task with its
own worker."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from aiayn.checkpoint import load_checkpoint
from aiayn.errors import UserError
from aiayn.models.families import Family, family_of
from aiayn.serving.attention_task import AttentionTask
from aiayn.serving.encoder_tasks import (
    ClassifyImageTask,
    ClassifyTextTask,
    EmbedTask,
    FillMaskTask,
)
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.tasks import GenerateTask, Task, TranslateTask

TASKS: dict[str, Any] = {
    "attention": AttentionTask,
    "translate": TranslateTask,
    "generate": GenerateTask,
    "embed": EmbedTask,
    "classify-text": ClassifyTextTask,
    "fill-mask": FillMaskTask,
    "classify-image": ClassifyImageTask,
}
"""The task serving each command of the family registry (``attention``: for text, on the worker
of the model's other endpoint)."""


@dataclass
class ServedModel:
    """A loaded checkpoint: its name, folder, family, parameter count, tasks by command and
    load time (``created``: Unix seconds, OpenAI's model field)."""

    name: str
    path: Path
    family: Family
    parameters: int
    tasks: dict[str, Task]
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_input_tokens(self) -> int:
        """The longest input (tokens, or patches) any of its tasks reads."""
        return max(t.max_input_tokens for t in self.tasks.values())

    def start(self) -> None:
        """Start every task's worker."""
        for task in self.tasks.values():
            task.engine.start()

    def stop(self) -> None:
        """Finish the running and queued requests and end the workers."""
        for task in self.tasks.values():
            task.engine.stop()


def load_served_model(
    name: str,
    path: str | Path,
    options: ServeOptions,
    metrics: Metrics,
    *,
    device: str = "cpu",
) -> ServedModel:
    """Load the checkpoint at ``path`` as model ``name``, with a task for each command of its
    family that its model can serve (a BERT's head decides between masked tokens and labels).

    Raises:
        UserError: a checkpoint that cannot be loaded, or that serves no endpoint.
    """
    from aiayn.validation import resolve_device

    ckpt = load_checkpoint(path, map_location=resolve_device(device), expect=nn.Module)
    family = family_of(ckpt.model)
    tasks: dict[str, Task] = {}
    for command in sorted(family.commands - {"attention"}):
        task = TASKS.get(command)
        if task is not None and task.serves(ckpt):
            tasks[command] = task(name, ckpt, options, metrics)
    if "attention" in family.commands and AttentionTask.serves(ckpt):
        host = next(iter(tasks.values())).engine if tasks else None
        tasks["attention"] = AttentionTask(name, ckpt, options, metrics, host)
    if not tasks:
        raise UserError(f"{ckpt.path} holds a {family.name} model, which serves no endpoint")
    parameters = sum(p.numel() for p in ckpt.model.parameters())
    return ServedModel(name, Path(ckpt.path), family, parameters, tasks)
