"""aiayn.cli.outputs: the checks before any work (existing outputs, --force, writability) and the
atomic writes (a failure — a full disk simulated — leaves the old output whole and no temporary
behind; new files get the umask's mode), and ``aiayn experiment`` using them."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli import outputs
from aiayn.cli.main import describe_os_error, main, one_line
from aiayn.errors import UserError

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*"))


def _full_disk(*args: Any) -> None:
    raise NO_SPACE


# -- atomic_file / write_text ------------------------------------------------------------------


def test_write_text_creates_with_the_umask_and_replaces_keeping_the_mode(
    tmp_path: Path, umask_027: None
) -> None:
    new = outputs.write_text(tmp_path / "a" / "b.txt", "héllo\n")
    assert new.read_bytes() == "héllo\n".encode()
    assert new.stat().st_mode & 0o777 == 0o640  # 0o666 & ~0o027, not mkstemp's 0o600
    new.chmod(0o604)
    outputs.write_text(new, "second\n")
    assert new.read_text() == "second\n" and new.stat().st_mode & 0o777 == 0o604
    assert _hidden(tmp_path) == []


def test_a_full_disk_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    monkeypatch.setattr("aiayn.cli.outputs.os.fsync", _full_disk)  # as a delayed ENOSPC does
    with pytest.raises(UserError, match=f"^cannot write {target}: No space left on device$"):
        outputs.write_text(target, "new\n" * 1000)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_failure_in_the_writer_is_not_disguised_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deeper" / "x.npy"
    with pytest.raises(RuntimeError, match="boom"), outputs.atomic_file(target, "wb") as handle:
        handle.write(b"half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []  # the folders made for it are gone too


def test_a_read_error_inside_the_block_keeps_its_own_path(tmp_path: Path) -> None:
    missing = tmp_path / "input.txt"
    with pytest.raises(FileNotFoundError) as info, outputs.atomic_file(tmp_path / "o.txt"):
        missing.read_text()
    assert info.value.filename == str(missing)
    assert list(tmp_path.iterdir()) == []


# -- staged_files / staged_tree ------------------------------------------------------------------


def test_staged_files_appear_together_and_leave_other_files(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    (tmp_path / "a.png").write_text("old")
    with outputs.staged_files(tmp_path) as stage:
        (stage / "a.png").write_text("new")
        (stage / "b.html").write_text("page")
        assert not (tmp_path / "b.html").exists()
    assert (tmp_path / "a.png").read_text() == "new" and (tmp_path / "b.html").is_file()
    assert (tmp_path / "keep.txt").read_text() == "mine" and _hidden(tmp_path) == []


def test_staged_files_on_a_full_disk_change_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_text("old")
    with pytest.raises(UserError, match=f"cannot write {tmp_path}: No space left"):  # noqa: SIM117
        with outputs.staged_files(tmp_path) as stage:
            (stage / "a.png").write_text("new")
            raise OSError(errno.ENOSPC, "No space left on device", str(stage / "b.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]
    assert (tmp_path / "a.png").read_text() == "old"
    fresh = tmp_path / "made" / "for" / "it"
    with pytest.raises(UserError), outputs.staged_files(fresh):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not (tmp_path / "made").exists()


def test_staged_tree_replaces_a_folder_only_when_complete(tmp_path: Path) -> None:
    old = tmp_path / "ckpt"
    old.mkdir()
    (old / "state.json").write_text("old")
    with pytest.raises(UserError, match="No space left"), outputs.staged_tree(old) as new:
        new.mkdir()
        (new / "state.json").write_text("half")
        raise NO_SPACE
    assert (old / "state.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    with outputs.staged_tree(old) as new:
        new.mkdir()
        (new / "state.json").write_text("new")
        assert (old / "state.json").read_text() == "old"
    assert sorted(p.name for p in old.iterdir()) == ["state.json"]
    assert (old / "state.json").read_text() == "new" and _hidden(tmp_path) == []


# -- the checks ----------------------------------------------------------------------------------


def test_check_file(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    assert outputs.check_file(tmp_path / "new" / "g.txt", force=False, flag="-o")
    assert outputs.check_file(tmp_path / "f.txt", force=True, flag="-o")
    with pytest.raises(UserError, match=r"f\.txt exists: pass --force to replace it$"):
        outputs.check_file(tmp_path / "f.txt", force=False, flag="-o")
    with pytest.raises(UserError, match="is a folder: give a file name"):
        outputs.check_file(tmp_path, force=True, flag="-o")
    with pytest.raises(UserError, match=r"f\.txt is not a folder"):
        outputs.check_file(tmp_path / "f.txt" / "g.txt", force=True, flag="-o")
    assert list(tmp_path.iterdir()) == [tmp_path / "f.txt"]  # checking writes nothing


def test_a_read_only_folder_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aiayn.cli.outputs.os.access", lambda *args, **kwargs: False)
    with pytest.raises(UserError, match=f"-o {tmp_path}/a/b.txt: cannot write in {tmp_path} "):
        outputs.check_file(tmp_path / "a" / "b.txt", force=False, flag="-o")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes regardless of permissions")
def test_a_read_only_folder_for_real(tmp_path: Path) -> None:
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(UserError, match=r"cannot write in .* \(permission denied\)"):
            outputs.check_folder(tmp_path / "maps", force=False, flag="--out")
    finally:
        tmp_path.chmod(0o755)


def test_check_folder_refuses_only_the_files_it_would_write(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    kwargs: dict[str, Any] = {"flag": "--out", "names": ["a.html"], "patterns": ["x_*.png"]}
    assert outputs.check_folder(tmp_path, force=False, **kwargs) == tmp_path
    (tmp_path / "x_1.png").write_text("")
    with pytest.raises(UserError, match=r"already holds x_1\.png: pass --force"):
        outputs.check_folder(tmp_path, force=False, **kwargs)
    assert outputs.check_folder(tmp_path, force=True, **kwargs) == tmp_path
    (tmp_path / "a.html").mkdir()
    with pytest.raises(UserError, match="is a folder where a file goes"):
        outputs.check_folder(tmp_path, force=True, **kwargs)
    with pytest.raises(UserError, match="exists and is not a folder"):
        outputs.check_folder(tmp_path / "notes.txt", force=True, **kwargs)


def test_force_replaces_a_checkpoint_or_an_empty_folder_never_another(tmp_path: Path) -> None:
    def check(path: Path, force: bool = True) -> Path:
        return outputs.check_checkpoint_out(path, force=force, flag="--out")

    ckpt, empty, other = tmp_path / "ckpt", tmp_path / "empty", tmp_path / "home"
    for folder in (ckpt, empty, other):
        folder.mkdir()
    (ckpt / "state.json").write_text("{}")
    (other / "thesis.tex").write_text("years of work")
    assert check(ckpt) == ckpt and check(empty) == empty and check(tmp_path / "new", False)
    with pytest.raises(UserError, match="is a folder that is not an aiayn checkpoint"):
        check(other)
    with pytest.raises(UserError, match="is a file, not an aiayn checkpoint"):
        check(other / "thesis.tex")
    with pytest.raises(UserError, match=r"ckpt exists: pass --force"):
        check(ckpt, force=False)
    run = tmp_path / "run" / "checkpoints"
    for name in ("step_00000100", "best", "averaged"):
        with pytest.raises(UserError, match="training gives its own checkpoints"):
            check(run / name, force=False)
        assert check(run / name) == run / name
    assert check(run / "mine", force=False) == run / "mine"


# -- the main entry's messages -------------------------------------------------------------------


def test_messages_of_the_main_entry() -> None:
    assert one_line("a\n  b:\n   ^\n\nc") == "a b: c"
    assert describe_os_error(PermissionError(errno.EACCES, "Permission denied", "x")) == (
        "x: Permission denied"
    )
    rename = OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b")
    assert describe_os_error(rename) == "a -> b: Invalid cross-device link"
    assert describe_os_error(OSError(errno.EROFS, "Read-only file system")) == (
        "Read-only file system"
    )
    assert describe_os_error(OSError(errno.EBADF, "Bad file descriptor")) is None


# -- aiayn experiment ----------------------------------------------------------------------------


def test_experiment_refuses_its_own_files_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["experiment", "positional", "--quick", "--out", str(tmp_path)]
    (tmp_path / "positional.csv").write_text("mine")
    (tmp_path / "scaling.md").write_text("another experiment's")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"aiayn experiment: error: --out {tmp_path} already holds positional.csv: pass --force "
        "to replace them, or choose another folder\n"
    )
    assert (tmp_path / "positional.csv").read_text() == "mine"
    monkeypatch.setattr("aiayn.cli.outputs.os.replace", _full_disk)
    assert main([*argv, "--force"]) == 2
    assert capsys.readouterr().err == (
        f"aiayn experiment: error: cannot write {tmp_path}: No space left on device\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["positional.csv", "scaling.md"]
    monkeypatch.undo()
    assert main([*argv, "--force"]) == 0
    assert f"plot: {tmp_path / 'positional.png'}" in capsys.readouterr().out
    assert (tmp_path / "positional.csv").read_text().startswith("distance,")
    assert (tmp_path / "scaling.md").read_text() == "another experiment's"
    assert _hidden(tmp_path) == []
