"""Perplexity: exp of the mean negative log-likelihood per predicted unit (token, image…), and
the running sums an evaluation pass collects; for a decoder-only language model (GPT-2), its
next-token loss and its perplexity over a text cut into blocks (``aiayn evaluate --text`` and
the language-model task's validation).

Shape legend:  B blocks in a batch   T block length   D d_model   V vocabulary
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.data.lm import BlockBatchSampler, TextBlocks
from aiayn.layers.loss import LossSums, label_smoothed_nll, linear_label_smoothed_cross_entropy
from aiayn.layers.quantized import QuantizedLinear
from aiayn.models.gpt2 import GPT2

# exp(700) ≈ 1e304 is still a float: a diverged model's perplexity is huge, never an error
PPL_LOG_CAP = 700.0


def perplexity(nll: float) -> float:
    """exp(``nll``), the mean negative log-likelihood per unit; exp(:data:`PPL_LOG_CAP`) above
    it instead of an ``OverflowError``. ``perplexity(math.log(4)) == 4``."""
    return math.exp(min(nll, PPL_LOG_CAP))


@dataclass
class EvalTally:
    """Running sums of an evaluation pass, on the host: Σ loss and Σ NLL of each batch's
    :class:`~aiayn.layers.loss.LossSums`, and how many predictions were right (classifiers)."""

    loss: float = 0.0
    nll: float = 0.0
    correct: int = 0

    def add(self, sums: LossSums, correct: int | torch.Tensor = 0) -> None:
        """Add one batch: its loss sums and its count of right predictions."""
        self.loss += sums.loss.item()
        self.nll += sums.nll.item()
        self.correct += int(correct)

    def metrics(self, count: int, unit: str, *, accuracy: bool = False) -> dict[str, float]:
        """Loss and NLL per unit over ``count`` units (tokens, images…), the perplexity and,
        with ``accuracy``, the % right and the count right; the key ``unit`` holds ``count``."""
        n = max(count, 1)
        out = {"loss": self.loss / n, "nll": self.nll / n, "ppl": perplexity(self.nll / n)}
        if accuracy:
            out |= {"accuracy": 100.0 * self.correct / n, "correct": self.correct}
        out[unit] = count
        return out


def next_token_loss(
    model: GPT2, inputs: Tensor, targets: Tensor, label_smoothing: float = 0.0
) -> LossSums:
    """Σ next-token cross-entropy of a batch of blocks, label-smoothed by ε (0: plain), through
    the LM head fused with the loss
    (:func:`~aiayn.layers.loss.linear_label_smoothed_cross_entropy`).

    Args:
        inputs: (B, T) block tokens but the last (no padding).
        targets: (B, T) the next token at each position (block tokens but the first).
    """
    hidden = model(inputs).hidden  # (B, T, D); no key padding: the CAUSAL kernel
    hidden = hidden.reshape(-1, hidden.size(-1))  # (B, T, D) -> (B·T, D)
    gold = targets.reshape(-1)  # (B, T) -> (B·T,)
    if isinstance(model.output_proj, QuantizedLinear):  # int8 (--quantize): the layer's kernel
        return _quantized_head_loss(model.output_proj, hidden, gold, label_smoothing)
    # the LM head (B·T, D) @ (D, V) happens inside, a chunk of positions at a time
    return linear_label_smoothed_cross_entropy(
        hidden, model.output_proj.weight, gold, label_smoothing
    )


def _quantized_head_loss(
    head: QuantizedLinear, hidden: Tensor, gold: Tensor, label_smoothing: float, chunk: int = 1024
) -> LossSums:
    """The sums of :func:`next_token_loss` through an int8 LM head, ``chunk`` positions at a
    time: (N, D) states, (N,) gold ids."""
    sums = [
        label_smoothed_nll(
            torch.log_softmax(head(hidden[i : i + chunk]).float(), dim=-1),  # (chunk, V)
            gold[i : i + chunk],
            label_smoothing,
            pad_id=-1,  # blocks hold no padding
        )
        for i in range(0, hidden.size(0), chunk)
    ]
    return LossSums(*(torch.stack(column).sum() for column in zip(*sums, strict=True)))


def block_metrics(
    model: GPT2, blocks: TextBlocks, max_tokens: int, label_smoothing: float = 0.0
) -> dict[str, float]:
    """Loss, NLL per token and perplexity of ``model`` (eval mode) over all ``blocks``.

    Each block predicts its tokens after the first from the tokens before it in the block
    (:mod:`aiayn.data.lm`); the sums run over every block, in batches of
    ``max(1, max_tokens // block_size)`` blocks.
    """
    device = model.output_proj.weight.device  # an int8 head's weight buffer too
    sampler = BlockBatchSampler(blocks, max_tokens, seed=0, shuffle=False)
    tally = EvalTally()
    with torch.no_grad():
        for ids in sampler.batches(0):
            batch = blocks.collate(ids).to(device)
            tally.add(next_token_loss(model, batch.inputs, batch.targets, label_smoothing))
    return tally.metrics(blocks.num_targets, "tokens")
