"""Checkpoint averaging over the end of the run (§6.1): the schedule by hand, the averaged set
inside the window with a step or a time budget, pruning that spares it, and a resume that
writes the same set."""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.errors import ConfigError
from aiayn.training import trainer as trainer_module
from aiayn.training.averaging import (
    AveragingPlan,
    AveragingWindow,
    averaging_points,
    averaging_steps,
    step_budget,
    steps_per_epoch,
)
from aiayn.training.config import RunConfig, TrainConfig
from aiayn.training.trainer import Trainer

MakeRun = Callable[..., RunConfig]
Task = Callable[..., Path]
WEIGHT = "decoder.layers.0.feed_forward.linear1.weight"


def test_averaging_steps_by_hand() -> None:
    # the last 10% of 2,000 steps is 1,801..2,000: 5 checkpoints 200 / 5 = 40 steps apart
    assert averaging_steps(2000, 0.1, 5) == [1840, 1880, 1920, 1960, 2000]
    # the run: 1,989 steps, 39.78 apart -> 2000 - floor(k * 39.78), k = 4..0
    assert averaging_steps(1989, 0.1, 5) == [1830, 1870, 1910, 1950, 1989]
    # a 20-step window for 3: 6.67 apart
    assert averaging_steps(100, 0.2, 3) == [87, 94, 100]
    assert averaging_steps(8, 0.75, 3) == [4, 6, 8]
    # fewer steps in the window than checkpoints: fewer checkpoints, never earlier ones
    assert averaging_steps(10, 0.1, 5) == [10]
    assert averaging_steps(20, 0.1, 5) == [19, 20]
    assert averaging_steps(5, 1.0, 5) == [1, 2, 3, 4, 5]
    # time: the last 90 s of 15 minutes, 30 s apart
    assert averaging_points(900.0, 0.1, 3) == [840.0, 870.0, 900.0]
    # the multi30k config: the last 6 of 60 minutes, 72 s apart
    assert averaging_points(3600.0, 0.1, 5) == pytest.approx([3312, 3384, 3456, 3528, 3600])


def test_averaging_schedule_is_refused_outside_its_range() -> None:
    for window in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="window"):
            averaging_steps(100, window, 3)
    with pytest.raises(ValueError, match="checkpoints"):
        averaging_points(100.0, 0.1, 0)
    with pytest.raises(ConfigError, match="average_window"):
        TrainConfig(average_window=0.0)
    with pytest.raises(ConfigError, match="average_window"):
        TrainConfig(average_window=1.5)


def test_step_budget_from_epochs() -> None:
    assert steps_per_epoch(195, 1, 1) == 195
    assert steps_per_epoch(195, 1, 2) == 98  # one process: a short last step
    assert steps_per_epoch(195, 2, 2) == 48  # several: the short tail is skipped
    assert step_budget(100_000, None, 195) == 100_000
    assert step_budget(100_000, 3, 195) == 585
    assert step_budget(500, 3, 195) == 500


def test_time_points_pass_once_and_start_the_window(tmp_path: Path) -> None:
    plan = AveragingPlan.of(3, 0.5, budget=100_000, max_minutes=1.0)
    assert plan.seconds == (40.0, 50.0)  # and the end of the 60 s
    window = AveragingWindow(tmp_path, plan)
    due = []
    for step, elapsed in [(1, 10.0), (2, 39.9), (3, 41.0), (4, 45.0), (5, 55.0), (6, 58.0)]:
        if window.due(step, elapsed, window.time_due(elapsed)):
            due.append(step)
    assert due == [3, 5] and window.time_start == 3
    assert window.window_start(final_step=7) == 3
    # a slow step passing both points writes one checkpoint
    late = AveragingWindow(tmp_path, plan)
    assert late.due(9, 51.0, late.time_due(51.0)) and not late.time_due(59.0)


def _window_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (run_dir / "checkpoints" / "window").glob("step_*"))


def _records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def test_step_budget_averages_inside_the_window_and_survives_pruning(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    train = reverse_task(tmp_path, 300, seed=1)
    run = make_run(
        tmp_path / "r",
        train,
        max_steps=10,
        save_every=2,
        eval_every=5,
        keep_last=1,
        average_last=3,
        average_window=0.5,
    )
    result = Trainer(run).fit()
    run_dir = tmp_path / "r"
    # the window is steps 6..10; 3 checkpoints 5/3 apart: 10 - floor(0, 1.67, 3.33)
    assert _window_steps(run_dir) == [7, 9, 10]
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_00000010"]  # pruned apart
    assert result.averaged_checkpoint is not None and result.averaged_valid is not None
    averaged = load_checkpoint(result.averaged_checkpoint)
    assert [Path(p).name for p in averaged.state["averaged_from"]] == [
        "step_00000007",
        "step_00000009",
        "step_00000010",
    ]
    window = run_dir / "checkpoints" / "window"
    weights = [load_file(str(window / f"step_{s:08d}" / "model.safetensors")) for s in (7, 9, 10)]
    torch.testing.assert_close(
        averaged.model.state_dict()[WEIGHT], sum(w[WEIGHT] for w in weights) / 3
    )
    # the last window checkpoint is the final one; averaging checkpoints hold no optimizer
    final = load_file(str(list_checkpoints(run_dir)[-1] / "model.safetensors"))
    assert torch.equal(final[WEIGHT], weights[-1][WEIGHT])
    assert not (window / "step_00000010" / "optimizer.safetensors").exists()
    # last vs averaged on validation, and which became best
    (entry,) = _records(run_dir, "valid_averaged")
    assert entry["averaged_steps"] == [7, 9, 10]
    assert (
        entry["last_bleu"] == result.valid["bleu"]
        and entry["bleu"] == result.averaged_valid["bleu"]
    )
    best_before = max(e["bleu"] for e in _records(run_dir, "valid"))
    best = json.loads((run_dir / "checkpoints" / "best" / "state.json").read_text())
    if entry["best"] == "averaged":
        assert result.averaged_valid["bleu"] > best_before
        assert best["best_bleu"] == result.averaged_valid["bleu"] and "averaged_from" in best
    else:
        assert entry["best"] == "kept" and result.averaged_valid["bleu"] <= best_before
        assert best["best_bleu"] == best_before and "averaged_from" not in best


class _Crash(Exception):
    pass


def test_resume_writes_the_same_averaged_set(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash during step 10 of 10 (after the averaging checkpoint of step 9), resume from the
    regular checkpoint of step 8: the averaged set is an uninterrupted run's, bit for bit."""
    train = reverse_task(tmp_path, 300, seed=1)

    def run(folder: Path) -> RunConfig:
        return make_run(
            folder, train, max_steps=10, save_every=4, average_last=3, average_window=0.5
        )

    straight = Trainer(run(tmp_path / "a")).fit()
    train_step = Trainer.train_step

    def crashing(self: Trainer, *args: object) -> object:
        if self.step == 9:
            raise _Crash
        return train_step(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Trainer, "train_step", crashing)
    with pytest.raises(_Crash):
        Trainer(run(tmp_path / "b")).fit()
    assert _window_steps(tmp_path / "b") == [7, 9]
    monkeypatch.setattr(Trainer, "train_step", train_step)
    resumed = Trainer(run(tmp_path / "b"), resume=True)
    assert resumed.step == 8 and _window_steps(tmp_path / "b") == [7]  # 9: written again
    result = resumed.fit()
    assert _window_steps(tmp_path / "b") == _window_steps(tmp_path / "a") == [7, 9, 10]
    for step in (7, 9, 10):
        name = f"checkpoints/window/step_{step:08d}/model.safetensors"
        a, b = load_file(str(tmp_path / "a" / name)), load_file(str(tmp_path / "b" / name))
        assert all(torch.equal(a[k], b[k]) for k in a), step
    assert straight.averaged_checkpoint is not None and result.averaged_checkpoint is not None
    a = load_checkpoint(straight.averaged_checkpoint).model.state_dict()
    b = load_checkpoint(result.averaged_checkpoint).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_time_budget_averages_the_end_of_the_time(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock at 6 s a step and max_minutes=1: steps end past 6, 12, … s; the run stops after
    step 11 (66 s); the time points 40 and 50 s pass at steps 7 and 9."""
    train = reverse_task(tmp_path, 300, seed=1)
    run = make_run(
        tmp_path / "r", train, max_minutes=1.0, save_every=2, average_last=3, average_window=0.5
    )
    trainer = Trainer(run)
    clock = types.SimpleNamespace(perf_counter=lambda: 6.0 * trainer.step)
    monkeypatch.setattr(trainer_module, "time", clock)
    result = trainer.fit()
    assert result.steps == 11
    assert _window_steps(tmp_path / "r") == [7, 9, 11]
    (entry,) = _records(tmp_path / "r", "valid_averaged")
    # all inside the last half of the 60 s: after step 5 (30 s)
    assert entry["averaged_steps"] == [7, 9, 11]


def test_too_narrow_a_window_averages_nothing(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    """10 steps, the last 10% (1 step) for 3 checkpoints: only the last, so no average (the
    old rule averaged whatever 3 checkpoints were kept, from anywhere in the run)."""
    train = reverse_task(tmp_path, 300, seed=1)
    run = make_run(tmp_path / "r", train, max_steps=10, save_every=2, keep_last=5, average_last=3)
    result = Trainer(run).fit()
    assert result.averaged_checkpoint is None and result.averaged_valid is None
    assert _window_steps(tmp_path / "r") == [10]
    assert not (tmp_path / "r" / "checkpoints" / "averaged").exists()
