"""What rank 0 alone does (write checkpoints, metrics, the tokenizer; validate) can fail: every
rank must then stop with it and say why in one line. Before, the other ranks learnt of it only in
their next collective: with gloo they crashed there with a "connection closed" traceback that
called itself a bug in aiayn once rank 0's process had gone (what the second test saw, exit 1),
and a collective that does not notice a lost peer would wait for the group's timeout (60
minutes). Launched as a scheduler such as SLURM's ``srun`` launches a job: one plain process per
rank with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set, and no torchrun agent
to stop the other ranks.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from test_distributed import _config, _env, _free_port, _write_task

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or sys.platform == "win32",
    reason="needs torch.distributed with gloo",
)

TIMEOUT_S = 120  # far below the group's 60 minutes: a rank left waiting fails the test


def _launch_ranks(args: list[str], *, file_size_limit: int | None = None) -> list[dict[str, str]]:
    """Start ``python ARGS`` once per rank (2 ranks), as a plain launcher does; each rank's
    return code, stdout and stderr. ``file_size_limit``: RLIMIT_FSIZE in bytes (a write past it
    fails with EFBIG, as on a full disk; Python ignores SIGXFSZ)."""

    def limit() -> None:
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=limit,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            results.append({"rc": str(proc.returncode), "out": out, "err": err})
    finally:
        for proc in procs:
            proc.kill()
    return results


ON_MAIN = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta
    import torch.distributed as td
    from aiayn.errors import UserError
    from aiayn.training import distributed as dist

    td.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = td.get_rank()

    def fail(error):
        def work():
            raise error
        return work

    seen = {"value": dist.on_main(lambda: 7)}
    for name, error in (("user", UserError("cannot write x")), ("bug", ValueError("boom"))):
        try:
            dist.on_main(fail(error))
            seen[name] = None
        except BaseException as raised:
            seen[name] = [type(raised).__name__, str(raised)]
    td.destroy_process_group()
    print(json.dumps(seen))
    """
)


def test_every_rank_learns_what_rank_zero_did() -> None:
    ranks = [json.loads(r["out"]) for r in _launch_ranks(["-c", ON_MAIN])]
    assert ranks[0] == {
        "value": 7,
        "user": ["RankZeroFailed", "cannot write x"],
        "bug": ["ValueError", "boom"],  # rank 0 keeps its own exception (and traceback)
    }
    assert ranks[1] == {
        "value": None,
        "user": ["RankZeroFailed", "rank 0 stopped: cannot write x"],
        "bug": ["RuntimeError", "rank 0 failed (boom); see its error above"],
    }


def test_a_checkpoint_rank_zero_cannot_write_stops_every_rank(tmp_path: Path) -> None:
    """A full disk at the first checkpoint (step 2): both ranks print one line and exit 2,
    nothing half-written (nor the run folder it created) is left, and rank 1 says that rank 0
    stopped the run."""
    train = _write_task(tmp_path / "train.tsv", 400)
    config = _config(tmp_path / "run", train, dropout=0.0, max_steps=4, save_every=2)
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump(config), encoding="utf-8")
    # the tokenizer (~10 KB) fits, the weights (~200 KB) do not
    ranks = _launch_ranks(["-m", "aiayn", "train", "--config", str(file)], file_size_limit=65536)
    for rank in ranks:
        assert rank["rc"] == "2", rank
        assert "Traceback" not in rank["err"], rank["err"]
    lines = [rank["err"].strip().splitlines()[-1] for rank in ranks]
    assert lines[0].startswith("aiayn train: error: cannot write the checkpoint"), lines[0]
    assert "step_00000002" in lines[0]
    assert lines[1].startswith("aiayn train: error: rank 0 stopped: cannot write the checkpoint")
    # it failed before its first checkpoint: what the run created (its tokenizer, the
    # checkpoints folder, the lock) is removed, so a later run starts clean; the folder itself
    # stays when rank 1 made it before rank 0 could
    left = tmp_path / "run"
    assert not left.exists() or not any(left.iterdir()), sorted(left.rglob("*"))
