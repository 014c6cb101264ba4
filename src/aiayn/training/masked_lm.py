"""Masked-LM pre-training of BERT (Devlin et al. 2019, §3.1 "Task #1: Masked LM"; family
``bert``, ``data.task: masked-lm``) with the same trainer as the other tasks.

* data: a plain text file, one example per non-blank line: ``[CLS] line [SEP]``, truncated to
  ``data.max_length`` tokens (default: the model's positions). Lines are not packed together:
  put a document on one line for a longer context. The tokenizer is a WordPiece vocabulary
  learnt from the training text, or ``model.init_from``'s (:mod:`~aiayn.training.bert_start`);
* batches: examples of similar length under ``train.max_tokens`` (padding included), padded on
  the right, the attention mask marking the real positions (:mod:`aiayn.data.bert_data`);
* objective: BERT's corruption (:func:`~aiayn.data.masking.mask_tokens`: 15% of the positions
  that are neither special nor padding are targets; 80% of them ``[MASK]``, 10% a random token,
  10% unchanged), drawn anew each epoch from the seed, the epoch and the batch's examples (so a
  resumed run draws the same); cross-entropy of the masked-LM head's logits at the targets only
  (``train.label_smoothing``, 0 by default) (:class:`MaskedLMObjective`). No next-sentence
  prediction: the model has no pooler (the masked LM does not train it);
* validation: loss, perplexity and accuracy over the targets of the validation text, drawn once
  with a fixed seed (:data:`~aiayn.data.bert_data.VALID_MASK_SEED`), so that validations compare;
  the best checkpoint has the lowest perplexity; at the end, the test text's (if any).

Shape legend:  B examples in a batch   S positions   N targets in a batch   D d_model
V vocabulary
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.data.bert_data import (
    VALID_MASK_SEED,
    EncoderBatchSampler,
    MaskedLMBatch,
    MaskedLMSet,
    encode_texts,
    read_texts,
)
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.masking import IGNORE_INDEX
from aiayn.errors import UserError
from aiayn.layers.loss import LossSums, label_smoothed_nll
from aiayn.models.bert import BERT, BertConfig
from aiayn.training.bert_start import max_length, run_tokenizer, sized_config
from aiayn.training.bert_task import BertData, BertObjective, BertTask, encoder_metrics
from aiayn.training.task import Criterion, TaskData, data_as, print_checkpoint_report


@dataclass
class MaskedLMData(BertData):
    """The tokenizer and the three texts' examples (training: masks drawn per batch;
    validation and test: drawn once)."""

    train: MaskedLMSet
    valid: MaskedLMSet
    test: MaskedLMSet | None = None


def masked_lm_sums(
    model: BERT, inputs: Tensor, attention_mask: Tensor, labels: Tensor, epsilon: float
) -> tuple[LossSums, Tensor, Tensor]:
    """(Σ loss and NLL over the targets, the targets' (N, V) logits, their (N,) gold ids).

    Args:
        inputs: (B, S) corrupted tokens.
        attention_mask: (B, S) True at real positions.
        labels: (B, S) gold ids at the targets, IGNORE_INDEX elsewhere.
    """
    hidden = model(inputs, None, attention_mask).hidden  # (B, S, D)
    targets = labels != IGNORE_INDEX  # (B, S)
    gold = labels[targets]  # (N,)
    logits = model.mlm_logits(hidden[targets])  # (N, D) -> (N, V): the head at the targets only
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (N, V), fp32 under autocast too
    # the targets as one row of N positions: (N, V) -> (1, N, V); none is excluded
    sums = label_smoothed_nll(log_probs[None], gold[None], epsilon, pad_id=IGNORE_INDEX)
    return sums, logits, gold


class MaskedLMObjective(BertObjective):
    """Σ (label-smoothed) cross-entropy of the masked-LM head at the targets of a batch.

    Args:
        model: the BERT being trained (its parameters are this module's); it needs its
            masked-LM head.
        label_smoothing: ε_ls of the loss (0 by default).
    """

    head, head_title = "mlm_head", "masked-LM head"

    def forward(self, inputs: Tensor, attention_mask: Tensor, labels: Tensor) -> LossSums:
        """Args as :func:`masked_lm_sums`."""
        return masked_lm_sums(self.model, inputs, attention_mask, labels, self.label_smoothing)[0]


def masked_lm_metrics(
    model: BERT, examples: MaskedLMSet, max_tokens: int, label_smoothing: float = 0.0
) -> dict[str, float]:
    """Loss, NLL per target, perplexity and accuracy (%, the gold token most probable) of
    ``model`` (eval mode) over all targets of ``examples`` (masks drawn once: ``fixed``), in
    length-bucketed batches under ``max_tokens``."""

    def scored(batch: MaskedLMBatch) -> tuple[LossSums, Tensor]:
        sums, logits, gold = masked_lm_sums(
            model, batch.inputs, batch.attention_mask, batch.labels, label_smoothing
        )
        return sums, (logits.argmax(dim=-1) == gold).sum()

    return encoder_metrics(model, examples, max_tokens, scored, examples.num_targets, "tokens")


class MaskedLMTask(BertTask):
    """Masked-LM pre-training of BERT (see the module docstring and :mod:`aiayn.training.task`).

    Args:
        run: the run config (family ``bert``, ``data.task: masked-lm``).
        log: prints the data reports and the final results.
    """

    criterion = Criterion(
        "ppl", "perplexity", higher_is_better=False, plot_title="validation perplexity (masked)"
    )
    data_class = MaskedLMData
    split_metrics = staticmethod(masked_lm_metrics)

    # -- data ------------------------------------------------------------------------------------
    def prepare_data(self, run_dir: Path, *, reuse_tokenizer: bool) -> MaskedLMData:
        """Read the texts, get the tokenizer, encode; validation masks drawn once."""
        d = self.data_cfg
        assert d.train is not None and d.valid is not None  # the config requires them
        files = [f for f in (d.train, d.valid, d.test) if f is not None]
        train_lines, valid_lines, *test_lines = [read_texts(f) for f in files]
        for lines, file in zip([train_lines, valid_lines, *test_lines], files, strict=True):
            if not lines:  # checked before anything is written
                raise UserError(f"{file}: no text lines")
        tokenizer = run_tokenizer(
            self.run, run_dir, lambda: train_lines, reuse=reuse_tokenizer, log=self.log
        )
        train = self._examples(tokenizer, train_lines, seed=self.run.train.seed, fixed=False)
        valid = self._examples(tokenizer, valid_lines, seed=VALID_MASK_SEED, fixed=True)
        test = None
        if test_lines:
            test = self._examples(tokenizer, test_lines[0], seed=VALID_MASK_SEED, fixed=True)
        if train.num_targets == 0 or valid.num_targets == 0:
            raise UserError(
                f"{d.train if train.num_targets == 0 else d.valid}: no token to mask (every "
                "line is empty or special tokens)"
            )
        self.log(
            f"data: {len(train)} training lines ({train.texts.ids.size} tokens, "
            f"{train.num_targets} targets an epoch), {len(valid)} validation lines "
            f"({valid.num_targets} targets); {train.texts.full} training lines fill "
            f"max_length {max_length(self.run)} (longer ones are cut)"
        )
        return MaskedLMData(tokenizer, train, valid, test)

    def _examples(
        self, tokenizer: BertTokenizer, lines: list[str], *, seed: int, fixed: bool
    ) -> MaskedLMSet:
        texts = encode_texts(tokenizer, lines, max_length=max_length(self.run))
        p = self.data_cfg.mlm_probability
        return MaskedLMSet(texts, tokenizer, seed=seed, probability=p, fixed=fixed)

    # -- model and steps -------------------------------------------------------------------------
    def model_config(self, data: TaskData) -> BertConfig:
        """The run's BERT (head ``mlm``, no pooler) sized to the vocabulary."""
        return sized_config(self.run, data_as(data, MaskedLMData).tokenizer)

    def objective(self, model: nn.Module) -> MaskedLMObjective:
        """Cross-entropy at the targets."""
        assert isinstance(model, BERT)
        return MaskedLMObjective(model, self.label_smoothing)

    def sampler(self, data: TaskData, max_tokens: int, seed: int) -> EncoderBatchSampler:
        """Length-bucketed batches under ``max_tokens``; draw ids (each epoch its masks)."""
        lengths = data_as(data, MaskedLMData).train.texts.lengths
        return EncoderBatchSampler(lengths, max_tokens, seed=seed, draw_ids=True)

    def step_inputs(self, batch: MaskedLMBatch) -> tuple[Tensor, Tensor, Tensor]:
        """(inputs, attention mask, labels) for :class:`MaskedLMObjective`."""
        return batch.inputs, batch.attention_mask, batch.labels

    def describe(self, data: TaskData) -> str:
        """The training lines."""
        return f"{len(data_as(data, MaskedLMData).train)} lines"

    # -- evaluation ------------------------------------------------------------------------------
    def metrics_line(self, metrics: dict[str, float]) -> str:
        """Loss, perplexity and accuracy at the targets."""
        return (
            f"loss {metrics['loss']:.3f} ppl {metrics['ppl']:.2f} accuracy "
            f"{metrics['accuracy']:.1f}% ({int(metrics['tokens'])} masked tokens)"
        )

    def test_line(self, test: Mapping[str, float]) -> str:
        """The test text's perplexity and accuracy."""
        return (
            f"test: perplexity {test['ppl']:.2f}, accuracy {test['accuracy']:.1f}% "
            f"over {int(test['tokens'])} masked tokens"
        )

    def report(self, result: Any) -> None:
        """Validation perplexity of the last, best and averaged checkpoints, then the test's."""
        v = result.valid
        validation = (
            f"perplexity {v['ppl']:.2f}, loss {v['loss']:.3f}, accuracy {v['accuracy']:.1f}% "
            "at the masked tokens"
        )
        print_checkpoint_report(result, validation, lambda m: f"perplexity {m['ppl']:.2f}")
