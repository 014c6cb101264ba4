"""BERT (family bert) through the one trainer: masked-LM pre-training learns to use the context
(its loss falls below what any context-free model reaches) and `aiayn fill-mask` reads its
checkpoint; a classifier learns a separable toy task to >= 95% and `aiayn classify-text` reads
it; fine-tuning from a checkpoint keeps what fits and starts the other heads fresh; both resume
exactly; the objectives equal PyTorch's cross-entropy; the config is validated key by key."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.cli.main import main
from aiayn.data.bert_tokenizer import load_bert_tokenizer
from aiayn.data.masking import IGNORE_INDEX
from aiayn.errors import ConfigError, UserError
from aiayn.models.bert import BERT, bert_preset
from aiayn.training.config import RunConfig, load_run_config, run_config_from_dict
from aiayn.training.masked_lm import MaskedLMObjective, MaskedLMTask
from aiayn.training.text_classification import TextClassificationObjective
from aiayn.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]

GROUPS = {
    "animal": ["cat", "dog", "horse", "cow", "sheep", "goat"],
    "city": ["paris", "berlin", "rome", "madrid", "vienna", "london"],
    "colour": ["red", "green", "blue", "yellow", "black", "white"],
    "food": ["bread", "cheese", "apple", "rice", "soup", "cake"],
}
FILLER = [
    "the",
    "a",
    "one",
    "my",
    "your",
    "this",
    "that",
    "some",
    "very",
    "big",
    "small",
    "old",
    "new",
]


def topic_lines(n: int, seed: int) -> list[str]:
    """Lines of 5–9 words of one group: a masked word's group is told by the others (the
    context-free optimum is the unigram entropy ln 24; using the context, ln 6)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = rng.choice(list(GROUPS.values()))
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 9))))
    return lines


def labelled_lines(n: int, seed: int, groups: tuple[str, ...] = tuple(GROUPS)) -> list[str]:
    """``group<TAB>text`` lines: filler words with one or two words of the group among them."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        label = rng.choice(groups)
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
        for _ in range(rng.randint(1, 2)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(GROUPS[label]))
        lines.append(f"{label}\t{' '.join(words)}")
    return lines


def write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def bert_values(run_dir: Path, data: dict[str, Any], **train: Any) -> dict[str, Any]:
    """A 2-layer d_model=32 BERT, max_len 32, batches of 256 tokens, no progress bar."""
    return {
        "run_dir": str(run_dir),
        "model": {
            "family": "bert",
            "preset": "bert-tiny",
            "d_model": 32,
            "num_heads": 2,
            "num_layers": 2,
            "d_ff": 64,
            "max_len": 32,
            "dropout": 0.0,
            "attention_dropout": 0.0,
        },
        "data": {"vocab_size": 200, "min_frequency": 1, **data},
        "train": {
            "max_tokens": 256,
            "warmup_steps": 30,
            "lr_scale": 0.1,  # peak lr 0.1 · (32 · 30)^-0.5 = 3.2e-3
            "eval_every": 0,
            "save_every": 0,
            "log_every": 10,
            "progress": False,
            "threads": 1,
            "seed": 3,
            **train,
        },
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bert_data")
    return {
        "text": write(root / "train.txt", topic_lines(400, 1)),
        "valid_text": write(root / "valid.txt", topic_lines(100, 2)),
        "test_text": write(root / "test.txt", topic_lines(50, 3)),
        "tsv": write(root / "train.tsv", labelled_lines(600, 4)),
        "valid_tsv": write(root / "valid.tsv", labelled_lines(100, 5)),
        "test_tsv": write(root / "test.tsv", labelled_lines(100, 6)),
        "two_tsv": write(root / "two.tsv", labelled_lines(200, 7, ("animal", "food"))),
        "two_valid_tsv": write(root / "two_valid.tsv", labelled_lines(40, 8, ("animal", "food"))),
        "small_text": write(root / "small.txt", topic_lines(60, 9)),
        "small_tsv": write(root / "small.tsv", labelled_lines(60, 10)),
    }


def mlm_data(files: dict[str, str]) -> dict[str, Any]:
    return {"task": "masked-lm", "train": files["text"], "valid": files["valid_text"]}


def cls_data(files: dict[str, str]) -> dict[str, Any]:
    return {"task": "classification", "train": files["tsv"], "valid": files["valid_tsv"]}


@pytest.fixture(scope="module")
def pretrained(files: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """150 masked-LM steps (seconds): the trainer, the validation loss before, the result."""
    run_dir = tmp_path_factory.mktemp("mlm") / "run"
    data = {**mlm_data(files), "test": files["test_text"]}
    trainer = Trainer(
        run_config_from_dict(bert_values(run_dir, data, max_steps=150, eval_every=75))
    )
    before = trainer.evaluate()
    return {"trainer": trainer, "before": before, "result": trainer.fit(), "run_dir": run_dir}


@pytest.fixture(scope="module")
def classifier(files: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """80 classification steps from scratch (seconds)."""
    run_dir = tmp_path_factory.mktemp("cls") / "run"
    data = {**cls_data(files), "test": files["test_tsv"]}
    values = bert_values(run_dir, data, max_steps=80, eval_every=40, lr_scale=0.3)
    trainer = Trainer(run_config_from_dict(values))
    before = trainer.evaluate()
    return {"trainer": trainer, "before": before, "result": trainer.fit(), "run_dir": run_dir}


def test_masked_lm_learns_from_the_context_and_fill_mask_reads_it(
    pretrained: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = pretrained["before"], pretrained["result"].valid
    assert before["loss"] > math.log(24) + 1.0, before  # untrained: about ln V
    assert after["loss"] < math.log(24) - 0.5, after  # below any context-free model
    assert after["loss"] == after["nll"] and after["tokens"] == before["tokens"] > 0
    test = pretrained["result"].test
    assert test is not None and test["loss"] < math.log(24) - 0.4, test
    run_dir = pretrained["run_dir"]
    # checkpoints: family bert with its MLM head and no pooler; the WordPiece vocabulary
    ckpt = load_checkpoint(list_checkpoints(run_dir)[-1], expect=BERT)
    assert ckpt.family == "bert" and ckpt.state["run_config"]["data"]["task"] == "masked-lm"
    assert (ckpt.config.head, ckpt.config.pooler) == ("mlm", False)
    tokenizer = load_bert_tokenizer(ckpt.path)
    assert tokenizer.vocab_size == ckpt.config.vocab_size and tokenizer.mask_id == 4
    assert (ckpt.path / "tokenizer.json").read_bytes() == (run_dir / "tokenizer.json").read_bytes()
    # best = lowest validation perplexity
    entries = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ppl = [e["ppl"] for e in entries if e["kind"] == "valid"]
    best = json.loads((run_dir / "checkpoints" / "best" / "state.json").read_text())
    assert best["best_ppl"] == min(ppl) == best["metrics"]["ppl"]
    # fill-mask on the trained model: the mask among animals is an animal
    capsys.readouterr()
    best_dir = run_dir / "checkpoints" / "best"
    args = ["fill-mask", "--checkpoint", str(best_dir), "--top-k", "3"]
    assert main([*args, "cat dog [MASK] horse cow sheep"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].split("\t")[1] in GROUPS["animal"], lines


def test_masked_lm_targets_and_validation_masks(pretrained: dict[str, Any]) -> None:
    """The trainer was told each step's targets before collating; validation masks are fixed."""
    trainer = pretrained["trainer"]
    train = trainer.data.train
    for ids in trainer.sampler.batches(3)[:3]:
        batch = train.collate(ids)
        assert batch.num_tgt_tokens == train.target_tokens(ids) > 0
        assert int((batch.labels != IGNORE_INDEX).sum()) == batch.num_tgt_tokens
    assert trainer.evaluate() == trainer.evaluate()  # the validation masks are drawn once
    assert isinstance(trainer.task, MaskedLMTask)


def test_the_classifier_learns_and_classify_text_reads_it(
    classifier: dict[str, Any], files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    before, result = classifier["before"], classifier["result"]
    assert before["accuracy"] < 50.0 and result.valid["accuracy"] >= 95.0, (before, result.valid)
    assert result.test is not None and result.test["accuracy"] >= 95.0, result.test
    assert result.test["examples"] == 100
    run_dir = classifier["run_dir"]
    ckpt = load_checkpoint(list_checkpoints(run_dir)[-1], expect=BERT)
    assert ckpt.config.head == "classification" and ckpt.config.pooler
    assert ckpt.config.id2label == ("animal", "city", "colour", "food")
    assert ckpt.config.num_labels == 4
    entries = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = json.loads((run_dir / "checkpoints" / "best" / "state.json").read_text())
    accuracy = [e["accuracy"] for e in entries if e["kind"] == "valid"]
    assert best["best_accuracy"] == max(accuracy)
    # classify-text: the labels of the model's argmax, one line per input line
    lines = Path(files["test_tsv"]).read_text().splitlines()[:8]
    texts = Path(run_dir.parent / "texts.txt")
    texts.write_text("\n".join(line.split("\t")[1] for line in lines) + "\n")
    capsys.readouterr()
    assert main(["classify-text", "--checkpoint", str(ckpt.path), str(texts), "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 8 and all(len(line.split("\t")) == 4 for line in out)
    batch = load_bert_tokenizer(ckpt.path).encode_batch([x.split("\t")[1] for x in lines])
    with torch.no_grad():
        argmax = ckpt.model.classify(*batch).argmax(dim=-1).tolist()
    assert [line.split("\t")[0] for line in out] == [ckpt.config.id2label[i] for i in argmax]
    assert sum(a.split("\t")[0] == b.split("\t")[0] for a, b in zip(out, lines, strict=True)) >= 7


def test_fine_tuning_starts_from_a_checkpoint(
    pretrained: dict[str, Any],
    classifier: dict[str, Any],
    files: dict[str, str],
    tmp_path: Path,
) -> None:
    """From the masked LM: its encoder and tokenizer, a new pooler and classifier; from the
    classifier with the same labels: everything; with other labels: a new classifier."""
    mlm_ckpt = pretrained["run_dir"] / "checkpoints" / "best"
    logs: list[str] = []

    def start(init_from: Path, data: dict[str, Any], name: str) -> Trainer:
        values = bert_values(tmp_path / name, data, max_steps=1)
        values["model"] = {"family": "bert", "init_from": str(init_from), "dropout": 0.0}
        run = run_config_from_dict(values)
        assert run_config_from_dict(run.to_dict()) == run
        trainer = Trainer(run, task=make_logged_task(run, logs))
        return trainer

    trainer = start(mlm_ckpt, cls_data(files), "from_mlm")
    theirs = load_checkpoint(mlm_ckpt, expect=BERT).model.state_dict()
    ours = trainer.model.state_dict()
    assert all(torch.equal(ours[k], v) for k, v in theirs.items() if k.startswith("encoder."))
    assert "pooler.dense.weight" in ours and "pooler.dense.weight" not in theirs
    assert (tmp_path / "from_mlm" / "tokenizer.json").read_bytes() == (
        mlm_ckpt / "tokenizer.json"
    ).read_bytes()
    assert trainer.model_config.id2label == ("animal", "city", "colour", "food")
    assert "new pooler and classifier (fresh weights) (the checkpoint has head 'mlm'" in logs[-1]
    assert "not used: its masked-LM head" in logs[-1]
    trainer.fit()  # a step runs

    cls_ckpt = classifier["run_dir"] / "checkpoints" / "best"
    same = start(cls_ckpt, cls_data(files), "same_labels")
    theirs = load_checkpoint(cls_ckpt, expect=BERT).model.state_dict()
    assert all(torch.equal(same.model.state_dict()[k], v) for k, v in theirs.items())
    assert "new" not in logs[-1] and "not used" not in logs[-1]

    data = {"task": "classification", "train": files["two_tsv"], "valid": files["two_valid_tsv"]}
    other = start(cls_ckpt, data, "other_labels")
    assert other.model_config.id2label == ("animal", "food")
    assert other.model.state_dict()["classifier.linear.weight"].shape == (2, 32)
    assert (
        "new classifier (fresh weights) (the checkpoint's classifier has labels animal, city, "
        "colour, food; the training file's are animal, food)"
    ) in logs[-1]
    values = bert_values(tmp_path / "x", cls_data(files))
    values["model"] = {"family": "gpt2", "init_from": str(cls_ckpt)}
    with pytest.raises(ConfigError, match=r"holds a bert model, not gpt2"):
        run_config_from_dict(values)


def make_logged_task(run: RunConfig, logs: list[str]) -> Any:
    from aiayn.training.task import make_task

    return make_task(run, logs.append)


@pytest.mark.parametrize("task", ["masked-lm", "classification"])
def test_resume_continues_exactly(
    task: str, files: dict[str, str], tmp_path: Path, resume_check: Callable[..., Trainer]
) -> None:
    """n steps straight == k steps, stop, resume to n, bit for bit (dropout on; the masked LM
    draws each epoch's masks anew)."""
    data = mlm_data(files) if task == "masked-lm" else cls_data(files)
    data["train"] = files["small_text" if task == "masked-lm" else "small_tsv"]  # 3 batches

    def run(folder: Path, steps: int, save_every: int) -> RunConfig:
        values = bert_values(folder, data, max_steps=steps, save_every=save_every)
        values["model"]["dropout"] = 0.1
        return run_config_from_dict(values)

    straight = resume_check(run, tmp_path)
    assert straight.epoch >= 1  # crossed an epoch boundary after the resume


def test_the_objectives_equal_cross_entropy() -> None:
    torch.manual_seed(0)
    config = bert_preset("bert-tiny", d_model=32, num_heads=2, num_layers=1, d_ff=64)
    mlm = BERT(config.replace(head="mlm", pooler=False, dropout=0.0)).eval()
    inputs = torch.randint(5, 1000, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False
    labels = torch.full((3, 9), IGNORE_INDEX)
    labels[0, 2], labels[1, 3], labels[2, 7] = 11, 12, 13
    sums = MaskedLMObjective(mlm)(inputs, mask, labels)
    logits = mlm.mlm_logits(mlm(inputs, None, mask).hidden)  # (3, 9, V)
    want = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    torch.testing.assert_close(sums.loss, want)
    assert int(sums.tokens) == 3
    cls = BERT(config.replace(head="classification", num_labels=3, dropout=0.0)).eval()
    types, gold = torch.zeros_like(inputs), torch.tensor([2, 0, 1])
    sums = TextClassificationObjective(cls)(inputs, types, mask, gold)
    want = F.cross_entropy(cls.classify(inputs, types, mask), gold, reduction="sum")
    torch.testing.assert_close(sums.loss, want)
    with pytest.raises(ValueError, match="no masked-LM head"):
        MaskedLMObjective(cls)


@pytest.mark.parametrize("name", ["bert_mlm", "bert_classify"])
def test_the_shipped_configs_load(name: str) -> None:
    run = load_run_config(ROOT / "configs" / f"{name}.yaml")
    assert run.family == "bert" and run.model_preset == "bert-tiny"
    assert run.data.task == ("masked-lm" if name == "bert_mlm" else "classification")
    assert run_config_from_dict(run.to_dict()) == run
    assert yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())["model"]["family"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"task": None}}, r"data\.task is required for family bert"),
        ({"data": {"task": "mlm"}}, r"data\.task must be one of 'masked-lm', 'classification'"),
        ({"data": {"train": None}}, r"data\.train is required for family bert"),
        ({"data": {"valid": None}}, r"data\.valid is required for family bert"),
        ({"data": {"max_length": 64}}, r"data\.max_length=64 exceeds the model's max_len=32"),
        ({"data": {"max_length": 2}}, r"data\.max_length must be >= 3"),
        ({"data": {"mlm_probability": 0.2}}, r"data\.mlm_probability applies to data\.task mask"),
        ({"data": {"block_size": 64}}, r"data\.block_size is a language model key"),
        ({"data": {"labels": 3}}, r"unknown data config key\(s\): labels"),
        ({"model": {"head": "mlm"}}, r"model\.head='mlm' does not fit data\.task=classification"),
        ({"model": {"pooler": False}}, r"model\.pooler=False does not fit data\.task=classific"),
        ({"model": {"preset": "small"}}, r"unknown BERT preset 'small'"),
        ({"model": {"init_from": 3}}, r"checkpoint folder of family transformer or gpt2 or t5 or"),
    ],
)
def test_config_errors_name_the_key(
    files: dict[str, str], change: dict[str, dict[str, Any]], message: str
) -> None:
    values = bert_values(Path("unused"), cls_data(files))
    for section, entries in change.items():
        values[section] = {**values[section], **entries}
        values[section] = {k: v for k, v in values[section].items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        run_config_from_dict(values)


def test_the_task_sets_the_head(files: dict[str, str]) -> None:
    mlm = run_config_from_dict(bert_values(Path("r"), mlm_data(files)))
    assert (mlm.model.head, mlm.model.pooler) == ("mlm", False)
    cls = run_config_from_dict(bert_values(Path("r"), cls_data(files)))
    assert (cls.model.head, cls.model.pooler) == ("classification", True)
    with pytest.raises(ConfigError, match=r"data\.task=masked-lm trains a BERT with head 'mlm'"):
        RunConfig(model=cls.model, data=mlm.data)
    with pytest.raises(ConfigError, match=r"data\.task is a BERT training key \(family bert\)"):
        load_run_config(None, ["data.task=masked-lm"], demo="lm")


def test_train_cli_reports_both_tasks(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, data, want in (
        ("mlm", {**mlm_data(files), "test": files["test_text"]}, "validation: perplexity"),
        ("cls", {**cls_data(files), "test": files["test_tsv"]}, "validation: accuracy"),
    ):
        file = tmp_path / f"{name}.yaml"
        file.write_text(yaml.safe_dump(bert_values(tmp_path / name, data, max_steps=3)))
        capsys.readouterr()
        assert main(["train", "--config", str(file)]) == 0
        out = capsys.readouterr().out
        assert "trained 3 steps" in out and want in out, out
        assert "best checkpoint:" in out and "test:" in out, out


def test_data_errors_name_the_file(files: dict[str, str], tmp_path: Path) -> None:
    plant = write(tmp_path / "plant.tsv", ["plant\tan oak tree", "animal\ta cat"])
    pairs = write(tmp_path / "pairs.tsv", ["animal\ta cat\tthe dog", "food\tbread\trice"])
    blank = write(tmp_path / "blank.txt", ["", "  "])
    cases = [
        ({**cls_data(files), "valid": plant}, r"plant\.tsv: label 'plant' is not among the train"),
        ({**cls_data(files), "test": pairs}, r"pairs\.tsv holds text pairs, where the training"),
        ({**mlm_data(files), "valid": blank}, r"blank\.txt: no text lines"),
    ]
    for data, message in cases:  # one run_dir: the files are checked before anything is written
        with pytest.raises(UserError, match=message):
            Trainer(run_config_from_dict(bert_values(tmp_path / "run", data)))
    assert not (tmp_path / "run" / "tokenizer.json").exists()
