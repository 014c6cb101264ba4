"""The language-model task under torchrun (2 CPU processes over gloo, DDP and FSDP): the same
steps as one process taking both micro-batches of each step (dropout 0), as for translation in
test_distributed.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_lm import lm_config  # the tiny GPT-2 config of the task's tests

from aiayn.checkpoint import load_checkpoint
from aiayn.training.config import run_config_from_dict
from aiayn.training.trainer import Trainer

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32",
    reason="needs torch.distributed with gloo",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["kind"] == "train"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process(tmp_path: Path, strategy: str) -> None:
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat .\nthe dog ran on the rug .\n" * 60)
    config = lm_config(tmp_path / "ddp", text, max_steps=4, log_every=2, threads=1)
    config["model"] = {**config["model"], "dropout": 0.0, "attention_dropout": 0.0}
    config["model"]["embedding_dropout"] = 0.0
    config["train"] = {**config["train"], "distributed": strategy}
    file = tmp_path / "ddp.yaml"
    file.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    cmd += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    cmd += ["-m", "aiayn", "train", "--config", str(file)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"distributed: 2 processes, {strategy.upper()} over gloo" in out.stdout
    assert out.stdout.count("trained 4 steps") == 1  # rank 0 alone reports

    single = {**config, "run_dir": str(tmp_path / "single")}
    single["train"] = {**config["train"], "accum_steps": 2}
    threads = torch.get_num_threads()
    try:
        Trainer(run_config_from_dict(single)).fit()
    finally:
        torch.set_num_threads(threads)
    a = load_checkpoint(tmp_path / "ddp", expect=torch.nn.Module).model.state_dict()
    b = load_checkpoint(tmp_path / "single", expect=torch.nn.Module).model.state_dict()
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    assert _losses(tmp_path / "ddp") == pytest.approx(_losses(tmp_path / "single"), rel=1e-6)
    state = load_checkpoint(tmp_path / "ddp", expect=torch.nn.Module).state
    assert (state["family"], state["world_size"], state["step"]) == ("gpt2", 2, 4)
