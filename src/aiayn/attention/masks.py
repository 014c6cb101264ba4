"""Attention masks: the one place where masks are built.

Convention, everywhere in aiayn: a mask is a **boolean** tensor, ``True`` = the query may attend
to that key, ``False`` = blocked. Masks are broadcastable to the attention scores' shape
``(B, H, T, S)``. The value written into blocked scores comes from the scores' dtype
(:func:`mask_fill_value`), never from a literal such as ``-1e9``.

One stand-in is allowed where a mask tensor is: :data:`CAUSAL`, the causal mask of §3.2.3 left
unbuilt (:class:`Causal`), so that attention can call a causal kernel (``is_causal=True`` of
``F.scaled_dot_product_attention``: flash attention on GPUs, half the blocks on CPU) instead of
reading a (T, S) tensor. ``Causal.build`` gives the same mask as :func:`causal_mask`.

Shape legend:
    B  batch size
    H  attention heads (masks use 1 here and broadcast)
    T  query length (target length in the decoder)
    S  key length (source length, or T for self-attention)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import torch
from torch import Tensor


@dataclass(frozen=True)
class Causal:
    """The causal mask, unbuilt: each query may attend to keys at its position and before.

    The T queries are the last T of the S key positions (bottom-right aligned, so it also holds
    for incremental decoding where S = L + T).
    """

    def build(self, query_len: int, key_len: int, device: torch.device | None = None) -> Tensor:
        """The (1, 1, T, S) boolean tensor, equal to ``causal_mask(T, S, offset=S - T)``."""
        return causal_mask(query_len, key_len, offset=key_len - query_len, device=device)


CAUSAL = Causal()
"""Pass as a mask: causal self-attention without building the mask tensor."""

Mask: TypeAlias = Tensor | Causal | None
"""What attention accepts as a mask: a boolean tensor (True = may attend), CAUSAL, or None."""


def mask_fill_value(dtype: torch.dtype) -> float:
    """The score given to blocked positions: the most negative finite value of ``dtype``.

    §3.2.3 sets illegal connections to −∞ before the softmax; the finite minimum keeps a fully
    blocked row free of ``inf - inf = NaN`` while still giving blocked keys zero weight.
    """
    return torch.finfo(dtype).min


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask: True where ``tokens`` is a real token.

    Args:
        tokens: (B, S) token ids.
        pad_id: id of the padding token.

    Returns:
        (B, 1, 1, S) boolean mask, True = may attend.
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (B, S), got shape {tuple(tokens.shape)}")
    return (tokens != pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def lengths_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Key-padding mask from sequence lengths: True at positions ``< lengths[b]``.

    Args:
        lengths: (B,) integer lengths.
        max_len: S, the padded length.

    Returns:
        (B, 1, 1, S) boolean mask, True = may attend.
    """
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def causal_mask(
    query_len: int,
    key_len: int | None = None,
    *,
    offset: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """Causal ("future") mask of §3.2.3: query position i may attend to key positions j ≤ i.

    With incremental decoding the queries are positions ``offset .. offset + T - 1`` of a sequence
    whose keys are positions ``0 .. S - 1``; by default ``S = offset + T``.

    Returns:
        (1, 1, T, S) boolean mask, True = may attend.
    """
    if key_len is None:
        key_len = offset + query_len
    q_pos = torch.arange(offset, offset + query_len, device=device)  # (T,)
    k_pos = torch.arange(key_len, device=device)  # (S,)
    return (k_pos[None, :] <= q_pos[:, None])[None, None, :, :]  # (T, S) -> (1, 1, T, S)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of masks (a position is allowed only if every mask allows it).

    ``None`` entries mean "no constraint" and are skipped; returns None if all are None.
    The result broadcasts the inputs, e.g. (B, 1, 1, S) & (1, 1, T, S) -> (B, 1, T, S).
    """
    result: Tensor | None = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError(f"masks must be boolean (True = may attend), got {mask.dtype}")
        result = mask if result is None else result & mask
    return result


def decoder_self_attention_mask(tgt_tokens: Tensor, pad_id: int) -> Tensor:
    """Mask for masked decoder self-attention: causal AND target key-padding.

    Args:
        tgt_tokens: (B, T) decoder input tokens, the whole prefix (position 0 first).
        pad_id: padding id.

    Returns:
        (B, 1, T, T) boolean mask, True = may attend.
    """
    t = tgt_tokens.size(1)
    mask = combine_masks(
        padding_mask(tgt_tokens, pad_id),  # (B, 1, 1, T)
        causal_mask(t, device=tgt_tokens.device),  # (1, 1, T, T)
    )
    assert mask is not None
    return mask


def decoder_only_mask(key_padding: Tensor | None, query_len: int) -> Mask:
    """Mask of a decoder-only model's self-attention: causal AND key padding.

    The T queries are the last T of the S = L + T key positions (incremental decoding appends
    them to L cached ones).

    Args:
        key_padding: (B, S) boolean, True = a real token (left-padded prompts have False first);
            None = no padding anywhere.
        query_len: T.

    Returns:
        :data:`CAUSAL` when there is no padding, else a (B, 1, T, S) boolean mask.
    """
    if key_padding is None:
        return CAUSAL
    s = key_padding.size(1)
    mask = combine_masks(
        key_padding[:, None, None, :],  # (B, S) -> (B, 1, 1, S)
        causal_mask(query_len, s, offset=s - query_len, device=key_padding.device),  # (1,1,T,S)
    )
    assert mask is not None
    return mask


def positions_from_padding(key_padding: Tensor) -> Tensor:
    """Each token's position counted from its row's first real token: (B, S) -> (B, S) ids.

    Pad positions get 0 (they are never attended to). A left-padded prompt thus gets the
    positions it has alone, as Hugging Face ``generate`` computes them from its attention mask.
    """
    return (key_padding.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, S)
