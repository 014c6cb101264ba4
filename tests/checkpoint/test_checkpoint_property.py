"""Property: whatever is done to one file of a valid checkpoint — deleted, truncated, a byte
flipped, replaced with a symbolic link (to an identical copy outside the folder, or to
``/dev/zero``) or with a FIFO — or whatever file is added to it, loading it (weights, optimizer
state, tokenizer) either gives exactly the saved tensors or refuses in one line (a
``UserError``). It never hangs (each load runs under an alarm), never reads outside the folder
(a link to an identical copy outside is refused, though its contents would check out), and
never succeeds with other weights."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.config import preset
from aiayn.data import Tokenizer
from aiayn.errors import UserError
from aiayn.models import Transformer

FILES = ("model.safetensors", "optimizer.safetensors", "state.json", "tokenizer.json", "SHA256SUMS")
DAMAGES = ("delete", "truncate", "flip", "link outside", "link /dev/zero", "fifo", "add a file")
TIMEOUT_S = 10


class Hung(Exception):
    """The load did not finish within the alarm."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A tiny checkpoint with optimizer moments, and what it must load as."""
    root = tmp_path_factory.mktemp("prop")
    tokenizer = Tokenizer.train(["a small dog runs", "the cat sleeps"] * 20, 280, min_frequency=1)
    tokenizer.save(root / "tok.json")
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, d_model=16, d_ff=32, num_heads=2)
    model = Transformer(config)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)).sum().backward()
    optimizer.step()
    folder = save_checkpoint(root / "ckpt", model, {"step": 1}, root / "tok.json", optimizer)
    expected = {
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "moments": _moments(optimizer.state_dict()),
        "tokenizer": (folder / "tokenizer.json").read_bytes(),
    }
    return folder, expected


def _moments(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        f"{i}.{k}": v for i, per in state["state"].items() for k, v in per.items() if v.dim() > 0
    }


def _damage(folder: Path, outside: Path, name: str, how: str, data: st.DataObject) -> None:
    file = folder / name
    if how == "add a file":
        added = data.draw(st.sampled_from(["extra.bin", "model.pt", ".hidden", "tuned.json"]))
        (folder / added).write_bytes(b"\x00payload")
        return
    content = file.read_bytes()
    if how == "truncate":
        file.write_bytes(content[: data.draw(st.integers(0, len(content) - 1))])
    elif how == "flip":
        at = data.draw(st.integers(0, len(content) - 1))
        bit = data.draw(st.integers(0, 7))
        file.write_bytes(content[:at] + bytes([content[at] ^ (1 << bit)]) + content[at + 1 :])
    else:
        file.unlink()
        if how == "link outside":
            (outside / name).write_bytes(content)  # identical: only reading it would pass
            file.symlink_to(outside / name)
        elif how == "link /dev/zero":
            file.symlink_to("/dev/zero")
        elif how == "fifo":
            os.mkfifo(file)


def _load(folder: Path) -> dict[str, Any]:
    """Everything a resumed run or a translation reads, under an alarm."""

    def alarm(*_: Any) -> None:
        raise Hung

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(TIMEOUT_S)
    try:
        ckpt = load_checkpoint(folder)
        moments = _moments(ckpt.optimizer_state)
        return {
            "weights": ckpt.model.state_dict(),
            "moments": moments,
            "tokenizer": ckpt.tokenizer_path.read_bytes(),
        }
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("how", DAMAGES)
@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())  # where a truncation or a flipped byte falls
def test_a_damaged_checkpoint_loads_identically_or_is_refused_in_one_line(
    saved: tuple[Path, dict[str, Any]], name: str, how: str, data: st.DataObject
) -> None:
    original, expected = saved
    with tempfile.TemporaryDirectory() as tmp:
        folder, outside = Path(tmp) / "ckpt", Path(tmp) / "elsewhere"
        outside.mkdir()
        shutil.copytree(original, folder)
        _damage(folder, outside, name, how, data)
        try:
            loaded = _load(folder)
        except Hung:
            pytest.fail(f"loading hung after '{how}' of {name}")
        except UserError as error:
            assert "\n" not in str(error) and str(error), repr(error)
            return
    assert not how.startswith("link") and how != "fifo" and how != "add a file", (
        f"'{how}' of {name} was read"
    )
    _assert_loads_as(loaded, expected)


def _assert_loads_as(loaded: dict[str, Any], expected: dict[str, Any]) -> None:
    """The same weights, optimizer moments and tokenizer bytes, key for key."""
    assert loaded["weights"].keys() == expected["weights"].keys()
    for key, tensor in expected["weights"].items():
        assert torch.equal(loaded["weights"][key], tensor), key
    assert loaded["moments"].keys() == expected["moments"].keys()
    for key, tensor in expected["moments"].items():
        assert torch.equal(loaded["moments"][key], tensor), key
    assert loaded["tokenizer"] == expected["tokenizer"]


def test_the_intact_checkpoint_loads(saved: tuple[Path, dict[str, Any]]) -> None:
    folder, expected = saved
    _assert_loads_as(_load(folder), expected)
