"""Label-smoothed cross-entropy (§5.4, ε_ls = 0.1).

Formula (uniform smoothing over the whole vocabulary, Szegedy et al. 2016 — the same as
``torch.nn.CrossEntropyLoss(label_smoothing=ε)``): the target distribution at a position with
gold token y is

    q(k) = (1 − ε) · [k = y] + ε / V

and the loss is the cross-entropy

    −Σ_k q(k) log p(k) = (1 − ε)·(−log p(y)) + (ε / V)·Σ_k (−log p(k)).

Positions whose gold token is padding contribute nothing. Libraries differ here (fairseq spreads
ε over V − 1 classes, the Annotated Transformer over V − 2): this one is named to be compared.

Two implementations of the same formula: :func:`label_smoothed_nll` takes log-probabilities
(the explicit reference), :func:`label_smoothed_cross_entropy` takes logits and fuses the
log-softmax into the loss with a hand-written backward (what training runs: fewer passes over
the (N, V) logits and no (N, V) log-probability tensor). With ``lse = log Σ_k exp z_k``:

    −log p(y)          = lse − z_y
    Σ_k −log p(k)      = V·lse − Σ_k z_k
    ∂loss/∂z_k         = softmax(z)_k − (1 − ε)·[k = y] − ε / V

Shape legend:  B batch   T target length   V vocabulary size   N = B·T (or kept positions)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
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


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _FusedLabelSmoothedCE(torch.autograd.Function):
    """Σ label-smoothed CE and Σ NLL from logits; backward = softmax − smoothed target."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        z = logits.to(_at_least_fp32(logits.dtype))  # (N, V); fp32 also under bf16/fp16 autocast
        vocab = z.size(-1)
        lse = torch.logsumexp(z, dim=-1)  # (N,)
        nll = (lse - z.gather(1, target[:, None])[:, 0]).sum()  # Σ lse − z_y
        smooth = (vocab * lse - z.sum(dim=-1)).sum()  # Σ_k −log p(k) = V·lse − Σ_k z_k
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return (1.0 - epsilon) * nll + (epsilon / vocab) * smooth, nll

    @staticmethod
    def backward(
        ctx: Any, grad_loss: Tensor, _grad_nll: Tensor | None
    ) -> tuple[Tensor, None, None]:
        logits, target, lse = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.size(-1)
        grad = torch.sub(logits.to(lse.dtype), lse[:, None]).exp_()  # (N, V) softmax(z)
        grad.sub_(eps / vocab)
        grad.scatter_add_(  # − (1 − ε) at the gold token
            1, target[:, None], torch.full_like(lse, eps - 1.0)[:, None]
        )
        grad.mul_(grad_loss)
        return grad.to(logits.dtype), None, None


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float) -> LossSums:
    """The loss of the module docstring from logits, over every given position (fused).

    Select the non-pad positions first (padding is not skipped here).

    Args:
        logits: (N, V) pre-softmax scores (any float dtype; computed in fp32 or fp64).
        target: (N,) gold token ids.
        epsilon: ε_ls in [0, 1).

    Returns:
        :class:`LossSums`: the loss (differentiable), the NLL (detached) and N.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing epsilon must be in [0, 1), got {epsilon}")
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits (N, V) and target (N,), got {tuple(logits.shape)} and "
            f"{tuple(target.shape)}"
        )
    loss, nll = _FusedLabelSmoothedCE.apply(logits, target, epsilon)
    return LossSums(loss, nll, target.new_full((), target.numel()))
