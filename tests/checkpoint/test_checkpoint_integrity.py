"""Checkpoints are verifiable: every file's SHA-256 is recorded and checked at load, damage of
any kind is a one-line error naming the file, replacing a checkpoint leaves a complete one after
a crash at any point, and a full disk or read-only folder loses nothing. (``--resume`` falling
back past unusable checkpoints: tests/training/test_resume_fallback.py.)"""

from __future__ import annotations

import copy
import errno
import functools
import hashlib
import json
import os
import shutil
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import aiayn.checkpoint.files as ck_files
import aiayn.checkpoint.save as ck_save
from aiayn.checkpoint import (
    CHECKSUM_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    TOKENIZER_FILE,
    CheckpointError,
    average_checkpoints,
    list_checkpoints,
    load_checkpoint,
    load_optimizer,
    prune_checkpoints,
    read_checksums,
    read_optimizer_state,
    record_checksums,
    resolve_checkpoint,
    save_checkpoint,
    tidy_checkpoints,
)
from aiayn.cli.main import main
from aiayn.errors import UserError
from aiayn.models import GPT2, GPT2Config

FIXTURES = Path(__file__).parent / "fixtures"
TOKENIZER = FIXTURES / "format1_tied" / TOKENIZER_FILE


def _model(seed: int, d_model: int = 16) -> GPT2:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=270, max_len=16, d_model=d_model, num_heads=2, num_layers=1, bos_id=1,
        eos_id=2, pad_id=0,
    )  # fmt: skip
    return GPT2(config).eval()


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """Adam after one step (on a copy: ``model`` is left as it is), moments of every
    parameter's shape."""
    model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randint(0, 270, (2, 5))).hidden.sum().backward()
    opt.step()
    return opt


@functools.cache
def _parts(seed: int) -> tuple[GPT2, torch.optim.Optimizer]:
    """The model and optimizer of version ``seed`` (made once: saving changes neither)."""
    model = _model(seed)
    return model, _optimizer(model)


def _save(folder: Path, seed: int = 0, *, optimizer: bool = True) -> GPT2:
    model, opt = _parts(seed)
    save_checkpoint(folder, model, {"step": seed}, TOKENIZER, opt if optimizer else None)
    return model


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(folder, expect=GPT2).model.state_dict()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _flip_byte(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def _one_line(error: pytest.ExceptionInfo[BaseException], file: Path) -> str:
    message = str(error.value)
    assert "\n" not in message and str(file) in message, message
    return message


# -- checksums ---------------------------------------------------------------------------------


def test_a_checkpoint_records_the_sha256_of_every_file(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    _save(folder)
    lines = (folder / CHECKSUM_FILE).read_text().splitlines()
    listed = {line[66:]: line[:64] for line in lines}
    on_disk = {p.name for p in folder.iterdir()} - {CHECKSUM_FILE}
    assert set(listed) == on_disk == {MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_FILE}
    for name, digest in listed.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert json.loads((folder / STATE_FILE).read_text())["checksums"] == CHECKSUM_FILE
    if shutil.which("sha256sum"):  # the standard tool reads the same file
        subprocess.run(["sha256sum", "--quiet", "-c", CHECKSUM_FILE], cwd=folder, check=True)


def test_averaged_and_converted_checkpoints_have_checksums(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _save(tmp_path / "a", 1)
    _save(tmp_path / "b", 2)
    average_checkpoints([tmp_path / "a", tmp_path / "b"], tmp_path / "avg")
    assert (
        main(["convert", "--checkpoint", str(tmp_path / "a"), "--to-hf", str(tmp_path / "hf")]) == 0
    )
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(tmp_path / "conv")]) == 0
    for name in ("avg", "conv"):
        sums = read_checksums(tmp_path / name)
        assert sums is not None and {MODEL_FILE, STATE_FILE, TOKENIZER_FILE} <= set(sums), name
        _flip_byte(tmp_path / name / MODEL_FILE, -1)
        with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt"):
            load_checkpoint(tmp_path / name, expect=GPT2)


@pytest.mark.parametrize("name", [MODEL_FILE, STATE_FILE, TOKENIZER_FILE, OPTIMIZER_FILE])
def test_bit_rot_in_any_file_is_an_error_naming_it(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "ck"
    model = _save(folder)
    file = folder / name
    size = file.stat().st_size
    # the last byte of the weights (a float), a digit in the JSON: still well-formed files
    offset = size - 1 if name.endswith(".safetensors") else file.read_text().index("16")
    _flip_byte(file, offset)
    with pytest.raises(CheckpointError) as error:
        ckpt = load_checkpoint(folder, expect=GPT2)
        load_optimizer(folder, _optimizer(_model(0)), ckpt.state)
    assert f"{name}: corrupt: its SHA-256 differs" in _one_line(error, file)
    if name == MODEL_FILE:  # without the checksums the damage would load silently
        (folder / CHECKSUM_FILE).unlink()
        state = json.loads((folder / STATE_FILE).read_text())
        del state["checksums"]
        (folder / STATE_FILE).write_text(json.dumps(state))
        assert not _same(_weights(folder), model.state_dict())


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _empty(file: Path) -> None:
    file.write_bytes(b"")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "empty": _empty,
    "missing": Path.unlink,
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("name", [MODEL_FILE, STATE_FILE, OPTIMIZER_FILE])
@pytest.mark.parametrize("checked", [True, False], ids=["with-sums", "old-format"])
def test_damaged_files_are_one_line_errors_naming_them(
    tmp_path: Path, name: str, damage: str, checked: bool
) -> None:
    folder = tmp_path / "ck"
    _save(folder)
    if not checked:  # as written before checksums
        (folder / CHECKSUM_FILE).unlink()
        state = json.loads((folder / STATE_FILE).read_text())
        del state["checksums"]
        (folder / STATE_FILE).write_text(json.dumps(state))
    DAMAGE[damage](folder / name)
    with pytest.raises(UserError) as error:
        if name == OPTIMIZER_FILE:
            read_optimizer_state(folder, load_checkpoint(folder, expect=GPT2).state)
        else:
            load_checkpoint(folder, expect=GPT2)
    message = _one_line(error, folder)
    assert name in message or (name == STATE_FILE and damage == "missing"), message


def test_damaged_checksum_lists_are_errors(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    _save(folder)
    sums = folder / CHECKSUM_FILE
    sums.write_text(sums.read_text()[:100])
    with pytest.raises(CheckpointError, match=r"SHA256SUMS: line 2 is not"):
        load_checkpoint(folder, expect=GPT2)
    sums.write_text("")  # cut to nothing: state.json is no longer listed
    with pytest.raises(CheckpointError, match=r"state.json: not listed in SHA256SUMS"):
        load_checkpoint(folder, expect=GPT2)
    sums.unlink()  # state.json says there are checksums
    with pytest.raises(CheckpointError, match=r"SHA256SUMS: missing"):
        load_checkpoint(folder, expect=GPT2)


def test_an_edit_by_hand_is_accepted_by_recording_the_checksums_again(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    _save(folder)
    state = json.loads((folder / STATE_FILE).read_text())
    (folder / STATE_FILE).write_text(json.dumps({**state, "note": "edited"}))
    with pytest.raises(CheckpointError, match=r"state\.json: corrupt"):
        load_checkpoint(folder, expect=GPT2)
    assert record_checksums(folder) == folder / CHECKSUM_FILE
    assert load_checkpoint(folder, expect=GPT2).state["note"] == "edited"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [CHECKSUM_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_FILE]
    )


def test_wrong_shapes_are_errors_naming_the_file(tmp_path: Path) -> None:
    _save(tmp_path / "small")
    big = _model(0, d_model=32)
    save_checkpoint(tmp_path / "big", big, {}, TOKENIZER, _optimizer(big))
    folder = tmp_path / "small"
    for name in (MODEL_FILE, OPTIMIZER_FILE):  # the other model's files, sums and all
        shutil.copyfile(tmp_path / "big" / name, folder / name)
    (folder / CHECKSUM_FILE).unlink()
    state = json.loads((folder / STATE_FILE).read_text())
    del state["checksums"]
    (folder / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="weights do not fit the model") as error:
        load_checkpoint(folder, expect=GPT2)
    _one_line(error, folder / MODEL_FILE)
    with pytest.raises(CheckpointError, match=r"has shape \[\d+, 32\], its parameter \[\d+, 16\]"):
        load_optimizer(folder, _optimizer(_model(0)), state)


def test_bad_json_in_state_is_an_error_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    shutil.copytree(FIXTURES / "format1_tied", folder)
    (folder / STATE_FILE).write_text('{"model_config": ')
    with pytest.raises(CheckpointError, match=r"state.json: not valid JSON") as error:
        load_checkpoint(folder)
    _one_line(error, folder / STATE_FILE)


@pytest.mark.parametrize("name", ["format1_tied", "format1_untied_learned"])
def test_old_checkpoints_without_checksums_load_without_a_warning(name: str) -> None:
    assert not (FIXTURES / name / CHECKSUM_FILE).exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_checkpoint(FIXTURES / name).family == "transformer"


# -- replacing a checkpoint: a crash at any point ----------------------------------------------


class Crash(BaseException):
    """Stands for kill -9: nothing after it runs (no except clause catches it)."""


@pytest.fixture
def crash_after(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], list[str]]:
    """``crash_after(k)``: make the k-th file-system step of a save (each file written, synced
    folder, rename, deletion) raise :class:`Crash` once done; a deletion crashes half-way.
    Returns the log of the steps taken."""

    def arm(k: int) -> list[str]:
        steps: list[str] = []

        def step(name: str) -> None:
            steps.append(name)
            if len(steps) == k:
                raise Crash(name)

        def wrap(name: str, real: Callable[..., Any], where: int = 0) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                result = real(*args, **kwargs)
                step(f"{name} {Path(args[where]).name}")
                return result

            return run

        def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
            if len(steps) + 1 == k:  # half-way: one file gone, then the crash
                next(p for p in Path(path).iterdir() if p.is_file()).unlink()
                step(f"rmtree {Path(path).name} (half)")
            real_rmtree(path, *args, **kwargs)
            step(f"rmtree {Path(path).name}")

        for name in ("_write_model", "write_optimizer", "_write_state", "write_tokenizer"):
            monkeypatch.setattr(ck_save, name, wrap(name, getattr(ck_save, name)))
        monkeypatch.setattr(ck_save, "write_checksums", wrap("checksums", ck_save.write_checksums))
        monkeypatch.setattr(ck_files, "sync_dir", wrap("sync", ck_files.sync_dir))
        monkeypatch.setattr(ck_files.os, "rename", wrap("rename", os.rename, where=1))
        monkeypatch.setattr(ck_files.shutil, "rmtree", rmtree)
        return steps

    real_rmtree = shutil.rmtree
    return arm


def test_a_crash_at_any_point_of_a_replacement_leaves_a_complete_checkpoint(
    tmp_path: Path, crash_after: Callable[[int], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replace ``best`` (v1 -> v2), crashing after each step in turn: ``best`` always loads
    (v1 or v2, every file checked), and the next save (v3) cleans up everything."""
    versions = {seed: _model(seed).state_dict() for seed in (1, 2, 3)}
    k, seen = 0, []
    while True:
        k += 1
        best = tmp_path / str(k) / "best"
        _save(best, 1)
        steps = crash_after(k)
        try:
            _save(best, 2)
        except Crash:
            pass
        else:
            break
        finally:
            monkeypatch.undo()
        loaded = _weights(best)
        got = 1 if _same(loaded, versions[1]) else 2 if _same(loaded, versions[2]) else None
        assert got is not None, f"crash after {steps[-1]}: best holds neither version"
        seen.append((steps[-1], got))
        _save(best, 3)
        assert sorted(p.name for p in best.parent.iterdir()) == ["best"], steps[-1]
        assert _same(_weights(best), versions[3])
    names = [name for name, _ in seen]
    assert "rename best" in names and "rename best.old" in names, names  # both renames crossed
    assert any("(half)" in name for name in names), names
    assert [v for _, v in seen] == sorted(v for _, v in seen), seen  # v1 until the commit


def test_leftovers_are_ignored_by_readers_and_tidied_up(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    _save(root / "step_00000002", 2)
    _save(root / "step_00000004", 4)
    os.rename(root / "step_00000004", root / "step_00000004.old")  # crash between the renames
    (root / "step_00000006.tmp").mkdir()  # crash while writing
    (root / "step_00000006.tmp" / MODEL_FILE).write_bytes(b"half")
    _save(root / "best", 4)
    os.rename(root / "best", root / "best.old")
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == [
        "step_00000002",
        "step_00000004.old",
    ]
    assert resolve_checkpoint(root / "best") == root / "best.old"
    assert resolve_checkpoint(tmp_path / "run") == root / "step_00000004.old"
    tidy_checkpoints(root)
    assert sorted(p.name for p in root.iterdir()) == ["best", "step_00000002", "step_00000004"]
    assert _same(_weights(root / "best"), _model(4).state_dict())


def test_a_folder_in_the_way_that_is_not_a_checkpoint_is_never_deleted(tmp_path: Path) -> None:
    mine = tmp_path / "out.tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"out\.tmp is in the way and is not an aiayn checkpoint"):
        _save(tmp_path / "out")
    assert (mine / "notes.txt").read_text() == "mine"


def test_pruning_removes_each_checkpoint_at_once(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    for step in (2, 4, 6):
        _save(root / f"step_{step:08d}", step, optimizer=False)
    prune_checkpoints(tmp_path / "run", 1)
    assert sorted(p.name for p in root.iterdir()) == ["step_00000006"]


# -- a full disk, a read-only folder -----------------------------------------------------------


def _no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture(params=["_write_model", "write_optimizer", "_write_state", "write_checksums"])
def full_disk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The disk fills up while one of the checkpoint's files is written."""
    monkeypatch.setattr(ck_save, request.param, _no_space)
    yield


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.usefixtures("full_disk")
def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path: Path) -> None:
    """Neither a new checkpoint nor the replacement of one (``best``) leaves anything behind."""
    root = tmp_path / "checkpoints"
    shutil.copytree(FIXTURES / "format1_tied", root / "best")
    before = _listing(root)
    for name in ("step_00000002", "best"):
        with pytest.raises(UserError) as error:
            _save(root / name, 2)
        message = _one_line(error, root / name)
        assert "No space left on device" in message and "nothing was replaced" in message
    assert _listing(root) == before
    assert load_checkpoint(root / "best").state == load_checkpoint(FIXTURES / "format1_tied").state


def test_a_failed_rename_puts_the_old_checkpoint_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    best = tmp_path / "best"
    _save(best, 1)
    calls: list[str] = []
    real = os.rename

    def rename(src: Any, dst: Any) -> None:
        calls.append(Path(dst).name)
        if len(calls) == 2:  # the new folder into place
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        real(src, dst)

    monkeypatch.setattr(ck_files.os, "rename", rename)
    with pytest.raises(UserError, match="Input/output error"):
        _save(best, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    assert _same(_weights(best), _model(1).state_dict())


def test_the_cli_reports_a_full_disk_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _save(tmp_path / "a", 1)
    _save(tmp_path / "b", 2)
    monkeypatch.setattr(ck_save, "_write_model", _no_space)
    out = tmp_path / "avg"
    code = main(["average", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and "No space left on device" in error, error
    assert not out.exists() and not (tmp_path / "avg.tmp").exists()


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root writes into read-only folders: the permission check cannot fail",
)
def test_a_read_only_folder_is_one_line_and_loses_nothing(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save(root / "best", 1)
    before = _listing(root)
    root.chmod(0o555)
    try:
        for name in ("step_00000002", "best"):
            with pytest.raises(UserError, match="Permission denied") as error:
                _save(root / name, 2)
            _one_line(error, root / name)
    finally:
        root.chmod(0o755)
    assert _listing(root) == before
    assert _same(_weights(root / "best"), _model(1).state_dict())
