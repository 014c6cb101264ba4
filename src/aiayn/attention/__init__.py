"""Attention: masks (§3.2.3), scaled dot-product attention (eq. 1), multi-head (§3.2.2)."""

from aiayn.attention.masks import (
    CAUSAL,
    Causal,
    Mask,
    causal_mask,
    combine_masks,
    decoder_only_mask,
    decoder_self_attention_mask,
    lengths_mask,
    mask_fill_value,
    padding_mask,
    positions_from_padding,
)
from aiayn.attention.multi_head import (
    AttentionOutput,
    CrossAttention,
    KVCache,
    MultiHeadAttention,
    SelfAttention,
)
from aiayn.attention.scaled_dot_product import scaled_dot_product_attention
from aiayn.attention.slots import SlotCache, SlotPool, SlotRows, attend_slots, select_slots

__all__ = [
    "CAUSAL",
    "AttentionOutput",
    "Causal",
    "CrossAttention",
    "KVCache",
    "Mask",
    "MultiHeadAttention",
    "SelfAttention",
    "SlotCache",
    "SlotPool",
    "SlotRows",
    "attend_slots",
    "causal_mask",
    "combine_masks",
    "decoder_only_mask",
    "decoder_self_attention_mask",
    "lengths_mask",
    "mask_fill_value",
    "padding_mask",
    "positions_from_padding",
    "scaled_dot_product_attention",
    "select_slots",
]
