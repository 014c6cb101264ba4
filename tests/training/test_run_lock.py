"""One run per run folder: ``aiayn train`` holds an OS lock on ``run_dir/run.lock`` for the
run's life. Three runs started at once into one folder: exactly one trains, the others exit 2
naming its pid, ``metrics.jsonl`` records each step once and the run resumes bit for bit. A run
killed with SIGKILL leaves its lock file, and ``--resume`` then works. A tokenizer without a
checkpoint is no run to resume: it is learnt again.

One driver process imports aiayn once, then forks the runs (as ``test_crash_resume`` does): the
three contenders start together from a pipe, within milliseconds of one another.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from aiayn.checkpoint import MODEL_FILE, OPTIMIZER_FILE
from aiayn.training.config import RunConfig
from aiayn.training.run_folder import LOCK_FILE

CONTENDERS = 3


def _config(tmp: Path, make_run: Callable[..., RunConfig], train: Path) -> Path:
    run = make_run(tmp / "run", train, max_steps=4, save_every=2, log_every=1, threads=1)
    values = run.to_dict()
    values["data"].update(valid_size=10, bleu_sentences=2)
    config = tmp / "run.yaml"
    config.write_text(json.dumps(values))  # JSON is YAML
    return config


def _drive(tmp: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(Path(__file__).parent), *args],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["log"] = out.stdout[-3000:] + out.stderr[-3000:]
    return result


def test_runs_started_together_into_one_folder_train_once_and_resume_bit_for_bit(
    tmp_path: Path, reverse_task: Callable[..., Path], make_run: Callable[..., RunConfig]
) -> None:
    config = _config(tmp_path, make_run, reverse_task(tmp_path, 200, seed=1))
    result = _drive(tmp_path, "together", str(config))
    runs, log = result["runs"], result["log"]
    winners = [r for r in runs if r["status"] == 0]
    assert len(winners) == 1, log
    for loser in (r for r in runs if r is not winners[0]):
        lines = loser["stderr"].splitlines()
        assert loser["status"] == 2 and len(lines) == 1, log
        assert f"is in use by another aiayn train (pid {winners[0]['pid']}, " in lines[0], log
        assert "Traceback" not in loser["stderr"], log
    run_dir = tmp_path / "run"
    entries = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in entries if e["kind"] == "train"]
    assert steps == [1, 2, 3, 4], log
    assert not (run_dir / LOCK_FILE).exists(), log
    # the run resumes bit for bit: 4 steps then 4 more equal 8 steps straight
    result = _drive(tmp_path, "resume", str(config))
    assert result["statuses"] == [0, 0], result["log"]
    _assert_same(tmp_path / "straight", run_dir, "step_00000008")


def test_a_killed_run_leaves_its_lock_file_and_resume_works(
    tmp_path: Path, reverse_task: Callable[..., Path], make_run: Callable[..., RunConfig]
) -> None:
    config = _config(tmp_path, make_run, reverse_task(tmp_path, 200, seed=1))
    result = _drive(tmp_path, "crash", str(config))
    assert result["statuses"][0] == -signal.SIGKILL, result["log"]
    assert result["lock_after_kill"] == f"{result['killed_pid']}\n", result["log"]
    assert result["statuses"][1] == 0, result["log"]
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    assert (tmp_path / "run" / "checkpoints" / "step_00000004").is_dir()


def test_a_tokenizer_without_a_checkpoint_is_learnt_again_on_resume(
    tmp_path: Path, reverse_task: Callable[..., Path], make_run: Callable[..., RunConfig]
) -> None:
    """A failed run's tokenizer (learnt from data since fixed) is no run to resume."""
    from aiayn.training.trainer import Trainer

    run = make_run(tmp_path / "run", reverse_task(tmp_path, 200, seed=1), max_steps=1)
    (tmp_path / "run").mkdir()
    Trainer(make_run(tmp_path / "other", reverse_task(tmp_path, 50, seed=7, reverse=False)))
    stale_vocab = (tmp_path / "other" / "tokenizer.json").read_bytes()
    (tmp_path / "run" / "tokenizer.json").write_bytes(stale_vocab)
    resumed = Trainer(run, resume=True)
    fresh = Trainer(make_run(tmp_path / "fresh", reverse_task(tmp_path, 200, seed=1)))
    learnt = (tmp_path / "run" / "tokenizer.json").read_bytes()
    assert learnt != stale_vocab and learnt == (tmp_path / "fresh" / "tokenizer.json").read_bytes()
    assert resumed.model_config == fresh.model_config


def _assert_same(a: Path, b: Path, step: str) -> None:
    for name in (MODEL_FILE, OPTIMIZER_FILE):
        x = load_file(str(a / "checkpoints" / step / name))
        y = load_file(str(b / "checkpoints" / step / name))
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), f"{name}: {key}"


# -- the driver (run with python -c in a subprocess) --------------------------------------------

DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
from test_run_lock import drive
drive(sys.argv[2], sys.argv[3])
"""


def drive(mode: str, config: str) -> None:
    """Fork the runs of ``mode`` and print what the test checks, as JSON."""
    from aiayn.cli.main import main  # noqa: F401 - imported once, before the forks

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # its first use imports more
    train = ["train", "--config", config, "--run-dir", "run"]
    if mode == "together":
        read, write = os.pipe()
        pids = [
            _fork(train, start=(read, write), stderr=f"contender{i}.err") for i in range(CONTENDERS)
        ]
        os.close(read)
        os.close(write)  # all start now
        runs = [
            {"pid": pid, "status": _status(pid), "stderr": Path(f"contender{i}.err").read_text()}
            for i, pid in enumerate(pids)
        ]
        print(json.dumps({"runs": runs}))
    elif mode == "resume":
        more = ["--set", "train.max_steps=8"]
        straight = _status(_fork([*train[:-1], "straight", *more]))
        resumed = _status(_fork([*train, "--resume", *more]))
        print(json.dumps({"statuses": [straight, resumed]}))
    else:  # crash: killed right after its first checkpoint, then resumed
        killed = _fork(train, kill_after_save=True)
        statuses = [_status(killed)]
        lock = Path("run", LOCK_FILE).read_text()
        statuses.append(_status(_fork([*train, "--resume"])))
        print(json.dumps({"statuses": statuses, "lock_after_kill": lock, "killed_pid": killed}))


def _fork(
    args: list[str],
    *,
    start: tuple[int, int] | None = None,
    stderr: str = "",
    kill_after_save: bool = False,
) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        from aiayn.cli.main import main

        if stderr:
            os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT, 0o644), 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        if start is not None:  # wait until the driver closes the pipe: all start together
            os.close(start[1])
            os.read(start[0], 1)
        if kill_after_save:
            _kill_after_first_save()
        code = main(args)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _kill_after_first_save() -> None:
    import aiayn.training.trainer as trainer

    save = trainer.save_checkpoint

    def save_then_die(*args: Any, **kwargs: Any) -> Any:
        save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    trainer.save_checkpoint = save_then_die  # type: ignore[assignment]


def _status(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
