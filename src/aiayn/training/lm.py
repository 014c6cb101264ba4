"""The language-model task: a decoder-only model (GPT-2's architecture) learns next-token
prediction on a plain text with the same trainer as translation.

* data: one document per line, EOS after each, one stream cut into blocks of
  ``data.block_size`` targets (:mod:`aiayn.data.lm`); the tokenizer is aiayn's byte-level BPE
  learnt from the training text, or with ``model.init_from`` the checkpoint's own;
* objective: next-token cross-entropy (``train.label_smoothing``, 0 by default) through the
  fused output layer + loss, the causal kernel, no padding (:class:`LanguageModelObjective`);
* validation: loss and perplexity over every token of the validation stream but the first (the
  best checkpoint has the lowest perplexity); at the end, the test text's perplexity and a few
  greedy continuations of prompts.

Shape legend:  B blocks in a batch   T block length
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data import BOS_ID, EOS_ID, PAD_ID, Tokenizer, demo_corpus_path
from aiayn.data.corpus import read_parallel
from aiayn.data.lm import BlockBatchSampler, LMBatch, TextBlocks, read_documents, token_stream
from aiayn.data.text_tokenizer import LMTokenizer, load_lm_tokenizer
from aiayn.errors import ConfigError, UserError
from aiayn.evaluation.perplexity import block_metrics
from aiayn.models import GPT2, GPT2Config
from aiayn.training.config import LMDataConfig, RunConfig
from aiayn.training.objective import LanguageModelObjective
from aiayn.training.task import (
    Criterion,
    FinalOutputs,
    HeldOutTask,
    Log,
    TaskData,
    data_as,
    print_checkpoint_report,
    print_main,
)

DEMO_PROMPTS = {
    "en": ("I think", "Where is", "Tom said that", "The weather"),
    "de": ("Ich glaube", "Wo ist", "Tom sagte, dass", "Das Wetter"),
}
"""Prompts whose greedy continuations end a run on the built-in demo text."""

SAMPLE_TOKENS = 30
"""New tokens of each sample at the end of training."""


@dataclass
class LMData:
    """The tokenizer, the three streams as blocks, and the prompts of the final samples."""

    tokenizer: LMTokenizer
    tokenizer_file: Path
    train: TextBlocks
    valid: TextBlocks
    test: TextBlocks | None = None
    prompts: list[str] = field(default_factory=list)


def demo_documents(side: str) -> list[str]:
    """The demo corpus's sentences of ``side`` ("en", "de" or "both"), each once, file order."""
    pairs = read_parallel(demo_corpus_path())
    columns = {"en": (0,), "de": (1,), "both": (0, 1)}[side]
    lines = (pair[c] for pair in pairs for c in columns)
    return list(dict.fromkeys(line for line in lines if line.strip()))


def check_lm_run(run: RunConfig) -> None:
    """A training block fits the model's positions (``data.block_size`` ≤ ``model.max_len``)."""
    assert isinstance(run.model, GPT2Config) and isinstance(run.data, LMDataConfig)
    if run.data.block_size > run.model.max_len:
        raise ConfigError(
            f"data.block_size={run.data.block_size} exceeds the model's "
            f"max_len={run.model.max_len} positions"
        )


class LanguageModelTask(HeldOutTask):
    """Language modelling with GPT-2's architecture (see :mod:`aiayn.training.task`).

    Args:
        run: the run config (family ``gpt2``, an :class:`LMDataConfig` data section).
        log: prints the data reports and the final results.
    """

    criterion = Criterion(
        "ppl", "perplexity", higher_is_better=False, plot_title="validation perplexity"
    )
    model_class = GPT2
    data_class = LMData
    split_metrics = staticmethod(block_metrics)

    def __init__(self, run: RunConfig, log: Log = print_main):
        assert isinstance(run.model, GPT2Config) and isinstance(run.data, LMDataConfig)
        self.run, self.model_cfg, self.data_cfg, self.log = run, run.model, run.data, log
        self.label_smoothing = run.train.label_smoothing or 0.0

    # -- data ------------------------------------------------------------------------------------
    def prepare_data(self, run_dir: Path, *, reuse_tokenizer: bool) -> LMData:
        """Read the documents, get the tokenizer, make the token streams and their blocks."""
        d = self.data_cfg
        train_docs, valid_docs = self._documents()
        tokenizer, file = self._tokenizer(run_dir, train_docs, reuse_tokenizer)
        eos = self._eos_id()
        train = TextBlocks(token_stream(train_docs, tokenizer, eos), d.block_size)
        valid = TextBlocks(token_stream(valid_docs, tokenizer, eos), d.block_size, keep_tail=True)
        test = None
        if d.test_text is not None:
            stream = token_stream(read_documents(d.test_text), tokenizer, eos)
            test = TextBlocks(stream, d.block_size, keep_tail=True)
        self.log(
            f"data: {train.stream.size} training tokens in {len(train)} blocks of "
            f"{d.block_size}; {valid.num_targets} validation tokens"
        )
        if len(train) == 0 or valid.num_targets == 0:
            raise UserError(
                f"the training text needs more than data.block_size={d.block_size} tokens and "
                "the validation text at least 2"
            )
        return LMData(tokenizer, file, train, valid, test, self._prompts(valid_docs))

    def _documents(self) -> tuple[list[str], list[str]]:
        """Training and validation documents (a file, or a seeded held-out set of lines)."""
        d = self.data_cfg
        if d.train_text is None:
            docs = demo_documents(d.demo_side)
            self.log(
                f"data: built-in demo corpus {demo_corpus_path().name}, side {d.demo_side} "
                f"({len(docs)} sentences; Tatoeba, CC BY 2.0: www.manythings.org/anki and "
                "tatoeba.org)"
            )
        else:
            docs = read_documents(d.train_text)
        if d.valid_text is not None:
            return docs, read_documents(d.valid_text)
        order = np.random.default_rng(self.run.train.seed).permutation(len(docs))
        held = set(order[: d.valid_lines].tolist())
        self.log(f"data: held out {len(held)} of {len(docs)} lines for validation")
        valid = [docs[i] for i in sorted(held)]
        return [x for i, x in enumerate(docs) if i not in held], valid

    def _tokenizer(self, run_dir: Path, docs: list[str], reuse: bool) -> tuple[LMTokenizer, Path]:
        """The run's tokenizer (saved as run_dir/tokenizer.json): reloaded, the init_from
        checkpoint's, or a byte-level BPE learnt from ``docs``."""
        file = run_dir / "tokenizer.json"
        if reuse and file.is_file():
            return load_lm_tokenizer(file), file
        file.parent.mkdir(parents=True, exist_ok=True)
        if self.run.init_from is not None:
            from aiayn.checkpoint import resolve_checkpoint

            source = resolve_checkpoint(self.run.init_from) / "tokenizer.json"
            shutil.copyfile(source, file)
            tokenizer = load_lm_tokenizer(file)
            self.log(f"data: the tokenizer of {source.parent} ({tokenizer.vocab_size} tokens)")
            return tokenizer, file
        started = time.perf_counter()
        d = self.data_cfg
        bpe = Tokenizer.train(docs, d.vocab_size, min_frequency=d.min_frequency)
        bpe.save(file)
        self.log(
            f"data: byte-level BPE vocabulary of {bpe.vocab_size} tokens "
            f"({time.perf_counter() - started:.1f}s)"
        )
        return bpe, file

    def _eos_id(self) -> int:
        """The document separator: the checkpoint model's EOS, or aiayn's."""
        return self.model_cfg.eos_id if self.run.init_from is not None else EOS_ID

    def _prompts(self, valid_docs: list[str]) -> list[str]:
        """The demo's prompts, or the first three words of four validation lines."""
        if self.data_cfg.train_text is None:
            return list(DEMO_PROMPTS["de" if self.data_cfg.demo_side == "de" else "en"])
        return [" ".join(doc.split()[:3]) for doc in valid_docs[:4]]

    # -- model and steps -------------------------------------------------------------------------
    def model_config(self, data: TaskData) -> GPT2Config:
        """The run's model; from scratch with the vocabulary's size and aiayn's special ids."""
        vocab = data_as(data, LMData).tokenizer.vocab_size
        if self.run.init_from is not None:
            if vocab > self.model_cfg.vocab_size:
                raise UserError(
                    f"the tokenizer of {self.run.init_from} has {vocab} tokens, more than the "
                    f"model's vocab_size={self.model_cfg.vocab_size}"
                )
            return self.model_cfg
        return self.model_cfg.replace(vocab_size=vocab, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)

    def new_model(self, config: ModelConfig) -> GPT2:
        """A freshly initialised GPT-2, or one holding the init_from checkpoint's weights."""
        assert isinstance(config, GPT2Config)
        model = GPT2(config)
        if self.run.init_from is not None:
            from aiayn.checkpoint import load_checkpoint

            start = load_checkpoint(
                self.run.init_from, expect=GPT2, fp32_for="training (init_from)"
            )
            model.load_state_dict(start.model.state_dict())
        return model

    def objective(self, model: nn.Module) -> LanguageModelObjective:
        """Next-token cross-entropy through the fused output layer + loss."""
        assert isinstance(model, GPT2)
        return LanguageModelObjective(model, self.label_smoothing)

    def sampler(self, data: TaskData, max_tokens: int, seed: int) -> BlockBatchSampler:
        """Shuffled blocks, ``max_tokens // block_size`` a batch."""
        return BlockBatchSampler(data_as(data, LMData).train, max_tokens, seed=seed)

    def step_inputs(self, batch: LMBatch) -> tuple[Tensor, Tensor]:
        """(inputs, targets) for :class:`LanguageModelObjective`."""
        return batch.inputs, batch.targets

    def padding(self, batches: Sequence[LMBatch]) -> float:
        """0: blocks are never padded."""
        return 0.0

    def describe(self, data: TaskData) -> str:
        """The training blocks."""
        return f"{len(data_as(data, LMData).train)} blocks of {self.data_cfg.block_size} tokens"

    # -- evaluation ------------------------------------------------------------------------------
    def metrics_line(self, metrics: dict[str, float]) -> str:
        """Loss and perplexity."""
        return (
            f"loss {metrics['loss']:.3f} ppl {metrics['ppl']:.2f} ({int(metrics['tokens'])} tokens)"
        )

    def test_line(self, test: Mapping[str, float]) -> str:
        """The test text's perplexity."""
        return f"test: perplexity {test['ppl']:.2f} over {int(test['tokens'])} tokens"

    def finish(self, model: nn.Module, data: TaskData, run_dir: Path) -> FinalOutputs:
        """The test text's perplexity (if any) and greedy continuations of the prompts."""
        out = super().finish(model, data, run_dir)
        assert isinstance(model, GPT2)
        lm_data = data_as(data, LMData)
        out.samples = greedy_samples(model, lm_data.tokenizer, lm_data.prompts)
        return out

    def report(self, result: Any) -> None:
        """Validation perplexity of the last, best and averaged checkpoints, the test's, then
        the samples."""
        v = result.valid
        validation = f"perplexity {v['ppl']:.2f}, loss {v['loss']:.3f}"
        print_checkpoint_report(result, validation, lambda m: f"perplexity {m['ppl']:.2f}")
        if result.samples:
            print("\nsamples (greedy continuations of the prompts):")
            for prompt, text in result.samples:
                print(f"  {prompt!r} -> {text!r}")


def greedy_samples(
    model: GPT2, tokenizer: LMTokenizer, prompts: Sequence[str]
) -> list[tuple[str, str]]:
    """(prompt, greedy continuation) pairs by :func:`aiayn.decoding.generate.generate`: up to
    :data:`SAMPLE_TOKENS` new tokens, fewer where the model's positions run out, none past EOS."""
    from aiayn.decoding.generate import GenerateOptions, generate

    prompts = [p for p in prompts if p]
    longest = max((len(tokenizer.encode(p)) for p in prompts), default=0)
    new_tokens = min(SAMPLE_TOKENS, model.config.max_len - longest)
    if not prompts or new_tokens < 1:
        return []
    options = GenerateOptions(max_new_tokens=new_tokens, method="greedy")
    return list(zip(prompts, generate(model, tokenizer, prompts, options), strict=True))


# The built-in language-model demo (`aiayn train --demo lm`, configs/lm_demo.yaml): GPT-2's
# architecture at gpt2-tiny size on the English side of the shipped Tatoeba subset, for a few
# minutes. The context (max_len) is the block size, so that `aiayn evaluate --text` windows are
# the blocks it was trained on. Dropout 0.2: the small text is seen a dozen times, and at 0.1
# validation perplexity turned up before the end (docs/benchmarks.md). Keep configs/lm_demo.yaml
# identical (a test checks).
LM_DEMO_CONFIG: dict[str, Any] = {
    "run_dir": "runs/lm_demo",
    "model": {
        "family": "gpt2",
        "preset": "gpt2-tiny",
        "max_len": 128,
        "dropout": 0.2,
        "embedding_dropout": 0.2,
    },
    "data": {"block_size": 128, "vocab_size": 4000, "valid_lines": 500, "demo_side": "en"},
    "train": {
        "max_tokens": 2048,
        "warmup_steps": 200,
        "lr_scale": 0.5,
        "max_minutes": 5.0,
        "eval_every": 250,
        "save_every": 250,
        "log_every": 50,
        "keep_last": 3,
        "average_last": 3,
    },
}
