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
(the explicit reference); :func:`linear_label_smoothed_cross_entropy` takes the final decoder
states and the output projection and fuses the linear layer, the log-softmax and the loss,
chunk by chunk, with the gradient written by hand (what training runs):

    ∂loss/∂z_k = softmax(z)_k − (1 − ε)·[k = y] − ε / V      (z = logits)

so the (N, V) logits, log-probabilities and their gradients are never held whole: on CPU these
~130 MB tensors (4,096 positions × 8,000 × 4 bytes) cost more in allocation, page faults and
memory traffic than their arithmetic.

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


class _LinearLabelSmoothedCE(torch.autograd.Function):
    """logits = hidden · Wᵀ and the loss, chunk by chunk; the gradients are made in the forward.

    The loss is the last node of the graph, so its gradient with respect to each chunk's logits,
    softmax(z) − q, is known as soon as the chunk's log-softmax is: the forward multiplies it
    straight into ∂/∂hidden and ∂/∂W and drops the chunk. No (N, V) tensor ever exists; the
    backward only scales the stored gradients by the incoming one.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        epsilon: float,
        chunk: int,
        need_grad: bool,
    ) -> tuple[Tensor, Tensor]:
        vocab = weight.size(0)
        mm_dtype = (
            torch.get_autocast_dtype(hidden.device.type)
            if torch.is_autocast_enabled(hidden.device.type)
            else weight.dtype
        )
        acc = _at_least_fp32(weight.dtype)
        nll = hidden.new_zeros((), dtype=acc)
        smooth = hidden.new_zeros((), dtype=acc)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_weight: Tensor | None = None  # (V, D), from the first chunk's product on
        w = weight.to(mm_dtype)  # (V, D)
        gold_delta = hidden.new_full((chunk, 1), epsilon - 1.0, dtype=acc)  # − (1 − ε)
        for start in range(0, hidden.size(0), chunk):
            h = hidden[start : start + chunk].to(mm_dtype)  # (n, D)
            y = target[start : start + chunk, None]  # (n, 1)
            log_probs = torch.log_softmax(h @ w.t(), dim=-1, dtype=acc)  # (n, D)@(D, V) -> (n, V)
            nll -= log_probs.gather(1, y).sum()  # Σ −log p(y)
            smooth -= log_probs.sum()  # Σ_k −log p(k)
            if grad_hidden is None:
                continue
            g = log_probs.exp_().sub_(epsilon / vocab)  # (n, V): softmax(z) − ε/V
            g.scatter_add_(1, y, gold_delta[: y.size(0)])  # − (1 − ε) at the gold token
            g = g.to(mm_dtype)
            rows = grad_hidden[start : start + chunk]  # (n, D), written in place
            if rows.dtype == g.dtype:
                torch.mm(g, w, out=rows)  # (n, V) @ (V, D) -> (n, D)
            else:
                rows.copy_(g @ w)
            part = g.t() @ h  # (V, n) @ (n, D) -> (V, D)
            grad_weight = part.to(acc) if grad_weight is None else grad_weight.add_(part)
        if grad_hidden is not None and grad_weight is None:  # N = 0
            grad_weight = torch.zeros_like(weight, dtype=acc)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll)
        return (1.0 - epsilon) * nll + (epsilon / vocab) * smooth, nll

    @staticmethod
    def backward(
        ctx: Any, grad_loss: Tensor, _grad_nll: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None]:
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is None or grad_weight is None:
            raise RuntimeError("the loss was computed without gradients (no_grad or no inputs)")
        return (
            grad_hidden * grad_loss.to(grad_hidden.dtype),
            (grad_weight * grad_loss).to(ctx.weight_dtype),
            None,
            None,
            None,
            None,
        )


def linear_label_smoothed_cross_entropy(
    hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, *, chunk_size: int = 1024
) -> LossSums:
    """The loss of the module docstring for logits = hidden · Wᵀ (the final linear layer, §3.4),
    computed ``chunk_size`` positions at a time without materialising the (N, V) logits.

    Select the non-pad positions first (padding is not skipped here).

    Args:
        hidden: (N, D) final decoder states.
        weight: (V, D) output projection (the tied embedding matrix).
        target: (N,) gold token ids.
        epsilon: ε_ls in [0, 1).
        chunk_size: positions per chunk: a (chunk, V) buffer is the largest one made.

    Returns:
        :class:`LossSums`: the loss (differentiable w.r.t. hidden and weight; one backward
        pass), the NLL (detached) and N.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing epsilon must be in [0, 1), got {epsilon}")
    if hidden.dim() != 2 or weight.dim() != 2 or target.shape != hidden.shape[:1]:
        raise ValueError(
            f"expected hidden (N, D), weight (V, D) and target (N,), got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)} and {tuple(target.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    # decided here: inside Function.forward grad mode is off
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    loss, nll = _LinearLabelSmoothedCE.apply(hidden, weight, target, epsilon, chunk_size, need_grad)
    return LossSums(loss, nll, target.new_full((), target.numel()))
