"""Data-parallel training under torchrun (2 CPU processes, gloo on the loopback interface).

Each launch is the real command line, ``python -m torch.distributed.run --nproc-per-node 2 -m
aiayn train --config ...``, bounded in time. The runs are shared by the tests of this module:

* 2 ranks x 1 micro-batch == 1 process x 2 micro-batches (DDP and FSDP; dropout 0),
* stop after 4 steps + resume to 8 == 8 steps straight (dropout on: per-rank RNG restored),
  also when the resumed run shards with FSDP,
* only rank 0 writes and prints; resuming with another world size is refused.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.errors import UserError
from aiayn.training.config import run_config_from_dict
from aiayn.training.trainer import Trainer

LAUNCH_TIMEOUT_S = 240
pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32",
    reason="needs torch.distributed with gloo",
)


def _config(run_dir: Path, train: Path, *, dropout: float, **train_cfg: Any) -> dict[str, Any]:
    return {
        "run_dir": str(run_dir),
        "model": {"preset": "tiny", "d_model": 32, "d_ff": 64, "num_heads": 4, "dropout": dropout},
        "data": {
            "train_src": str(train),
            "vocab_size": 300,
            "min_frequency": 1,
            "valid_size": 20,
            "bleu_sentences": 4,
        },
        "train": {
            "max_tokens": 300,
            "warmup_steps": 20,
            "lr_scale": 0.5,
            "eval_every": 0,
            "save_every": 0,
            "log_every": 2,
            "keep_last": 10,
            "progress": False,
            "threads": 1,
            "seed": 3,
            **train_cfg,
        },
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    return env


def _launch(
    config: dict[str, Any], *extra: str, nproc: int = 2, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node nproc -m aiayn train`` (plain ``-m aiayn`` for 1)."""
    folder = Path(config["run_dir"]).parent
    file = folder / f"{Path(config['run_dir']).name}.yaml"
    file.write_text(yaml.safe_dump(config), encoding="utf-8")
    head = [sys.executable, "-m"]
    if nproc > 1:
        head += ["torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1"]
        head += [f"--master-port={_free_port()}", "-m"]
    cmd = [*head, "aiayn", "train", "--config", str(file), *extra]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=_env(), timeout=LAUNCH_TIMEOUT_S, check=False
    )
    if check and out.returncode != 0:
        raise AssertionError(f"{cmd} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir).model.state_dict()


def _adam_moments(run_dir: Path) -> dict[str, torch.Tensor]:
    """Adam's moments: unlike the weights, they scale with the gradient (Adam's steps do not)."""
    return load_file(str(list_checkpoints(run_dir)[-1] / "optimizer.safetensors"))


def _train_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["kind"] == "train"]


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, worst


def _write_task(path: Path, n: int) -> Path:
    rng = random.Random(7)
    lines = []
    for _ in range(n):
        words = [rng.choice("abcdefghij") for _ in range(rng.randint(3, 7))]
        lines.append(f"{' '.join(words)}\t{' '.join(words[::-1])}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every launch of this module, once."""
    root = tmp_path_factory.mktemp("dist")
    train = _write_task(root / "train.tsv", 800)  # 16 batches of <= 300 tokens: one epoch
    r: dict[str, Any] = {"root": root, "train": train}

    # parity: dropout 0, 6 steps; one process takes both batches of a step
    r["single"] = _config(root / "single", train, dropout=0.0, max_steps=6, accum_steps=2)
    r["ddp6"] = _config(root / "ddp6", train, dropout=0.0, max_steps=6)
    r["fsdp6"] = _config(root / "fsdp6", train, dropout=0.0, max_steps=6, distributed="fsdp")
    # resume: dropout on; 8 straight vs 4 + 4 (DDP, and FSDP from the same 4-step checkpoint)
    r["ddp8"] = _config(root / "ddp8", train, dropout=0.1, max_steps=8, save_every=4)
    first = _config(root / "ddp4", train, dropout=0.1, max_steps=4, save_every=4)
    for name in ("ddp6", "fsdp6", "ddp8"):
        r[f"{name}_out"] = _launch(r[name])
    _launch(first)
    for name in ("fsdp_resumed", "other_world"):
        shutil.copytree(root / "ddp4", root / name)
    r["ddp_resumed"] = {**first, "train": {**first["train"], "max_steps": 8}}
    r["fsdp_resumed"] = {
        **r["ddp_resumed"],
        "run_dir": str(root / "fsdp_resumed"),
        "train": {**r["ddp_resumed"]["train"], "distributed": "fsdp"},
    }
    r["other_world"] = {**r["ddp_resumed"], "run_dir": str(root / "other_world")}
    r["ddp_resumed_out"] = _launch(r["ddp_resumed"], "--resume")
    r["fsdp_resumed_out"] = _launch(r["fsdp_resumed"], "--resume")
    return r


def _single_process(config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The one-process reference, in this process (threads restored afterwards)."""
    threads = torch.get_num_threads()
    try:
        trainer = Trainer(run_config_from_dict(config))
        trainer.fit()
    finally:
        torch.set_num_threads(threads)
    return _weights(Path(config["run_dir"]))


def test_two_ranks_equal_one_process_on_the_same_global_batches(runs: dict[str, Any]) -> None:
    reference = _single_process(runs["single"])
    single_dir = Path(runs["single"]["run_dir"])
    for name in ("ddp6", "fsdp6"):
        run_dir = Path(runs[name]["run_dir"])
        _assert_close(_weights(run_dir), reference, atol=1e-6)
        # the gradient itself (normalised by the global target tokens), seen through Adam
        moments, expected = _adam_moments(run_dir), _adam_moments(single_dir)
        assert moments.keys() == expected.keys()
        for key in moments:
            torch.testing.assert_close(moments[key], expected[key], rtol=1e-5, atol=1e-9)
        # the logged loss is the global batch's
        assert _train_losses(run_dir) == pytest.approx(_train_losses(single_dir), rel=1e-6)
    state = load_checkpoint(runs["ddp6"]["run_dir"]).state
    assert (state["step"], state["world_size"], state["batch_index"]) == (6, 2, 12)
    assert len(state["rng_per_rank"]) == 2


def test_resume_under_two_ranks_continues_exactly(runs: dict[str, Any]) -> None:
    straight = _weights(Path(runs["ddp8"]["run_dir"]))
    resumed = _weights(Path(runs["ddp_resumed"]["run_dir"]))
    assert "resume: from step_00000004 at step 4" in runs["ddp_resumed_out"].stdout
    _assert_close(resumed, straight, atol=0.0)  # bit for bit
    sa = load_checkpoint(runs["ddp8"]["run_dir"]).state
    sb = load_checkpoint(runs["ddp_resumed"]["run_dir"]).state
    assert (sa["epoch"], sa["batch_index"]) == (sb["epoch"], sb["batch_index"]) == (0, 16)
    assert sa["rng_per_rank"] == sb["rng_per_rank"]
    # switching to FSDP at the same world size continues the same run (up to rounding)
    _assert_close(_weights(Path(runs["fsdp_resumed"]["run_dir"])), straight, atol=1e-6)


def test_only_rank_zero_writes_and_prints(runs: dict[str, Any]) -> None:
    run_dir = Path(runs["ddp8"]["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in lines if e["kind"] == "train"] == [2, 4, 6, 8]
    assert [e["step"] for e in lines if e["kind"] == "valid"] == [8]
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_00000004", "step_00000008"]
    out = runs["ddp8_out"].stdout
    assert out.count("model: ") == 1 and out.count("trained 8 steps") == 1, out
    assert "distributed: 2 processes, DDP over gloo" in out
    assert "distributed: 2 processes, FSDP over gloo" in runs["fsdp6_out"].stdout


def test_resume_with_another_world_size_is_refused(runs: dict[str, Any]) -> None:
    config = runs["other_world"]
    with pytest.raises(UserError, match=r"run of 2 process\(es\) but this run has 1"):
        Trainer(run_config_from_dict(config), resume=True)
    out = _launch(config, "--resume", nproc=1, check=False)  # the CLI: a message, no traceback
    assert out.returncode == 2, out.stderr
    assert "aiayn train: error:" in out.stderr and "another world size" in out.stderr
    assert "Traceback" not in out.stderr
