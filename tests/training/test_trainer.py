"""The training loop: it learns (reverse task), resumes exactly, accumulates exactly, averages."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.data import padding_fraction
from aiayn.decoding.translate import translate_texts
from aiayn.training.config import RunConfig
from aiayn.training.trainer import Trainer

MakeRun = Callable[..., RunConfig]
Task = Callable[..., Path]


def test_reverse_task_is_learned_to_99_percent(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    """Proof that the whole loop learns: ≥ 99% exact match on held-out sequences."""
    train = reverse_task(tmp_path, 3000, seed=1)
    valid = reverse_task(tmp_path, 200, seed=2)
    run = make_run(
        tmp_path / "run",
        train,
        valid,
        model={"norm_first": True, "dropout": 0.0},
        max_steps=900,
        warmup_steps=100,
        lr_scale=0.15,
    )
    trainer = Trainer(run)
    result = trainer.fit()
    sources = [line.split("\t")[0] for line in valid.read_text().splitlines()]
    expected = [" ".join(s.split()[::-1]) for s in sources]
    got = translate_texts(trainer.model, trainer.data.tokenizer, sources)
    accuracy = sum(g == e for g, e in zip(got, expected, strict=True)) / len(expected)
    assert accuracy >= 0.99, (accuracy, list(zip(got, expected, strict=True))[:5])
    assert result.valid["bleu"] > 95


def test_resume_continues_exactly(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun, resume_check: Callable[..., Trainer]
) -> None:
    """n steps straight == k steps, stop, resume to n (dropout on, so RNG state matters)."""
    train = reverse_task(tmp_path, 400, seed=1)

    def run(folder: Path, steps: int, save_every: int) -> RunConfig:
        return make_run(folder, train, max_steps=steps, save_every=save_every)

    resume_check(run, tmp_path)


def test_two_half_batches_equal_one_full_batch(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    train = reverse_task(tmp_path, 200, seed=1)
    trainer = Trainer(make_run(tmp_path / "r", train, max_steps=1))
    trainer.model.eval()  # no dropout: the two gradients must agree exactly up to rounding
    data = trainer.data.train
    ids = list(range(16))
    full_batch = data.collate(ids)
    trainer.accumulate_gradients([full_batch], full_batch.num_tgt_tokens)
    full = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad()
    trainer.accumulate_gradients(
        [data.collate(ids[:5]), data.collate(ids[5:])], full_batch.num_tgt_tokens
    )
    for name, param in trainer.model.named_parameters():
        assert param.grad is not None
        torch.testing.assert_close(param.grad, full[name], atol=1e-6, rtol=1e-5)


def test_step_counts_global_tokens_and_padding_of_its_batches(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    """The loss normaliser counts the step's target tokens as collate does (EOS included), and
    the logged padding is the sampler's figure for those batches."""
    train = reverse_task(tmp_path, 200, seed=1)
    trainer = Trainer(make_run(tmp_path / "r", train, max_steps=1, max_tokens=120))
    data = trainer.data.train
    step = trainer._micro_batches()
    assert step is not None
    micro, tokens = step
    assert tokens == sum(data.collate(ids).num_tgt_tokens for ids in micro)
    assert trainer.train_step(micro, tokens).tokens == tokens
    # two micro-batches of sentences of different lengths: padding to count
    first_of_length = {int(n): i for i, n in reversed(list(enumerate(data.tgt_lengths)))}
    mixed = sorted(first_of_length.values())[:6]
    micro = [mixed[:3], mixed[3:]]
    stats = trainer.train_step(micro)
    want = padding_fraction(micro, data.src_lengths, data.tgt_lengths)
    assert stats.padding == pytest.approx(want, abs=1e-12) and stats.padding > 0


def test_validation_leaves_the_model_training(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    """evaluate() runs in eval mode and gives the caller its mode back (dropout stays on)."""
    train = reverse_task(tmp_path, 100, seed=1)
    trainer = Trainer(make_run(tmp_path / "r", train, max_steps=1))
    trainer.model.train()
    trainer.evaluate(bleu_sentences=2)
    assert all(m.training for m in trainer.model.modules())
    trainer.model.eval()
    trainer.evaluate(bleu_sentences=2)
    assert not any(m.training for m in trainer.model.modules())


def test_checkpoints_atomic_pruned_and_averaged(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun
) -> None:
    train = reverse_task(tmp_path, 300, seed=1)
    # the averaging window: the last 75% of 8 steps, 3 checkpoints 2 steps apart (4, 6, 8)
    run = make_run(
        tmp_path / "r",
        train,
        max_steps=8,
        save_every=2,
        keep_last=3,
        average_last=3,
        average_window=0.75,
    )
    result = Trainer(run).fit()
    ckpts = list_checkpoints(tmp_path / "r")
    assert [p.name for p in ckpts] == ["step_00000004", "step_00000006", "step_00000008"]
    assert not list((tmp_path / "r" / "checkpoints").glob("*.tmp"))
    for name in ("model.safetensors", "optimizer.safetensors", "state.json", "tokenizer.json"):
        assert (ckpts[-1] / name).is_file()
    assert result.averaged_checkpoint is not None
    averaged = load_checkpoint(result.averaged_checkpoint)
    # tied weights stay tied
    assert averaged.model.output_proj.weight is averaged.model.decoder.embedder.embedding.weight
    assert averaged.model.encoder.embedder.embedding is averaged.model.decoder.embedder.embedding
    tensors = [load_file(str(p / "model.safetensors")) for p in ckpts]
    name = "decoder.layers.0.feed_forward.linear1.weight"
    mean = sum(t[name] for t in tensors) / 3
    torch.testing.assert_close(averaged.model.state_dict()[name], mean)
    assert (tmp_path / "r" / "metrics.jsonl").is_file() and (
        tmp_path / "r" / "curves.png"
    ).is_file()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_stay_finite(
    tmp_path: Path, reverse_task: Task, make_run: MakeRun, precision: str
) -> None:
    """The autocast path (bf16, fp16 with loss scaling) runs and keeps parameters finite."""
    train = reverse_task(tmp_path, 100, seed=1)
    trainer = Trainer(
        make_run(tmp_path / "r", train, max_steps=2, max_tokens=120, precision=precision)
    )
    assert trainer.scaler.is_enabled() == (precision == "fp16")
    result = trainer.fit()
    assert result.steps == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.mark.skipif(
    not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")),
    reason="torch.compile on CPU needs a C++ compiler",
)
def test_compiled_step_matches_eager(tmp_path: Path, reverse_task: Task, make_run: MakeRun) -> None:
    """train.compile=True: same loss and gradients as the eager step (dropout off)."""
    train = reverse_task(tmp_path, 100, seed=1)
    grads = []
    for name, compile_ in (("eager", False), ("compiled", True)):
        trainer = Trainer(make_run(tmp_path / name, train, max_steps=1, compile=compile_))
        assert (trainer.train_model._compiled_call_impl is not None) == compile_
        trainer.train_model.eval()
        batch = trainer.data.train.collate(range(12))
        loss, _ = trainer.accumulate_gradients([batch], batch.num_tgt_tokens)
        grads.append((loss, {n: p.grad for n, p in trainer.model.named_parameters()}))
    (loss_a, a), (loss_b, b) = grads
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-5)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
