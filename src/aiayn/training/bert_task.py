"""What BERT's two training tasks (Devlin et al. 2019: masked-LM pre-training, §3.1, in
:mod:`~aiayn.training.masked_lm`; sequence classification, §4.1, in
:mod:`~aiayn.training.text_classification`) share: the run's settings, the starting model
(:mod:`~aiayn.training.bert_start`), the tokenizer in the prepared data, the padding measure,
and the evaluation loop over length-bucketed batches of encoded texts.

Shape legend:  B examples in a batch   S positions
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data.bert_data import (
    ClassificationSet,
    EncoderBatchSampler,
    MaskedLMSet,
    padding_of,
)
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.evaluation.perplexity import EvalTally
from aiayn.layers.loss import LossSums
from aiayn.models.bert import BERT, BertConfig
from aiayn.training.bert_start import StartingBert
from aiayn.training.config import BertDataConfig, RunConfig
from aiayn.training.task import HeldOutTask, Log, print_main


class BertObjective(nn.Module):
    """What BERT's training objectives share: the model being trained (its parameters are this
    module's), refused without the head the objective reads, and ε_ls of the loss.

    Args:
        model: the BERT being trained.
        label_smoothing: ε_ls of the loss (0 by default).
    """

    head: ClassVar[str]
    """The attribute of :class:`~aiayn.models.bert.BERT` holding the head the objective reads."""
    head_title: ClassVar[str]
    """That head's name in the error for a BERT without it."""

    def __init__(self, model: BERT, label_smoothing: float = 0.0):
        super().__init__()
        if getattr(model, self.head) is None:
            raise ValueError(f"the BERT has no {self.head_title} (head {model.config.head!r})")
        self.model = model
        self.label_smoothing = label_smoothing


@dataclass
class BertData:
    """The start of a BERT task's prepared data: its tokenizer."""

    tokenizer: BertTokenizer

    @property
    def tokenizer_file(self) -> BertTokenizer:
        """What every checkpoint saves beside its weights: the BERT tokenizer."""
        return self.tokenizer


class BertTask(HeldOutTask):
    """The parts of a BERT training task that do not depend on what is learnt.

    Args:
        run: the run config (family ``bert``, a :class:`BertDataConfig` data section).
        log: prints the data reports and the final results.
    """

    model_class = BERT

    def __init__(self, run: RunConfig, log: Log = print_main):
        assert isinstance(run.model, BertConfig) and isinstance(run.data, BertDataConfig)
        self.run, self.data_cfg, self.log = run, run.data, log
        self.label_smoothing = run.train.label_smoothing or 0.0
        self._new_bert = StartingBert(run.init_from, log)

    def new_model(self, config: ModelConfig) -> BERT:
        """A freshly initialised BERT, or one holding the init_from checkpoint's weights."""
        assert isinstance(config, BertConfig)
        return self._new_bert(config)

    def padding(self, batches: Sequence[Any]) -> float:
        """Fraction of padded positions (each batch's (B, S) ``attention_mask``)."""
        return padding_of(b.attention_mask for b in batches)


@torch.no_grad()
def encoder_metrics(
    model: BERT,
    examples: MaskedLMSet | ClassificationSet,
    max_tokens: int,
    scored: Callable[[Any], tuple[LossSums, Tensor]],
    count: int,
    unit: str,
) -> dict[str, float]:
    """Loss, NLL per ``unit``, perplexity and accuracy (%) of ``model`` (eval mode) over the
    ``count`` units (targets, examples) of ``examples``, in length-bucketed batches under
    ``max_tokens``.

    Args:
        scored: a batch on the model's device -> (its Σ loss and NLL, how many of its units
            the model gets right).
    """
    device = model.encoder.embedder.embedding.weight.device
    sampler = EncoderBatchSampler(examples.texts.lengths, max_tokens, seed=0, shuffle=False)
    tally = EvalTally()
    for ids in sampler.batches(0):
        tally.add(*scored(examples.collate(ids).to(device)))
    return tally.metrics(count, unit, accuracy=True)
