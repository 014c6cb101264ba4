"""The training objectives as modules: teacher forcing + label-smoothed cross-entropy (§5.4) for
translation, next-token cross-entropy for a language model.

Training calls this module, not the model, so that DDP/FSDP wrap the whole step's forward. It
differs from ``log_probs = model(src, tgt_in)`` followed by :func:`label_smoothed_nll` only in
speed: the final linear layer (§3.4) runs at the non-pad target positions alone, fused with the
log-softmax and the loss (:func:`linear_label_smoothed_cross_entropy`), and masked decoder
self-attention uses the causal kernel (:data:`~aiayn.attention.CAUSAL`).

:class:`LanguageModelObjective` is the same for a decoder-only model (GPT-2): blocks have no
padding, so every position is a target and the causal kernel needs no mask at all.

Shape legend:
    B batch   S source length   T target length   D d_model   V vocabulary
    N non-pad target positions of the batch
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.attention import CAUSAL
from aiayn.evaluation.perplexity import next_token_loss
from aiayn.layers.loss import LossSums, label_smoothed_nll, linear_label_smoothed_cross_entropy
from aiayn.models import GPT2
from aiayn.models.transformer import EncoderDecoder


class TranslationObjective(nn.Module):
    """Σ label-smoothed CE of a batch under teacher forcing.

    Args:
        model: the encoder–decoder being trained (its parameters are this module's).
        label_smoothing: ε_ls of the loss (0.1 in §5.4; a training setting, not the model's).
    """

    def __init__(self, model: EncoderDecoder, label_smoothing: float = 0.1):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, num_tgt_tokens: int
    ) -> LossSums:
        """Args:
        src: (B, S) source ids.
        tgt_in: (B, T) decoder inputs (BOS y_1 … y_{T-1}).
        tgt_out: (B, T) gold next tokens (y_1 … EOS), padded with ``pad_id``.
        num_tgt_tokens: N, the non-pad entries of ``tgt_out`` (known on the host, so selecting
            them needs no device-to-host sync).
        """
        m, config = self.model, self.model.config
        src_mask = m.source_mask(src)  # (B, 1, 1, S)
        memory = m.encoder(src, src_mask).memory  # (B, S, D)
        # CAUSAL instead of causal + target padding: padding is on the right, so a real query
        # never sees a pad key either way; pad queries' outputs differ but are dropped below.
        hidden = m.decoder(tgt_in, memory, CAUSAL, src_mask).hidden  # (B, T, D)
        real = (tgt_out != config.pad_id).reshape(-1)  # (B·T,)
        keep = torch.nonzero_static(real, size=num_tgt_tokens)[:, 0]  # (N,) flat positions
        hidden = hidden.reshape(-1, hidden.size(-1)).index_select(0, keep)  # (B·T, D) -> (N, D)
        gold = tgt_out.reshape(-1).index_select(0, keep)  # (N,)
        return output_loss(m, hidden, gold, self.label_smoothing)


def output_loss(model: EncoderDecoder, hidden: Tensor, gold: Tensor, epsilon: float) -> LossSums:
    """The loss of (N, D) final decoder states against (N,) gold ids through the model's output
    layer (§3.4). Without an output bias, fused with the log-softmax a chunk of positions at a
    time (:func:`linear_label_smoothed_cross_entropy`); with one (Marian's logits bias), through
    the model's own ``log_probs``."""
    if model.output_proj.bias is not None:
        log_probs = model.log_probs(hidden)  # (N, D) @ (D, V) + b -> (N, V)
        return label_smoothed_nll(log_probs[None], gold[None], epsilon, pad_id=-1)  # no pad here
    if model.output_scale != 1.0:
        hidden = hidden * model.output_scale  # T5 v1.0's d_model^−½
    # the output projection (N, D) @ (D, V) happens inside, a chunk of positions at a time
    return linear_label_smoothed_cross_entropy(hidden, model.output_proj.weight, gold, epsilon)


class LanguageModelObjective(nn.Module):
    """Σ next-token cross-entropy of a batch of blocks, label-smoothed by ε (0: plain).

    Args:
        model: the GPT-2 language model being trained (its parameters are this module's).
        label_smoothing: ε_ls of the loss (0 by default for language models).
    """

    def __init__(self, model: GPT2, label_smoothing: float = 0.0):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, inputs: Tensor, targets: Tensor) -> LossSums:
        """Args:
        inputs: (B, T) block tokens but the last (no padding).
        targets: (B, T) the next token at each position (block tokens but the first).
        """
        return next_token_loss(self.model, inputs, targets, self.label_smoothing)
