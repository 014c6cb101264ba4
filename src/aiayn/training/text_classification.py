"""Fine-tuning BERT as a sequence classifier (Devlin et al. 2019, §4.1: softmax(C Wᵀ) on the
pooled ``[CLS]`` state; family ``bert``, ``data.task: classification``) with the same trainer as
the other tasks.

* data: ``label<TAB>text`` lines, or ``label<TAB>text<TAB>second text`` for pairs
  (``[CLS] A [SEP] B [SEP]``, token types 0 and 1); labels are strings, and the label set is the
  training file's, sorted: label id i is the i-th. The model config records it (``id2label``,
  ``num_labels``), so every checkpoint knows its labels; a validation or test label outside it is
  an error. Texts are truncated to ``data.max_length`` tokens (default: the model's positions).
  The tokenizer is ``model.init_from``'s (the usual case: fine-tuning a converted or pre-trained
  BERT), or a WordPiece vocabulary learnt from the training texts (:mod:`~aiayn.training.
  bert_start`);
* model: with init_from, the checkpoint's encoder and pooler; its classifier only when it was
  trained on the same labels, else a new one (fresh weights, one output per label; the log
  says so);
* batches: examples of similar length under ``train.max_tokens`` (padding included), padded on
  the right with an attention mask; one target per example;
* objective: cross-entropy of the classifier's logits (``train.label_smoothing``, 0 by
  default) (:class:`TextClassificationObjective`);
* validation: loss and accuracy (%) over the validation examples; the best checkpoint has the
  highest accuracy; at the end, the test file's (if any).

Shape legend:  B examples in a batch   S positions   C labels
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import Tensor, nn

from aiayn.data.bert_data import (
    ClassificationBatch,
    ClassificationSet,
    EncoderBatchSampler,
    LabelledText,
    encode_texts,
    label_ids,
    label_set,
    read_labelled,
)
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.errors import UserError
from aiayn.layers.loss import LossSums, label_smoothed_nll
from aiayn.models.bert import BERT, BertConfig
from aiayn.training.bert_start import max_length, run_tokenizer, sized_config
from aiayn.training.bert_task import BertData, BertObjective, BertTask, encoder_metrics
from aiayn.training.task import AccuracyTask, TaskData, data_as


@dataclass
class ClassificationData(BertData):
    """The tokenizer, the label names (sorted) and the three files' examples."""

    labels: tuple[str, ...]
    train: ClassificationSet
    valid: ClassificationSet
    test: ClassificationSet | None = None


def classification_sums(
    model: BERT, batch: ClassificationBatch, epsilon: float
) -> tuple[LossSums, Tensor]:
    """(Σ loss and NLL over the batch's examples, the (B, C) logits)."""
    logits = model.classify(batch.ids, batch.token_types, batch.attention_mask)  # (B, C)
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, C), fp32 under autocast too
    # one "position" per example: (B, C) -> (1, B, C); no padding
    return label_smoothed_nll(log_probs[None], batch.labels[None], epsilon, pad_id=-1), logits


class TextClassificationObjective(BertObjective):
    """Σ (label-smoothed) cross-entropy of the classifier's logits over a batch of texts.

    Args:
        model: the BERT being trained (its parameters are this module's); it needs its
            classifier.
        label_smoothing: ε_ls of the loss (0 by default).
    """

    head, head_title = "classifier", "classifier"

    def forward(
        self, ids: Tensor, token_types: Tensor, attention_mask: Tensor, labels: Tensor
    ) -> LossSums:
        """Args:
        ids, token_types, attention_mask: (B, S) the batch's inputs.
        labels: (B,) gold label ids.
        """
        batch = ClassificationBatch(ids, token_types, attention_mask, labels)
        return classification_sums(self.model, batch, self.label_smoothing)[0]


def classification_metrics(
    model: BERT, examples: ClassificationSet, max_tokens: int, label_smoothing: float = 0.0
) -> dict[str, float]:
    """Loss, NLL per example, perplexity and accuracy (%) of ``model`` (eval mode) over
    ``examples``, in length-bucketed batches under ``max_tokens``."""

    def scored(batch: ClassificationBatch) -> tuple[LossSums, Tensor]:
        sums, logits = classification_sums(model, batch, label_smoothing)
        return sums, (logits.argmax(dim=-1) == batch.labels).sum()

    return encoder_metrics(model, examples, max_tokens, scored, len(examples), "examples")


class TextClassificationTask(BertTask, AccuracyTask):
    """Sequence classification with BERT (see the module docstring and
    :mod:`aiayn.training.task`).

    Args:
        run: the run config (family ``bert``, ``data.task: classification``).
        log: prints the data reports and the final results.
    """

    data_class = ClassificationData
    unit = "examples"
    split_metrics = staticmethod(classification_metrics)

    # -- data ------------------------------------------------------------------------------------
    def prepare_data(self, run_dir: Path, *, reuse_tokenizer: bool) -> ClassificationData:
        """Read and check the files (before anything is written), fix the label set, get the
        tokenizer, encode."""
        d = self.data_cfg
        assert d.train is not None and d.valid is not None  # the config requires them
        train_examples = read_labelled(d.train)
        labels = label_set(train_examples, d.train)
        pairs = train_examples[0].pair is not None
        files = {k: f for k, f in (("train", d.train), ("valid", d.valid), ("test", d.test)) if f}
        read = {k: train_examples if k == "train" else read_labelled(f) for k, f in files.items()}
        ids = {k: self._label_ids(read[k], labels, files[k], pairs=pairs) for k in read}

        def texts() -> list[str]:
            return [t for e in train_examples for t in (e.text, e.pair) if t is not None]

        tokenizer = run_tokenizer(self.run, run_dir, texts, reuse=reuse_tokenizer, log=self.log)
        sets = {k: self._encode(tokenizer, read[k], ids[k], pairs=pairs) for k in read}
        counts = Counter(e.label for e in train_examples)
        shown = ", ".join(f"{label} {counts[label]}" for label in labels[:10])
        self.log(
            f"data: {len(sets['train'])} training examples of {len(labels)} labels ({shown}"
            + (f", … {len(labels) - 10} more" if len(labels) > 10 else "")
            + f"), {len(sets['valid'])} validation"
            + (f", {len(sets['test'])} test" if "test" in sets else "")
            + " examples"
            + (" (text pairs)" if pairs else "")
            + f"; {sets['train'].texts.full} training examples fill max_length "
            f"{max_length(self.run)}"
        )
        return ClassificationData(tokenizer, labels, sets["train"], sets["valid"], sets.get("test"))

    def _label_ids(
        self, examples: list[LabelledText], labels: tuple[str, ...], source: str, *, pairs: bool
    ) -> NDArray[np.int64]:
        """The label ids of ``examples`` (of the file ``source``), which must hold text pairs
        when ``pairs`` (as the training file), else single texts."""
        if (examples[0].pair is not None) != pairs:
            forms = ("single texts", "text pairs")
            raise UserError(
                f"{source} holds {forms[not pairs]}, where the training file "
                f"{self.data_cfg.train} holds {forms[pairs]}"
            )
        return label_ids(examples, labels, source)

    def _encode(
        self,
        tokenizer: BertTokenizer,
        examples: list[LabelledText],
        ids: NDArray[np.int64],
        *,
        pairs: bool,
    ) -> ClassificationSet:
        second = [e.pair or "" for e in examples] if pairs else None
        texts = encode_texts(
            tokenizer, [e.text for e in examples], second, max_length=max_length(self.run)
        )
        return ClassificationSet(texts, ids, tokenizer.pad_id)

    # -- model and steps -------------------------------------------------------------------------
    def model_config(self, data: TaskData) -> BertConfig:
        """The run's BERT (head ``classification``) with the training file's labels."""
        labels = data_as(data, ClassificationData).labels
        tokenizer = data_as(data, ClassificationData).tokenizer
        return sized_config(self.run, tokenizer, num_labels=len(labels), id2label=labels)

    def objective(self, model: nn.Module) -> TextClassificationObjective:
        """Cross-entropy of the logits."""
        assert isinstance(model, BERT)
        return TextClassificationObjective(model, self.label_smoothing)

    def sampler(self, data: TaskData, max_tokens: int, seed: int) -> EncoderBatchSampler:
        """Length-bucketed batches under ``max_tokens``."""
        lengths = data_as(data, ClassificationData).train.texts.lengths
        return EncoderBatchSampler(lengths, max_tokens, seed=seed)

    def step_inputs(self, batch: ClassificationBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(ids, token types, attention mask, labels) for :class:`TextClassificationObjective`."""
        return batch.ids, batch.token_types, batch.attention_mask, batch.labels

    # -- evaluation ------------------------------------------------------------------------------
