"""Attention: masks (§3.2.3), scaled dot-product attention (eq. 1), multi-head (§3.2.2)."""

from aiayn.attention.masks import (
    CAUSAL,
    Causal,
    Mask,
    causal_mask,
    combine_masks,
    decoder_self_attention_mask,
    lengths_mask,
    mask_fill_value,
    padding_mask,
)
from aiayn.attention.multi_head import (
    AttentionOutput,
    CrossAttention,
    KVCache,
    MultiHeadAttention,
    SelfAttention,
)
from aiayn.attention.scaled_dot_product import scaled_dot_product_attention

__all__ = [
    "CAUSAL",
    "AttentionOutput",
    "Causal",
    "CrossAttention",
    "KVCache",
    "Mask",
    "MultiHeadAttention",
    "SelfAttention",
    "causal_mask",
    "combine_masks",
    "decoder_self_attention_mask",
    "lengths_mask",
    "mask_fill_value",
    "padding_mask",
    "scaled_dot_product_attention",
]
