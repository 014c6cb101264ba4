"""Label-smoothed cross-entropy (§5.4, ε_ls = 0.1).

Formula (uniform smoothing over the whole vocabulary, Szegedy et al. 2016 — the same as
``torch.nn.CrossEntropyLoss(label_smoothing=ε)``): the target distribution at a position with
gold token y is

    q(k) = (1 − ε) · [k = y] + ε / V

and the loss is the cross-entropy

    −Σ_k q(k) log p(k) = (1 − ε)·(−log p(y)) + (ε / V)·Σ_k (−log p(k)).

Positions whose gold token is padding contribute nothing. Libraries differ here (fairseq spreads
ε over V − 1 classes, the Annotated Transformer over V − 2): this one is named to be compared.

Shape legend:  B batch   T target length   V vocabulary size   N = B·T
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class LossSums(NamedTuple):
    """Sums over the non-pad positions of one batch (divide by a token count to normalise).

    Attributes:
        loss: Σ label-smoothed cross-entropy (the training objective).
        nll: Σ −log p(y) (plain negative log-likelihood, for perplexity).
        tokens: number of non-pad target positions.
    """

    loss: Tensor
    nll: Tensor
    tokens: Tensor


def label_smoothed_nll(log_probs: Tensor, target: Tensor, epsilon: float, pad_id: int) -> LossSums:
    """Summed label-smoothed cross-entropy and NLL of the module docstring.

    Args:
        log_probs: (B, T, V) log-probabilities.
        target: (B, T) gold token ids; ``pad_id`` positions are excluded.
        epsilon: ε_ls in [0, 1).
        pad_id: padding id.

    Returns:
        :class:`LossSums` of 0-dim tensors (loss and nll differentiable).
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing epsilon must be in [0, 1), got {epsilon}")
    vocab = log_probs.size(-1)
    log_probs = log_probs.reshape(-1, vocab)  # (B, T, V) -> (N, V)
    target = target.reshape(-1)  # (B, T) -> (N,)
    keep = target != pad_id  # (N,)
    gold = log_probs.gather(1, target[:, None])[:, 0]  # (N,)
    nll = -(gold * keep).sum()
    smooth = -(log_probs.sum(dim=-1) * keep).sum()  # Σ_k −log p(k) over kept positions
    loss = (1.0 - epsilon) * nll + (epsilon / vocab) * smooth
    return LossSums(loss, nll.detach(), keep.sum())
