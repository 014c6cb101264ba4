"""A run folder belongs to one run: ``--resume`` refuses a changed config (but the options of
RESUMABLE), a fresh run refuses a folder holding a run unless ``--force`` deletes it first, and
``metrics.jsonl`` records each step once across resumes."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from aiayn.checkpoint import list_checkpoints
from aiayn.cli.main import main
from aiayn.errors import UserError
from aiayn.training.config import DataConfig, RunConfig, run_config_from_dict
from aiayn.training.run_folder import (
    RESUMABLE,
    RUN_FILES,
    check_resume,
    config_changes,
    flat_run_config,
)
from aiayn.training.trainer import Trainer

MakeRun = Callable[..., RunConfig]
Task = Callable[..., Path]
DOCS = Path(__file__).parents[2] / "docs" / "reliability.md"


def _tiny(make_run: MakeRun, folder: Path, train: Path, **train_cfg: Any) -> RunConfig:
    """The conftest's tiny run; validation decodes 2 sentences (fast)."""
    run = make_run(folder, train, max_tokens=120, **train_cfg)
    assert isinstance(run.data, DataConfig)
    return dataclasses.replace(run, data=dataclasses.replace(run.data, bleu_sentences=2))


def _changed(run: RunConfig, **changes: Any) -> RunConfig:
    """``run`` with ``section.key`` changes (``section__key`` here), through its dict."""
    values = run.to_dict()
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        values[section][key] = value
    return run_config_from_dict(values)


def _fake_checkpoint(run: RunConfig) -> None:
    """A newest checkpoint of ``run`` as far as the resume check reads one (its state.json)."""
    folder = Path(run.run_dir) / "checkpoints" / "step_00000002"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"step": 2, "run_config": run.to_dict()}))


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"data__vocab_size": 280}, ["data.vocab_size: 300 -> 280"]),
        ({"data__lowercase": True}, ["data.lowercase: False -> True"]),
        ({"model__d_model": 32}, ["model.d_model: 64 -> 32"]),
        ({"model__norm_first": True}, ["model.norm_first: False -> True"]),
        ({"train__seed": 4, "train__max_tokens": 300}, ["train.max_tokens", "train.seed"]),
        ({"train__label_smoothing": 0.2}, ["train.label_smoothing: None -> 0.2"]),
    ],
)
def test_resume_refuses_a_changed_config_naming_each_change(
    tmp_path: Path, make_run: MakeRun, changes: dict[str, Any], named: list[str]
) -> None:
    """Refused before any data is read (the corpus here does not even exist), in one line
    naming every change and the options a resume may change."""
    run = make_run(tmp_path / "r", tmp_path / "missing.tsv")
    _fake_checkpoint(run)
    with pytest.raises(UserError) as error:
        Trainer(_changed(run, **changes), resume=True)
    message = str(error.value)
    assert "\n" not in message and "step_00000002 was trained with" in message
    assert all(name in message for name in named), message
    assert message.count(" -> ") == len(named) and "train.max_steps" in message


def test_resume_refuses_swapped_sides_and_other_data_files(tmp_path: Path) -> None:
    """The translation direction (which file is the source) and the data paths are the run's."""
    values: dict[str, Any] = {
        "run_dir": str(tmp_path / "r"),
        "model": {"preset": "tiny"},
        "data": {
            "train_src": "a.en",
            "train_tgt": "a.de",
            "valid_src": "v.en",
            "valid_tgt": "v.de",
        },
    }
    run = run_config_from_dict(values)
    swapped = {**values, "data": {"train_src": "a.de", "train_tgt": "a.en"}}
    assert config_changes(run.to_dict(), run_config_from_dict(swapped)) == [
        "data.train_src: 'a.en' -> 'a.de'",
        "data.train_tgt: 'a.de' -> 'a.en'",
        "data.valid_src: 'v.en' -> None",
        "data.valid_tgt: 'v.de' -> None",
    ]


def test_resume_compares_fields_not_spelling(tmp_path: Path, make_run: MakeRun) -> None:
    """The same model from another preset with overrides is no change; a saved config from an
    older version (a train key it did not have) compares the keys it has."""
    run = make_run(tmp_path / "r", tmp_path / "t.tsv")
    values = run.to_dict()
    respelt = {**values, "model": {"preset": "small", **run.model.to_dict()}}
    assert config_changes(values, run_config_from_dict(respelt)) == []
    # written before train.max_bad_steps and train.weight_decay existed: their defaults
    new_keys = ("max_bad_steps", "weight_decay")
    older = {**values, "train": {k: v for k, v in values["train"].items() if k not in new_keys}}
    assert config_changes(older, run) == []
    assert config_changes(older, _changed(run, train__weight_decay=0.1)) == [
        "train.weight_decay: 0.0 -> 0.1"
    ]
    # a key this version no longer knows: the keys both have are compared
    assert config_changes({**older, "train": {**older["train"], "gone": 1}}, run) == []


def test_resume_may_change_the_listed_options(tmp_path: Path, make_run: MakeRun) -> None:
    """Every key of RESUMABLE is a run-config key, and a config differing in all of them at once
    is no change."""
    run = make_run(tmp_path / "r", tmp_path / "t.tsv")
    assert flat_run_config(run).keys() >= RESUMABLE
    other = _changed(
        run,
        train__max_steps=99,
        train__max_epochs=3,
        train__max_minutes=1.5,
        train__log_every=7,
        train__eval_every=11,
        train__save_every=13,
        train__keep_last=2,
        train__average_last=2,
        train__average_window=0.5,
        train__device="cpu",
        train__precision="bf16",
        train__threads=1,
        train__progress=True,
        train__distributed="fsdp",
        train__compile=True,
        train__keep_freed_memory=False,
        train__max_bad_steps=9,
        train__lr_scale=0.05,
        train__clip_norm=1.0,
    )
    other = dataclasses.replace(other, run_dir=str(tmp_path / "moved"))
    changed = {k for k, v in flat_run_config(other).items() if flat_run_config(run)[k] != v}
    assert changed == RESUMABLE
    assert config_changes(run.to_dict(), other) == []


def test_the_docs_list_the_options_a_resume_may_change() -> None:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## A run folder belongs to one run")[1].split("\n## ")[0]
    listed = section.split("A resume may change only:")[1].split("\n\n")[0]
    assert set(re.findall(r"`([a-z_.]+)`", listed)) == RESUMABLE


def test_a_resumed_run_records_each_step_once(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    """6 steps (checkpoints and validations at 3 and 6, the two averaged at the end); then the
    run loses its step-6 checkpoint (a crash before it was written) and a cut-off metrics line:
    the resume from step 3 drops what came after, trains 4-6 again, and metrics.jsonl lists
    each step once; a second resume at the end adds nothing twice. A changed config is refused
    on the real checkpoint too."""
    train = reverse_task(tmp_path, 200, seed=1)
    run_dir = tmp_path / "r"
    run = _tiny(
        make_run,
        run_dir,
        train,
        max_steps=6,
        eval_every=3,
        log_every=1,
        average_last=2,
        average_window=1.0,
    )
    Trainer(run).fit()
    before = _metrics(run_dir)
    shutil.rmtree(list_checkpoints(run_dir)[-1])
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "train", "st')
    with pytest.raises(UserError, match=r"data\.vocab_size: 300 -> 280"):
        Trainer(_changed(run, data__vocab_size=280), resume=True)
    resumed = Trainer(run, resume=True)
    assert resumed.step == 3
    assert [(e["kind"], e["step"]) for e in resumed.history] == [
        *(("train", s) for s in (1, 2, 3)),
        ("valid", 3),
    ]
    assert _metrics(run_dir) == resumed.history  # the file, rewritten
    resumed.fit()
    kinds = [(e["kind"], e["step"]) for e in _metrics(run_dir)]
    want = [("train", s) for s in (1, 2, 3)] + [("valid", 3)]
    want += [("train", s) for s in (4, 5, 6)] + [("valid", 6), ("valid_averaged", 6)]
    assert kinds == want
    assert [(e["kind"], e["step"]) for e in resumed.history] == want  # curves.png's data
    assert len(before) == len(want)
    valid = next(e for e in _metrics(run_dir) if e["kind"] == "valid" and e["step"] == 6)
    result = Trainer(run, resume=True).fit()  # at the end: nothing to train or validate again
    assert [(e["kind"], e["step"]) for e in _metrics(run_dir)] == want
    assert (result.steps, result.final_checkpoint.name) == (6, "step_00000006")
    assert result.valid == {k: v for k, v in valid.items() if k not in ("kind", "step")}


def test_resume_without_a_checkpoint_starts_with_empty_metrics(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    """--resume with no checkpoint yet (a crash before the first) starts over: step 0, and the
    old metrics lines are gone (the tokenizer is reused)."""
    run = _tiny(make_run, tmp_path / "r", reverse_task(tmp_path, 100, seed=1))
    Trainer(run)  # writes tokenizer.json
    (tmp_path / "r" / "metrics.jsonl").write_text('{"kind": "train", "step": 5}\n')
    resumed = Trainer(run, resume=True)
    assert resumed.step == 0 and resumed.history == []
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == ""


@pytest.mark.parametrize("name", RUN_FILES)
def test_a_fresh_run_refuses_a_folder_holding_a_run(
    tmp_path: Path, make_run: MakeRun, name: str
) -> None:
    """Any one of a run's files is enough; refused before anything is read or written."""
    run_dir = tmp_path / "r"
    if name == "checkpoints":
        (run_dir / name / "step_00000001").mkdir(parents=True)
    else:
        run_dir.mkdir()
        (run_dir / name).write_text("{}")
    with pytest.raises(UserError) as error:
        Trainer(make_run(run_dir, tmp_path / "missing.tsv"))
    message = str(error.value)
    assert "\n" not in message and f"already holds a run ({name})" in message
    assert "--resume" in message and "--force" in message and "another run_dir" in message


def test_a_fresh_run_may_use_a_folder_of_other_files(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints").mkdir(parents=True)  # empty: no run yet
    (run_dir / "notes.txt").write_text("mine")
    Trainer(make_run(run_dir, reverse_task(tmp_path, 100, seed=1)))
    assert (run_dir / "notes.txt").read_text() == "mine"
    assert (run_dir / "tokenizer.json").is_file()


def test_force_deletes_the_old_run_first_and_nothing_else(
    tmp_path: Path,
    reverse_task: Task,
    make_run: MakeRun,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``aiayn train`` into a used folder: refused in one line (exit 2); with --force the old
    run's checkpoints, metrics, plot and outputs are gone before the new run writes its own,
    and the user's other files stay; --force with --resume is refused."""
    train = reverse_task(tmp_path, 200, seed=1)
    run_dir = tmp_path / "r"
    Trainer(_tiny(make_run, run_dir, train, max_steps=4, save_every=2, log_every=1)).fit()
    (run_dir / "test.hyp.txt").write_text("old hypotheses\n")
    (run_dir / "notes.txt").write_text("mine")
    config = tmp_path / "new.yaml"
    new = _tiny(make_run, run_dir, train, max_steps=1, model={"d_model": 32})
    config.write_text(yaml.safe_dump(new.to_dict()), encoding="utf-8")
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "already holds a run" in err and "--force" in err, err
    assert main(["train", "--config", str(config), "--force", "--resume"]) == 2
    assert "not both" in capsys.readouterr().err
    assert len(list_checkpoints(run_dir)) == 2  # nothing touched so far
    assert main(["train", "--config", str(config), "--force"]) == 0
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_00000001"]
    assert [(e["kind"], e["step"]) for e in _metrics(run_dir)] == [("train", 1), ("valid", 1)]
    assert not (run_dir / "test.hyp.txt").exists()
    assert (run_dir / "notes.txt").read_text() == "mine"
    ckpt = list_checkpoints(run_dir)[0]
    state = json.loads((ckpt / "state.json").read_text())
    assert state["run_config"]["model"]["d_model"] == 32
    check_resume(run_dir, new)  # the folder is the new run's now
