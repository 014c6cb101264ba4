"""The crash guarantee, in short: a training run killed with SIGKILL at random points (during a
training step, while a checkpoint is written, while ``averaged`` is written, between the two
renames that replace a checkpoint) and resumed with ``--resume`` until it finishes ends with
the same final weights, optimizer state, ``best``, averaging checkpoints and ``averaged`` model,
bit for bit, as a run that was never interrupted.

One driver process imports aiayn once, then forks each run (so that the test does not pay
torch's import five times): the uninterrupted reference, alongside the chain of killed and
resumed runs. A run kills itself from inside at an exact point (a hook around the checkpoint
writers, ``os.rename`` or the training step), or the driver kills it after a random delay.
``AIAYN_CRASH_SEED`` picks other random points (the default seed is fixed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from aiayn.checkpoint import MODEL_FILE, OPTIMIZER_FILE, list_checkpoints
from aiayn.training.config import RunConfig

WRITERS = ("_write_model", "write_optimizer", "_write_state", "write_tokenizer")
"""The checkpoint writers (of :mod:`aiayn.checkpoint.save`) a "file" kill counts (then
``write_checksums``)."""


def _plan(seed: int) -> list[dict[str, Any]]:
    """The chain of runs: where each is killed (the last one finishes)."""
    rng = random.Random(seed)
    return [
        # the n-th file written into a step checkpoint (of the first three saves or so)
        {"kind": "file", "folder": "step_*", "count": rng.randint(1, 12)},
        # anywhere: a training step, a validation, a save (it may also finish first)
        {"kind": "timer", "seconds": round(rng.uniform(0.2, 2.5), 2)},
        # while the averaged checkpoint is written, at the end of the run
        {"kind": "file", "folder": "averaged*", "count": rng.randint(1, 4)},
        # the resumed run at the end writes its step's averaging checkpoint again: kill it
        # between the two renames of that replacement
        {"kind": "rename", "count": 1},
        {"kind": "none"},
    ]


def test_killed_and_resumed_run_ends_bit_for_bit_as_an_uninterrupted_one(
    tmp_path: Path, reverse_task: Callable[..., Path], make_run: Callable[..., RunConfig]
) -> None:
    seed = int(os.environ.get("AIAYN_CRASH_SEED", "0"))
    train = reverse_task(tmp_path, 300, seed=1)
    run = make_run(
        tmp_path / "crashed",
        train,
        model={"positional": "learned", "max_len": 24},  # greedy validation outputs stop soon
        max_steps=12,
        eval_every=6,
        save_every=2,
        keep_last=3,
        average_last=3,
        average_window=0.5,
        log_every=4,
        threads=1,
    )
    values = run.to_dict()
    values["data"].update(valid_size=10, bleu_sentences=4)  # a cheap validation
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(values))  # JSON is YAML
    plan = _plan(seed)
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(Path(__file__).parent), str(config), json.dumps(plan)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    log = f"seed {seed}, plan {plan}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.returncode == 0, log
    statuses = json.loads(out.stdout.strip().splitlines()[-1])
    assert statuses["reference"] == 0, log
    killed = -signal.SIGKILL
    chain = statuses["chain"]
    assert [chain[0], chain[2], chain[3], chain[4]] == [killed, killed, killed, 0], log
    assert chain[1] in (killed, 0), log
    _assert_same_runs(tmp_path / "reference", tmp_path / "crashed", log)


def _assert_same_runs(reference: Path, crashed: Path, log: str) -> None:
    ref, got = reference / "checkpoints", crashed / "checkpoints"
    names = [p.name for p in list_checkpoints(reference)]
    assert (
        names
        == [p.name for p in list_checkpoints(crashed)]
        == [
            "step_00000008",
            "step_00000010",
            "step_00000012",
        ]
    ), log
    leftovers = [p for p in got.rglob("*") if p.suffix in (".tmp", ".old", ".corrupt")]
    assert leftovers == [], log
    compared = [f"{names[-1]}/{MODEL_FILE}", f"{names[-1]}/{OPTIMIZER_FILE}"]
    compared += [f"{name}/{MODEL_FILE}" for name in ("best", "averaged")]
    compared += [f"window/{p.name}/{MODEL_FILE}" for p in sorted((ref / "window").iterdir())]
    assert len(compared) == 7 and sorted(os.listdir(got / "window")) == sorted(
        os.listdir(ref / "window")
    ), log
    for name in compared:
        a, b = load_file(str(ref / name)), load_file(str(got / name))
        assert a.keys() == b.keys(), name
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key} differs\n{log}"


# -- the driver (run with python -c in a subprocess) --------------------------------------------

DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
from test_crash_resume import drive
drive(sys.argv[2], sys.argv[3])
"""


def drive(config: str, plan_json: str) -> None:
    """Fork the reference run, then the chain of runs of the plan one after the other (each
    with ``--resume``); print their exit statuses (-9: killed) as JSON."""
    _warm_up()

    def args(run_dir: str) -> list[str]:
        return ["train", "--config", config, "--run-dir", run_dir, "--resume"]

    reference = _fork(args("reference"), {"kind": "none"})
    chain = []
    for kill in json.loads(plan_json):
        started = time.perf_counter()
        pid = _fork(args("crashed"), kill)
        if kill["kind"] == "timer":
            time.sleep(kill["seconds"])
            os.kill(pid, signal.SIGKILL)  # a child that has finished is a zombie: no effect
        chain.append(_status(pid))
        print(f"driver: {kill} -> {chain[-1]} after {time.perf_counter() - started:.1f}s")
    print(json.dumps({"reference": _status(reference), "chain": chain}), flush=True)


def _warm_up() -> None:
    """Pay once, before the forks, what every run would: the imports (torch's optimizers
    import its compiler on first use), matplotlib's first figure."""
    from aiayn.cli.main import main  # noqa: F401
    from aiayn.training.plot import plot_curves

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    plot_curves([], Path("warm-up.png"))
    Path("warm-up.png").unlink()


def _fork(args: list[str], kill: dict[str, Any]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        from aiayn.cli.main import main

        _arm(kill)
        code = main(args)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _status(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _arm(kill: dict[str, Any]) -> None:
    """Make this process SIGKILL itself at the plan's point."""
    import aiayn.checkpoint.save as ck

    left = [kill.get("count", 0)]

    def tick() -> None:
        left[0] -= 1
        if left[0] == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    if kill["kind"] == "file":
        for name in (*WRITERS, "write_checksums"):
            setattr(ck, name, _after(getattr(ck, name), kill["folder"], tick))
    elif kill["kind"] == "rename":
        rename = os.rename

        def stand_aside(src: Any, dst: Any) -> None:
            rename(src, dst)
            if str(dst).endswith(".old"):
                tick()

        os.rename = stand_aside  # type: ignore[assignment]


def _after(write: Callable[..., None], pattern: str, tick: Callable[[], None]) -> Any:
    def run(folder: Path, *args: Any) -> None:
        write(folder, *args)
        if fnmatch(folder.name, pattern):
            tick()

    return run
