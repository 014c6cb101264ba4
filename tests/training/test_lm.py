"""The language-model task through the one trainer: it learns, resumes exactly, checkpoints a
GPT-2 (family gpt2) that averages and that translation refuses, fine-tunes from a checkpoint,
and its config is validated key by key; `aiayn train` runs it end to end."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from aiayn.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Tokenizer
from aiayn.errors import ConfigError
from aiayn.layers.loss import label_smoothed_nll
from aiayn.models import GPT2, gpt2_preset
from aiayn.training.config import (
    RunConfig,
    load_run_config,
    run_config_from_dict,
)
from aiayn.training.lm import LM_DEMO_CONFIG
from aiayn.training.objective import LanguageModelObjective
from aiayn.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
ANIMALS, VERBS, PLACES = ("cat", "dog", "bird", "fox"), ("sat", "ran", "slept"), ("mat", "rug")


def write_text(folder: Path, lines: int, seed: int) -> Path:
    """A repetitive text: "the <animal> <verb> on the <place> ." lines."""
    rng = random.Random(seed)
    text = [
        f"the {rng.choice(ANIMALS)} {rng.choice(VERBS)} on the {rng.choice(PLACES)} ."
        for _ in range(lines)
    ]
    path = folder / f"text_{seed}.txt"
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def lm_config(run_dir: Path, text: Path, **train: Any) -> dict[str, Any]:
    """A 2-layer d_model=32 GPT-2 on ``text``, blocks of 32 tokens, no progress bar."""
    return {
        "run_dir": str(run_dir),
        "model": {
            "family": "gpt2",
            "preset": "gpt2-tiny",
            "d_model": 32,
            "num_heads": 2,
            "num_layers": 2,
            "max_len": 32,
        },
        "data": {
            "train_text": str(text),
            "block_size": 32,
            "vocab_size": 300,
            "min_frequency": 1,
            "valid_lines": 20,
        },
        "train": {
            "max_tokens": 128,
            "warmup_steps": 20,
            "lr_scale": 0.1,  # peak lr 0.1 · (32 · 20)^-0.5 = 4e-3
            "eval_every": 0,
            "save_every": 0,
            "log_every": 10,
            "progress": False,
            "seed": 3,
            **train,
        },
    }


def lm_run(run_dir: Path, text: Path, **train: Any) -> RunConfig:
    return run_config_from_dict(lm_config(run_dir, text, **train))


def test_the_language_model_learns(tmp_path: Path) -> None:
    """Validation loss falls clearly within a few dozen steps on a repetitive text."""
    trainer = Trainer(lm_run(tmp_path / "r", write_text(tmp_path, 400, seed=1), max_steps=40))
    before = trainer.evaluate()
    result = trainer.fit()
    after = result.valid
    assert after["loss"] < 0.5 * before["loss"], (before, after)
    assert after["ppl"] == pytest.approx(torch.tensor(after["nll"]).exp().item())
    assert after["loss"] == after["nll"]  # no label smoothing by default
    assert trainer.task.criterion.metric == "ppl"
    # the final greedy samples continue the first words of validation lines, learnt
    assert len(result.samples) == 4, result.samples
    assert all(text.startswith(" on the ") for _, text in result.samples), result.samples
    assert isinstance(trainer.model, GPT2) and trainer.model_config.vocab_size <= 300
    config = trainer.model_config
    assert (config.bos_id, config.eos_id, config.pad_id) == (1, 2, 0)  # aiayn's specials


def test_resume_continues_exactly(tmp_path: Path, resume_check: Callable[..., Trainer]) -> None:
    """n steps straight == k steps, stop, resume to n, bit for bit (dropout on)."""
    text = write_text(tmp_path, 100, seed=1)  # 6 batches an epoch

    def run(folder: Path, steps: int, save_every: int) -> RunConfig:
        return lm_run(folder, text, max_steps=steps, save_every=save_every)

    straight = resume_check(run, tmp_path)
    assert straight.epoch >= 1  # the runs crossed an epoch boundary after the resume


def test_checkpoints_hold_gpt2_average_and_keep_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = write_text(tmp_path, 300, seed=1)
    run = lm_run(  # the averaging window: the last 75% of 8 steps, checkpoints at 4, 6, 8
        tmp_path / "r",
        text,
        max_steps=8,
        eval_every=2,
        keep_last=3,
        average_last=3,
        average_window=0.75,
    )
    result = Trainer(run).fit()
    ckpts = list_checkpoints(tmp_path / "r")
    assert [p.name for p in ckpts] == ["step_00000004", "step_00000006", "step_00000008"]
    state = json.loads((ckpts[-1] / "state.json").read_text())
    assert state["family"] == "gpt2" and state["run_config"]["model"]["family"] == "gpt2"
    assert load_checkpoint(ckpts[-1], expect=GPT2).config.eos_id == 2
    # best = lowest validation perplexity
    valid = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    ppl = [e["ppl"] for e in valid if e["kind"] in ("valid", "valid_averaged")]
    best = json.loads((tmp_path / "r" / "checkpoints" / "best" / "state.json").read_text())
    assert best["best_ppl"] == min(ppl) == best["metrics"]["ppl"]
    # averaging: the mean of the last three, the head still tied to the embedding
    assert result.averaged_checkpoint is not None and result.averaged_valid is not None
    averaged = load_checkpoint(result.averaged_checkpoint, expect=GPT2).model
    assert averaged.output_proj.weight is averaged.embedder.embedding.weight
    name = "layers.0.feed_forward.linear1.weight"
    mean = sum(load_file(str(p / "model.safetensors"))[name] for p in ckpts) / 3
    torch.testing.assert_close(averaged.state_dict()[name], mean)
    # translating with a language model is refused in one line
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(ckpts[-1])]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "holds a gpt2 model" in err and "transformer or t5" in err


def test_fine_tuning_starts_from_a_checkpoint_and_its_tokenizer(tmp_path: Path) -> None:
    text = write_text(tmp_path, 200, seed=1)
    tokenizer = Tokenizer.train(text.read_text().splitlines(), 280, min_frequency=1)
    tokenizer.save(tmp_path / "tok.json")
    config = gpt2_preset("gpt2-tiny").replace(
        vocab_size=290, d_model=32, num_heads=2, num_layers=1, max_len=32, eos_id=2
    )
    torch.manual_seed(5)
    start = save_checkpoint(tmp_path / "start", GPT2(config), {}, tmp_path / "tok.json")
    values = lm_config(tmp_path / "r", text, max_steps=1)
    values["model"] = {"family": "gpt2", "init_from": str(start), "dropout": 0.0}
    run = run_config_from_dict(values)
    assert run.model == config.replace(dropout=0.0) and run_config_from_dict(run.to_dict()) == run
    trainer = Trainer(run)
    for name, tensor in load_checkpoint(start, expect=GPT2).model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], tensor), name
    assert (tmp_path / "r" / "tokenizer.json").read_bytes() == (
        start / "tokenizer.json"
    ).read_bytes()
    assert trainer.data.train.stream[trainer.data.train.stream == 2].size > 0  # EOS of the model
    with pytest.raises(ConfigError, match="exclude each other"):
        run_config_from_dict({**values, "model": {**values["model"], "preset": "gpt2-tiny"}})
    # the documented fine-tuning config, pointed at this checkpoint from the command line
    overrides = [f"model.init_from={start}", "data.block_size=32"]
    tuned = load_run_config(ROOT / "configs" / "gpt2_finetune.yaml", overrides)
    assert tuned.model == config and tuned.init_from == str(start)


def test_the_objective_equals_the_explicit_loss_and_gradients() -> None:
    config = gpt2_preset("gpt2-tiny").replace(
        vocab_size=60, d_model=32, num_heads=2, num_layers=2, dropout=0.0, embedding_dropout=0.0
    )
    model = GPT2(config).eval()
    block = torch.randint(3, 60, (3, 9))
    inputs, targets = block[:, :-1], block[:, 1:]
    sums = LanguageModelObjective(model, 0.1)(inputs, targets)
    sums.loss.backward()
    fast = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    log_probs = model.log_probs(model(inputs).hidden)  # (3, 8, V)
    want = label_smoothed_nll(log_probs, targets, 0.1, pad_id=-1)
    want.loss.backward()
    torch.testing.assert_close(sums.loss, want.loss)
    torch.testing.assert_close(sums.nll, want.nll)
    for name, p in model.named_parameters():
        torch.testing.assert_close(fast[name], p.grad, msg=name)


def test_lm_demo_yaml_equals_builtin_and_loads() -> None:
    assert yaml.safe_load((ROOT / "configs" / "lm_demo.yaml").read_text()) == LM_DEMO_CONFIG
    run = load_run_config(ROOT / "configs" / "lm_demo.yaml")
    assert (run.family, run.model.d_model, run.model.max_len) == ("gpt2", 128, 128)
    assert run_config_from_dict(run.to_dict()) == run
    assert load_run_config(None).family == "transformer"  # the no-argument default
    assert load_run_config(None, demo="lm") == run  # `aiayn train --demo lm`: no YAML needed
    with pytest.raises(ConfigError, match="unknown demo 'chat'"):
        load_run_config(None, demo="chat")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"train_src": "x.tsv"}}, r"data\.train_src is a translation key"),
        ({"data": {"block_size": 0}}, r"data\.block_size must be >= 1"),
        ({"data": {"block_size": 64}}, r"data\.block_size=64 exceeds the model's max_len=32"),
        ({"data": {"tokens": 5}}, r"unknown data config key\(s\): tokens"),
        ({"data": {"demo_side": "fr"}}, r"data\.demo_side must be one of 'en', 'de', 'both'"),
        ({"model": {"family": "llama"}}, r"unknown model\.family 'llama'"),
        (
            {"model": {"num_encoder_layers": 2}},
            r"unknown model config key\(s\): num_encoder_layers",
        ),
        ({"model": {"preset": "small"}}, r"unknown GPT-2 preset 'small'"),
        ({"train": {"label_smoothing": 1.5}}, r"train\.label_smoothing must be in \[0, 1\)"),
    ],
)
def test_lm_config_errors_name_the_key(
    tmp_path: Path, change: dict[str, dict[str, Any]], message: str
) -> None:
    values = lm_config(tmp_path, tmp_path / "t.txt")
    for section, entries in change.items():
        values[section] = {**values[section], **entries}
    with pytest.raises(ConfigError, match=message):
        run_config_from_dict(values)


def test_translation_config_refuses_lm_keys() -> None:
    with pytest.raises(ConfigError, match=r"data\.block_size is a language model key"):
        load_run_config(None, ["data.block_size=64"])
    with pytest.raises(ConfigError, match=r"model\.label_smoothing is a training setting"):
        load_run_config(None, ["model.label_smoothing=0.1"])
    with pytest.raises(ConfigError, match=r"model\.preset and model\.init_from exclude each"):
        load_run_config(None, ["model.init_from=x"])


def test_train_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = write_text(tmp_path, 200, seed=1)
    file = tmp_path / "lm.yaml"
    file.write_text(yaml.safe_dump(lm_config(tmp_path / "run", text, max_steps=3)))
    assert main(["train", "--config", str(file), "--set", "train.average_last=0"]) == 0
    out = capsys.readouterr().out
    assert "trained 3 steps" in out and "validation: perplexity" in out, out
    assert "samples (greedy continuations of the prompts):" in out
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    assert main(["evaluate", "--checkpoint", str(ckpt), "--text", str(text)]) == 0
    assert "perplexity: " in capsys.readouterr().out


def test_the_builtin_lm_demo_runs_without_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train", "--demo", "lm", "--run-dir", str(tmp_path / "run")]
    short = ["--set", "train.max_steps=2", "--set", "train.average_last=0"]
    assert main([*args, *short, "--set", "data.vocab_size=300"]) == 0
    out = capsys.readouterr().out
    assert "trained 2 steps" in out and "samples (greedy continuations" in out, out
    assert main([*args, "--config", "configs/lm_demo.yaml"]) == 2
    assert "give --config FILE or --demo lm, not both" in capsys.readouterr().err
