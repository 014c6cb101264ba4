"""``--resume`` falls back past unusable checkpoints: a checkpoint with a corrupt or damaged
file is set aside as ``NAME.corrupt`` with a warning naming the file and the run resumes from
the newest intact one; with none intact, or ranks that disagree, it is an error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.checkpoint import MODEL_FILE, OPTIMIZER_FILE, list_checkpoints
from aiayn.errors import UserError
from aiayn.training.config import RunConfig, run_config_from_dict
from aiayn.training.trainer import Trainer


def _flip_byte(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def six_steps(
    tmp_path: Path, reverse_task: Callable[..., Path], make_run: Callable[..., RunConfig]
) -> Iterator[Callable[[], RunConfig]]:
    """A run of 6 steps that saves every 2, trained once (step_2, step_4, step_6); one thread
    (the trainer sets it for the process: restored after)."""
    train = reverse_task(tmp_path, 200, seed=1)

    def run() -> RunConfig:
        short = {"positional": "learned", "max_len": 24}  # a cheap validation
        config = make_run(tmp_path / "r", train, model=short, max_steps=6, save_every=2)
        values = config.to_dict()
        values["data"].update(valid_size=5, bleu_sentences=2)
        values["train"].update(threads=1)
        return run_config_from_dict(values)

    threads = torch.get_num_threads()
    try:
        Trainer(run()).fit()
        yield run
    finally:
        torch.set_num_threads(threads)


def test_resume_falls_back_past_unusable_checkpoints_with_a_warning(
    tmp_path: Path, six_steps: Callable[[], RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "r" / "checkpoints"
    straight = load_file(str(root / "step_00000006" / MODEL_FILE))
    _flip_byte(root / "step_00000006" / OPTIMIZER_FILE, -1)  # bit rot in the optimizer
    (root / "step_00000004" / MODEL_FILE).write_bytes(b"")  # empty weights
    lines: list[str] = []
    monkeypatch.setattr("aiayn.training.trainer.log", lines.append)
    trainer = Trainer(six_steps(), resume=True)
    assert trainer.step == 2
    warnings = [line for line in lines if "warning" in line]
    assert len(warnings) == 2, lines
    assert "step_00000006 is unusable" in warnings[0]
    assert "step_00000006/optimizer.safetensors: corrupt" in warnings[0]
    assert "step_00000004/model.safetensors: corrupt" in warnings[1]
    assert "resuming from step_00000002" in warnings[1]
    assert "kept as step_00000004.corrupt" in warnings[1]
    trainer.fit()  # steps 3-6 again, into fresh step_4 and step_6
    assert [p.name for p in list_checkpoints(tmp_path / "r")] == [
        "step_00000002",
        "step_00000004",
        "step_00000006",
    ]
    assert {"step_00000004.corrupt", "step_00000006.corrupt"} <= {p.name for p in root.iterdir()}
    again = load_file(str(root / "step_00000006" / MODEL_FILE))
    assert all(torch.equal(straight[k], again[k]) for k in straight)


def test_resume_with_no_intact_checkpoint_is_an_error_listing_each(
    tmp_path: Path, six_steps: Callable[[], RunConfig]
) -> None:
    root = tmp_path / "r" / "checkpoints"
    for step in (2, 4, 6):
        _truncate(root / f"step_{step:08d}" / MODEL_FILE)
    before = _listing(root)
    with pytest.raises(UserError, match="no intact checkpoint to resume from") as error:
        Trainer(six_steps(), resume=True)
    message = str(error.value)
    assert "\n" not in message and message.count("model.safetensors: corrupt") == 3
    assert _listing(root) == before  # nothing set aside when nothing can be resumed


def test_ranks_that_find_different_intact_checkpoints_are_refused(
    six_steps: Callable[[], RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []

    def gather(obj: object) -> list[object]:  # the 2nd gather: which checkpoint is intact
        calls.append(obj)
        return [obj, "step_00000004" if len(calls) == 2 else obj]

    monkeypatch.setattr("aiayn.training.trainer.dist.all_gather_object", gather)
    with pytest.raises(UserError, match="the ranks find different intact checkpoints"):
        Trainer(six_steps(), resume=True)
