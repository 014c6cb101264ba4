"""Checkpoint averaging over the end of a run (§6.1): which checkpoints are averaged, and when
they are written.

The paper averages "the last 5 checkpoints, which were written at 10-minute intervals" of a
base model trained for 12 hours (the big one: the last 20): checkpoints from the end of a run
that has converged, close together. Averaging the last ``average_last`` checkpoints the
trainer happened to keep (every ``save_every`` steps) can reach far back in a short run and
average in a model that is much worse than the last one. So the trainer writes the checkpoints
it averages on purpose, ``n = train.average_last`` of them evenly spaced over the last
``w = train.average_window`` fraction of the run's budget, and never averages one from before
that window:

    points(B, w, n) = B − k · w·B/n    for k = n−1, …, 1, 0

the last at the end of the budget B. With a step budget (``max_steps``, or ``max_epochs`` ×
steps per epoch when that is smaller) the points are steps (:func:`averaging_steps`); with a
time budget (``max_minutes``) they are seconds since the start of the session, and a
checkpoint is written after the first step that ends past each point (:func:`averaging_points`).
Whichever budget ends the run, its final step is the last averaged checkpoint.

The averaging checkpoints hold weights only (no optimizer moments) and live apart from the
resumable ones, in ``checkpoints/window/step_XXXXXXXX``, so that ``keep_last`` pruning never
deletes them. A resumed run deletes those written after its checkpoint (it writes them again,
bit for bit the same for a step budget, since resuming is exact), so its averaged set equals an
uninterrupted run's.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiayn.checkpoint import tidy_checkpoints

WINDOW_DIR = "window"
"""The subfolder of a run's ``checkpoints/`` that holds the averaging checkpoints."""

_STEP = re.compile(r"step_(\d{8})")


def averaging_points(budget: float, window: float, n: int) -> list[float]:
    """The n points evenly spaced over the last ``window`` fraction of ``budget``, the last one
    at ``budget``: ``budget − k · window · budget / n`` for k = n−1 … 0, ascending.

    >>> averaging_points(900.0, 0.1, 3)   # the last 90 s of 15 minutes, every 30 s
    [840.0, 870.0, 900.0]
    """
    _check(window, n)
    interval = window * budget / n
    return [budget - k * interval for k in range(n - 1, -1, -1)]


def averaging_steps(budget: int, window: float, n: int) -> list[int]:
    """The steps at which the averaging checkpoints of a ``budget``-step run are written:
    :func:`averaging_points` rounded to whole steps (``budget − ⌊k · window · budget / n⌋``),
    ascending, without repeats, so never before the window. A window of fewer than n steps gives
    fewer checkpoints.

    >>> averaging_steps(2000, 0.1, 5)   # the last 200 steps, every 40
    [1840, 1880, 1920, 1960, 2000]
    >>> averaging_steps(10, 0.1, 5)     # a 1-step window holds only the last step
    [10]
    """
    _check(window, n)
    if budget < 1:
        raise ValueError(f"a step budget must be >= 1, got {budget}")
    # round first: 4 · 0.1 · 2000 / 5 is 160.00000000000003 in floats, and must floor to 160
    offsets = {math.floor(round(k * window * budget / n, 6)) for k in range(n)}
    return sorted(budget - offset for offset in offsets)


def _check(window: float, n: int) -> None:
    if not 0 < window <= 1:
        raise ValueError(f"the averaging window must be in (0, 1], got {window}")
    if n < 1:
        raise ValueError(f"the number of averaged checkpoints must be >= 1, got {n}")


def steps_per_epoch(batches: int, world_size: int, accum_steps: int) -> int:
    """Optimizer steps in an epoch of ``batches`` batches: one process takes a short last step
    with the batches left; several skip a short tail (see ``Trainer._micro_batches``)."""
    per_step = world_size * accum_steps
    return -(-batches // per_step) if world_size == 1 else batches // per_step


def step_budget(max_steps: int, max_epochs: int | None, epoch_steps: int) -> int:
    """The run's step budget: ``max_steps``, or ``max_epochs`` × steps per epoch if smaller
    (steps skipped for a non-finite loss use batches but no step: the budget is then not
    reached, and the run's last step still ends the averaged set)."""
    if max_epochs is None:
        return max_steps
    return max(1, min(max_steps, max_epochs * epoch_steps))


@dataclass(frozen=True)
class AveragingPlan:
    """When one run writes its averaging checkpoints.

    Attributes:
        n: ``train.average_last``, how many checkpoints are averaged.
        window: ``train.average_window``, the fraction of the budget they are written over.
        budget: the step budget (:func:`step_budget`).
        steps: the steps of :func:`averaging_steps` for it, ascending.
        seconds: with a time budget, the :func:`averaging_points` of ``max_minutes`` in seconds
            but the last (the end of the budget is the end of the run); else empty.
    """

    n: int
    window: float
    budget: int
    steps: tuple[int, ...]
    seconds: tuple[float, ...] = ()

    @classmethod
    def of(
        cls, n: int, window: float, budget: int, max_minutes: float | None = None
    ) -> AveragingPlan:
        """The plan for ``n`` checkpoints over ``window`` of a ``budget``-step run (and of
        ``max_minutes``, when set)."""
        seconds = () if max_minutes is None else averaging_points(60 * max_minutes, window, n)
        return cls(
            n, window, budget, tuple(averaging_steps(budget, window, n)), tuple(seconds[:-1])
        )

    def describe(self) -> str:
        """The plan in words, for the training log."""
        text = (
            f"averaging: {self.n} checkpoints over the last {self.window:.0%} of the run, "
            f"written at steps {describe_steps(self.steps)} of {self.budget}"
        )
        if self.seconds:
            minutes = ", ".join(f"{s / 60:.1f}" for s in self.seconds)
            text += (
                f", or after {minutes} minutes and at the end of the time budget if it ends first"
            )
        if len(self.steps) < self.n:
            text += f" (a window of fewer than {self.n} steps: only {len(self.steps)})"
        return text


class AveragingWindow:
    """The averaging checkpoints of a run: which step is due, which are averaged.

    Args:
        folder: ``run_dir/checkpoints/window``.
        plan: the run's :class:`AveragingPlan`.
    """

    def __init__(self, folder: Path, plan: AveragingPlan):
        self.folder, self.plan = folder, plan
        self._next_second = 0  # index of the next time point not yet passed
        self.time_start: int | None = None  # the step after which the first time point passed
        self.saved_at = -1  # the step of the last averaging checkpoint this session wrote

    def time_due(self, elapsed: float) -> bool:
        """Whether ``elapsed`` seconds since the session started reach the next time point."""
        seconds = self.plan.seconds
        return self._next_second < len(seconds) and elapsed >= seconds[self._next_second]

    def due(self, step: int, elapsed: float, time_due: bool) -> bool:
        """Whether to write an averaging checkpoint after ``step``: a step of the plan, or
        ``time_due`` (:meth:`time_due`, agreed by every rank); the time points ``elapsed``
        reaches (at least the next one) are then passed."""
        if time_due:
            self._next_second += 1
            seconds = self.plan.seconds
            while self._next_second < len(seconds) and seconds[self._next_second] <= elapsed:
                self._next_second += 1
            if self.time_start is None:
                self.time_start = step
        return time_due or step in self.plan.steps

    def path(self, step: int) -> Path:
        """Where the averaging checkpoint of ``step`` goes."""
        return self.folder / f"step_{step:08d}"

    def written(self) -> list[tuple[int, Path]]:
        """(step, folder) of the averaging checkpoints on disk, oldest first (after cleaning up
        what a crash left: see :func:`~aiayn.checkpoint.folders.tidy_checkpoints`)."""
        tidy_checkpoints(self.folder)
        if not self.folder.is_dir():
            return []
        found = []
        for folder in self.folder.iterdir():
            match = _STEP.fullmatch(folder.name)
            if match and folder.is_dir():
                found.append((int(match[1]), folder))
        return sorted(found)

    def forget_after(self, step: int) -> list[int]:
        """Delete the averaging checkpoints written after ``step`` (a resumed run writes them
        again); each goes at once (renamed to ``NAME.tmp``, then deleted). Returns their steps."""
        gone = []
        for written, folder in self.written():
            if written > step:
                garbage = folder.with_name(folder.name + ".tmp")
                shutil.rmtree(garbage, ignore_errors=True)
                os.rename(folder, garbage)
                shutil.rmtree(garbage)
                gone.append(written)
        return gone

    def window_start(self, final_step: int) -> int:
        """The first step of the window the run ended in: of the step budget's when the run
        reached its first point, of the time budget's when one of its points passed (the earlier
        if both); else ``final_step`` (nothing but the last checkpoint is in a window)."""
        starts = [self.plan.steps[0]] if final_step >= self.plan.steps[0] else []
        if self.time_start is not None:
            starts.append(self.time_start)
        return min(starts, default=final_step)

    def selection(self, final_step: int) -> list[tuple[int, Path]]:
        """The checkpoints to average at the end of a run at ``final_step``: the last n written
        inside its window (:meth:`window_start`), ending with ``final_step``'s."""
        start = self.window_start(final_step)
        inside = [(s, p) for s, p in self.written() if start <= s <= final_step]
        return inside[-self.plan.n :]


def describe_steps(steps: Sequence[int]) -> str:
    """``1840, 1880, 1920`` (more than 6: the first two, …, the last two)."""
    shown = [str(s) for s in steps]
    return ", ".join(shown if len(shown) <= 6 else [*shown[:2], "…", *shown[-2:]])
