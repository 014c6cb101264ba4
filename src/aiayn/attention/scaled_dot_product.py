"""Scaled dot-product attention, eq. (1) of §3.2.1: softmax(Q Kᵀ / √d_k) V.

Generalised for the descendants: softmax(scale · Q Kᵀ + bias) V, where ``scale`` defaults to the
paper's 1/√d_k (T5 uses 1: its initialisation absorbs it) and ``bias`` is an optional additive
float term on the scores (T5's relative position bias, computed once per stack).

Shape legend:
    B  batch size          H  heads
    T  query length        S  key/value length
    d_k  query/key size    d_v  value size

Masks follow :mod:`aiayn.attention.masks`: boolean, True = may attend, broadcastable to
(B, H, T, S), or :data:`~aiayn.attention.masks.CAUSAL` (the causal mask, unbuilt). A query row
whose keys are all blocked returns a zero vector (and zero weights), never NaN, on every path
and in every floating dtype.

Paths, all held to the explicit one (:func:`_explicit_attention`) by tests: aiayn's own kernel
(:mod:`aiayn.kernels.attention`) for the short queries of decoding steps on CPU, PyTorch's fused
kernel, and the explicit ops; :class:`~aiayn.settings.PerformanceSettings` sets where each one
takes over (docs/performance.md, "Tuned thresholds").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.attention.masks import Causal, Mask, mask_fill_value
from aiayn.kernels.attention import native_attend
from aiayn.settings import performance


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Mask = None,
    *,
    bias: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + bias) V  (eq. 1, with an optional bias).

    Paths that agree: with ``need_weights=True`` the explicit path computes and returns the
    weights; otherwise a few queries on CPU without gradients run on aiayn's kernel
    (:func:`_native`), and the rest on :func:`torch.nn.functional.scaled_dot_product_attention`
    (fused kernels; flash attention on GPUs) or, where they are faster, the explicit ops.

    Args:
        query: (B, H, T, d_k).
        key: (B, H, S, d_k).
        value: (B, H, S, d_v).
        mask: boolean, broadcastable to (B, H, T, S); True = may attend. None = attend everywhere.
            ``CAUSAL``: the causal mask; with T = S and no weights requested it is never built
            (``is_causal=True``, no fully blocked rows to mend).
        bias: additive float scores, broadcastable to (B, H, T, S), or None. Blocked positions
            stay blocked whatever their bias.
        scale: multiplies Q Kᵀ; None = 1/√d_k (the paper).
        dropout_p: dropout on the attention weights (0 in the paper; pass 0 at eval time).
        need_weights: return the (B, H, T, S) attention weights as well.

    Returns:
        ``(output, weights)``: output (B, H, T, d_v); weights (B, H, T, S) or None.
    """
    if not need_weights and dropout_p == 0.0:
        native = _native(query, key, value, mask, bias, scale)
        if native is not None:
            return native, None
    if isinstance(mask, Causal):
        t, s = query.size(-2), key.size(-2)
        if t == s and not need_weights and bias is None and not _cpu_dropout(query, dropout_p):
            return _fused(query, key, value, None, dropout_p, scale, is_causal=True), None
        # one new query (incremental decoding) sees every key: nothing to mask
        mask = None if t == 1 else mask.build(t, s, query.device)  # (1, 1, T, S)
    mask, row_has_key = _mend_blocked_rows(mask)
    weights: Tensor | None = None
    if need_weights:
        output, weights = _explicit_attention(query, key, value, mask, bias, scale, dropout_p)
    elif _explicit_is_faster(query, key, dropout_p) or _cpu_dropout(query, dropout_p):
        output, _ = _explicit_attention(query, key, value, mask, bias, scale, dropout_p)
    else:
        output = _fused(query, key, value, _float_mask(mask, bias, query.dtype), dropout_p, scale)
    if row_has_key is not None:
        output = output * row_has_key  # (B, H, T, d_v): zero the fully blocked rows
        if weights is not None:
            weights = weights * row_has_key  # (B, H, T, S)
    return output, weights


def _native(
    query: Tensor, key: Tensor, value: Tensor, mask: Mask, bias: Tensor | None, scale: float | None
) -> Tensor | None:
    """Attention on aiayn's kernel (:mod:`aiayn.kernels.attention`), (B, H, T, d_v), for the
    calls it takes, else None (the caller's other paths run): float32 CPU operands (B, H, ·, ·)
    without gradients, the queries of a decoding step (one, or up to
    ``native_attention_max_queries`` over more keys: a sentence's beams over its source, new
    positions over a cache), a boolean mask, CAUSAL with one query (it sees every key) or none,
    and a float32 bias or none. Fully blocked rows come out as zeros from the kernel itself.

    Whole sequences (T = S: encoders, teacher forcing) keep PyTorch's kernels, the ones aiayn's
    encoder fast path (:mod:`aiayn.inference.encoder`) calls, so that a model's forward and
    that path stay equal bit for bit (int8 layers re-quantise each attention output, where a
    last-bit difference can move a value by a quantisation step)."""
    cut = performance()
    if query.ndim != 4 or query.dtype is not torch.float32 or not query.is_cpu:
        return None
    t = query.size(2)
    if t > cut.native_attention_max_queries or (t > 1 and t >= key.size(2)):
        return None
    if key.dtype is not torch.float32 or value.dtype is not torch.float32:
        return None
    if key.ndim != 4 or value.ndim != 4 or not (key.is_cpu and value.is_cpu):
        return None
    if torch.is_grad_enabled() and (
        query.requires_grad
        or key.requires_grad
        or value.requires_grad
        or (bias is not None and bias.requires_grad)
    ):
        return None
    if isinstance(mask, Causal):
        if t != 1:
            return None
        mask = None  # the one new query is the last position: every key is allowed
    elif mask is not None and (mask.dtype is not torch.bool or not mask.is_cpu or mask.ndim > 4):
        return None
    if bias is not None and (bias.dtype is not torch.float32 or not bias.is_cpu or bias.ndim > 4):
        return None
    attend = native_attend()  # built on the first call that needs it
    if attend is None:
        return None
    return attend(  # (B, H, T, d_v)
        query, key, value, mask, bias, scale, cut.native_attention_min_parallel_macs
    )


def _fused(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    scale: float | None,
    *,
    is_causal: bool = False,
) -> Tensor:
    """PyTorch's fused attention (flash attention on GPUs): (B, H, T, d_v)."""
    return F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
    )  # (B, H, T, d_v)


def _mend_blocked_rows(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """(the mask with every fully blocked row opened, which rows have an allowed key).

    A row with no allowed key would be softmax over nothing: the caller computes it with all
    keys allowed and zeroes it afterwards, so no NaN reaches the output or the gradient.
    """
    if mask is None:
        return None, None
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
    row_has_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T|1, 1)
    return mask | ~row_has_key, row_has_key


def _cpu_dropout(query: Tensor, dropout_p: float) -> bool:
    """Dropout on the attention weights on CPU: the fused kernel then falls back to PyTorch's
    unfused path with a Bernoulli draw per weight; the explicit path draws aiayn's cheaper
    dropout mask (:mod:`aiayn.dropout`, same drop rate) over the same products."""
    return dropout_p > 0 and query.device.type == "cpu"


def _explicit_is_faster(query: Tensor, key: Tensor, dropout_p: float) -> bool:
    """Whether the three plain ops (Q Kᵀ, softmax, · V) beat PyTorch's fused CPU kernel.

    They do for short queries without gradients, the shapes of decoding (the cut-offs are
    fields of :class:`~aiayn.settings.PerformanceSettings`; docs/performance.md gives the
    timings behind them):

    - many query rows of a short length (batched greedy and beam steps: B·H·T of at least
      ``explicit_attention_min_rows``, T at most ``explicit_attention_max_queries``): the fused
      kernel's blocking is made for long sequences;
    - a few queries over longer keys (2 ≤ T < S: the K beams of a sentence over its source,
      folded into K queries), from ``explicit_attention_min_folded_rows`` query rows.
    """
    b, h, t, _ = query.shape
    rows = b * h * t  # B·H·T query rows
    cut = performance()
    return (
        query.device.type == "cpu"
        and not (query.requires_grad and torch.is_grad_enabled())
        and dropout_p == 0.0
        and t <= cut.explicit_attention_max_queries
        and (
            rows >= cut.explicit_attention_min_rows
            or (2 <= t < key.size(-2) and rows >= cut.explicit_attention_min_folded_rows)
        )
    )


def _float_mask(mask: Tensor | None, bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """What the fused kernel adds to the scores: the boolean mask alone, or the bias with the
    blocked positions set to the dtype's most negative value, (B|1, H|1, T, S)."""
    if bias is None:
        return mask
    bias = bias.to(dtype)
    return bias if mask is None else bias.masked_fill(~mask, mask_fill_value(dtype))


def _explicit_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    scale: float | None,
    dropout_p: float,
) -> tuple[Tensor, Tensor]:
    """The textbook computation, step by step; returns (output, softmax weights before dropout)."""
    scores = query @ key.transpose(-2, -1)  # (B, H, T, d_k) @ (B, H, d_k, S) -> (B, H, T, S)
    if scale is None:
        scores = scores / math.sqrt(query.size(-1))  # the paper's 1/√d_k
    elif scale != 1.0:
        scores = scores * scale
    if bias is not None:
        scores = scores + bias  # (B, H, T, S) + (B|1, H|1, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, mask_fill_value(scores.dtype))
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    attended = weights
    if dropout_p > 0:
        from aiayn.dropout import dropout

        attended = dropout(weights, dropout_p)  # aiayn's mask (F.dropout on GPUs)
    output = attended @ value  # (B, H, T, S) @ (B, H, S, d_v) -> (B, H, T, d_v)
    return output, weights
