"""Training never saves a poisoned model: a step with a non-finite loss or gradient norm is
skipped (no weight, Adam moment, step count or schedule change; its batches are passed over),
and ``train.max_bad_steps`` of them in a row stop the run with the last good checkpoint as the
newest.

NaNs are injected into the objective on chosen forward calls: ``loss`` adds a NaN constant to
the loss (the gradients stay finite: only the loss check can see it), ``gradient`` leaves the
loss finite and makes its gradient infinite (only the gradient check can see it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from torch import Tensor

from aiayn.checkpoint import list_checkpoints
from aiayn.cli.main import main
from aiayn.layers.loss import LossSums
from aiayn.training.config import DataConfig, RunConfig
from aiayn.training.objective import TranslationObjective
from aiayn.training.trainer import DIVERGED_EXIT_STATUS, Trainer, TrainingDiverged

MakeRun = Callable[..., RunConfig]
Task = Callable[..., Path]


class _InfiniteGradient(torch.autograd.Function):
    """The identity forward; an infinite gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad * float("inf")


def poison(sums: LossSums, kind: str) -> LossSums:
    """``sums`` with a NaN loss (finite gradients) or an infinite gradient (finite loss)."""
    if kind == "loss":
        return sums._replace(loss=sums.loss + float("nan"))
    return sums._replace(loss=_InfiniteGradient.apply(sums.loss))


def inject(monkeypatch: pytest.MonkeyPatch, calls: Iterable[int], kind: str) -> None:
    """Poison the objective's forward calls numbered ``calls`` (from 1)."""
    bad, original, count = set(calls), TranslationObjective.forward, [0]

    def forward(self: TranslationObjective, *args: Any) -> LossSums:
        count[0] += 1
        sums = original(self, *args)
        return poison(sums, kind) if count[0] in bad else sums

    monkeypatch.setattr(TranslationObjective, "forward", forward)


def capture_log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr("aiayn.training.trainer.log", lines.append)
    return lines


def _tiny(make_run: MakeRun, folder: Path, train: Path, **train_cfg: Any) -> RunConfig:
    """The conftest's tiny run without dropout; validation decodes 2 sentences (fast)."""
    cfg = {"max_tokens": 120, "log_every": 1, **train_cfg}
    run = make_run(folder, train, model={"dropout": 0.0}, **cfg)
    assert isinstance(run.data, DataConfig)
    return dataclasses.replace(run, data=dataclasses.replace(run.data, bleu_sentences=2))


@pytest.mark.parametrize(("kind", "accum"), [("loss", 1), ("gradient", 2)])
def test_a_bad_step_is_skipped_as_if_its_batches_were_not_there(
    tmp_path: Path,
    reverse_task: Task,
    make_run: MakeRun,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    accum: int,
) -> None:
    """A run whose 3rd step is poisoned (one micro-batch of it) ends bit for bit where a run
    that passed over those batches ends: weights, Adam's moments and step counts, and the
    schedule position (the same lr at each applied step). One warning names the step."""
    train = reverse_task(tmp_path, 200, seed=1)
    steps = 4
    reference = Trainer(
        _tiny(make_run, tmp_path / "ref", train, max_steps=steps, accum_steps=accum)
    )
    for i in range(steps + 1):
        micro = reference._micro_batches()
        assert micro is not None
        if i != 2:  # the 3rd step's batches: passed over
            reference.train_step(*micro)
    lines = capture_log(monkeypatch)
    inject(monkeypatch, [2 * accum + 1], kind)  # the first micro-batch of the 3rd step
    trainer = Trainer(_tiny(make_run, tmp_path / "bad", train, max_steps=steps, accum_steps=accum))
    trainer.fit()
    assert (trainer.step, trainer.batch_index) == (reference.step, reference.batch_index)
    a, b = trainer.model.state_dict(), reference.model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    sa, sb = trainer.optimizer.state_dict(), reference.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]  # lr of the 4th applied step
    for index, state in sa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, sb["state"][index][key]), (index, key)
    warnings = [line for line in lines if line.startswith("warning:")]
    what = "the loss was nan" if kind == "loss" else "the gradient norm was"
    assert len(warnings) == 1 and "step 3 skipped (1 of train.max_bad_steps=5" in warnings[0]
    assert what in warnings[0], warnings
    # the log records each applied step once, with finite losses
    metrics = (tmp_path / "bad" / "metrics.jsonl").read_text().splitlines()
    entries = [json.loads(x) for x in metrics]
    train_entries = [e for e in entries if e["kind"] == "train"]
    assert [e["step"] for e in train_entries] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in train_entries)


def test_consecutive_bad_steps_stop_the_run_with_the_last_good_checkpoint_newest(
    tmp_path: Path,
    reverse_task: Task,
    make_run: MakeRun,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Steps 1-4 train (checkpoints at 2 and 4), then every step is NaN: after 3 in a row the
    CLI stops with one line and exit status 3; nothing was saved after step 4 (no final, best
    or averaged checkpoint), and the run resumes from step 4."""
    train = reverse_task(tmp_path, 200, seed=1)
    run = _tiny(
        make_run,
        tmp_path / "r",
        train,
        max_steps=20,
        save_every=2,
        max_bad_steps=3,
        average_last=2,
        eval_every=0,
    )
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run.to_dict()), encoding="utf-8")
    inject(monkeypatch, range(5, 100), "loss")
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == DIVERGED_EXIT_STATUS == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("aiayn train: error: training stopped: 3 steps"), err
    assert "step 5" in err and "step_00000004" in err and "resume" in err
    folder = tmp_path / "r" / "checkpoints"
    assert [p.name for p in list_checkpoints(tmp_path / "r")] == ["step_00000002", "step_00000004"]
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000002", "step_00000004"]
    weights = load_file(str(folder / "step_00000004" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert max(json.loads(x)["step"] for x in lines) == 4
    # the library raises the same error; the run resumes from its last good checkpoint
    monkeypatch.undo()
    monkeypatch.setattr("aiayn.training.trainer.log", lambda message: None)
    lower = dataclasses.replace(run.train, max_steps=5, lr_scale=0.1)  # a resume may change
    resumed = Trainer(dataclasses.replace(run, train=lower), resume=True)
    assert resumed.step == 4
    assert resumed.fit().steps == 5


def test_fp16_overflow_is_the_loss_scaler_business_but_a_nan_loss_counts(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With fp16 loss scaling, infinite gradients under a finite loss halve the loss scale and
    skip the step without counting towards max_bad_steps (while the scale is above 1); a NaN
    loss counts, and so does an overflow at scale 1."""
    train = reverse_task(tmp_path, 200, seed=1)

    def trainer(name: str) -> Trainer:
        run = _tiny(
            make_run, tmp_path / name, train, max_steps=3, precision="fp16", max_bad_steps=2
        )
        return Trainer(run)

    lines = capture_log(monkeypatch)
    inject(monkeypatch, [2, 3, 4], "gradient")  # 3 overflows in a row > max_bad_steps=2
    overflowing = trainer("overflow")
    assert overflowing.fit().steps == 3 and overflowing.batch_index == 6
    assert overflowing.scaler.get_scale() == 2.0**16 / 8
    assert sum("fp16 gradient overflow" in line for line in lines) == 3
    assert not [line for line in lines if line.startswith("warning:")]
    for kind, scale in (("loss", 2.0**16), ("gradient", 1.0)):
        inject(monkeypatch, [2, 3], kind)
        stopped = trainer(f"{kind}_stop")
        stopped.scaler.load_state_dict({**stopped.scaler.state_dict(), "scale": scale})
        with pytest.raises(TrainingDiverged, match="2 steps in a row"):
            stopped.fit()
        assert stopped.step == 1


# -- several processes -----------------------------------------------------------------------

DRIVER = """
import os, sys
import torch
from aiayn.training import objective
from aiayn.training.trainer import Trainer

rank, bad, calls = int(os.environ["RANK"]), {BAD}, [0]
original_forward, original_fit = objective.TranslationObjective.forward, Trainer.fit

def forward(self, *args):
    calls[0] += 1
    sums = original_forward(self, *args)
    if rank == 1 and calls[0] in bad:  # one rank only: a NaN loss, finite gradients
        return sums._replace(loss=sums.loss + float("nan"))
    return sums

def fit(self):
    try:
        return original_fit(self)
    finally:  # every rank: its step and a checksum of its (full) weights
        full = [getattr(p, "full_tensor", lambda: p)() for p in self.model.parameters()]
        total = sum(float(p.detach().double().sum()) for p in full)
        # one write: the ranks share stdout, and print's two writes could interleave
        os.write(1, f"rank {{rank}}: step {{self.step}} checksum {{total!r}}\\n".encode())

objective.TranslationObjective.forward = forward
Trainer.fit = fit
from aiayn.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_task(path: Path, n: int) -> Path:
    import random

    rng = random.Random(7)
    lines = []
    for _ in range(n):
        words = [rng.choice("abcdefghij") for _ in range(rng.randint(3, 7))]
        lines.append(f"{' '.join(words)}\t{' '.join(words[::-1])}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32",
    reason="needs torch.distributed with gloo",
)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_all_ranks_skip_and_stop_together(tmp_path: Path, strategy: str) -> None:
    """2 processes; rank 1 alone sees a NaN loss (its gradients stay finite) at its 3rd, 6th and
    7th forward. Both ranks skip step 3's first attempt and keep equal weights; the 2nd bad
    step in a row stops both (exit status 3, rank 0 says why in one line) with step_00000004
    the newest checkpoint."""
    train = _write_task(tmp_path / "train.tsv", 400)
    config = {
        "run_dir": str(tmp_path / "run"),
        "model": {"preset": "tiny", "d_model": 32, "d_ff": 64, "num_heads": 4, "dropout": 0.1},
        "data": {
            "train_src": str(train),
            "vocab_size": 300,
            "min_frequency": 1,
            "valid_size": 20,
            "bleu_sentences": 4,
        },
        "train": {
            "max_tokens": 200,
            "warmup_steps": 20,
            "max_steps": 20,
            "eval_every": 0,
            "save_every": 2,
            "log_every": 1,
            "progress": False,
            "threads": 1,
            "max_bad_steps": 2,
            "distributed": strategy,
        },
    }
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump(config), encoding="utf-8")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(BAD="{3, 6, 7}"), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={_free_port()}",
        str(driver),
        "train",
        "--config",
        str(file),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, check=False)
    assert out.returncode != 0, out.stdout
    errors = [line for line in out.stderr.splitlines() if line.startswith("aiayn train: error:")]
    assert len(errors) == 1, out.stderr
    assert (
        "2 steps in a row" in errors[0] and "step 5" in errors[0] and "step_00000004" in errors[0]
    )
    # the workers exit with status 3, without a traceback; torchrun then reports the failure
    # (and may stop a worker still leaving with SIGTERM, once another has exited)
    codes = re.findall(r"exitcode +: (-?\d+)", out.stderr)
    assert "3" in codes and set(codes) <= {"3", "-15"}, out.stderr
    assert out.stderr.count("Traceback") == 1 and "ChildFailedError" in out.stderr, out.stderr
    stdout = out.stdout
    assert "warning: step 3 skipped (1 of" in stdout and "warning: step 5 skipped (2 of" in stdout
    ends = sorted(line for line in stdout.splitlines() if " checksum " in line)
    assert [line.split(" checksum")[0] for line in ends] == ["rank 0: step 4", "rank 1: step 4"]
    assert ends[0].split(" checksum ")[1] == ends[1].split(" checksum ")[1], ends
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == [
        "step_00000002",
        "step_00000004",
    ]
