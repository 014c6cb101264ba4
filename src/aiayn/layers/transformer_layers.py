"""Encoder and decoder layers (§3.1): sub-layers wrapped in residual connection + LayerNorm.

Post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
Pre-norm (option):      x = x + Dropout(Sublayer(LayerNorm(x)))

Shape legend:
    B batch   S source length   T target length   D d_model   H heads   L cached length
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor, nn

from aiayn.attention import CrossAttention, KVCache, Mask, SelfAttention
from aiayn.config import TransformerConfig
from aiayn.layers.dropout import Dropout
from aiayn.layers.feed_forward import FeedForward


class SublayerConnection(nn.Module):
    """Residual connection and LayerNorm around one sub-layer (§3.1, dropout per §5.4).

    ``before`` gives the sub-layer's input; ``after`` adds its output back to the residual stream.
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def before(self, x: Tensor) -> Tensor:
        """(B, T, D) residual stream -> (B, T, D) sub-layer input."""
        return self.norm(x) if self.norm_first else x

    def after(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        """(B, T, D) residual stream + (B, T, D) sub-layer output -> new residual stream."""
        y = x + self.dropout(sublayer_out)
        return y if self.norm_first else self.norm(y)


class EncoderLayer(nn.Module):
    """Encoder layer: self-attention, then the feed-forward network (§3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.self_attn = SelfAttention(c.d_model, c.num_heads, dropout=c.attention_dropout)
        self.feed_forward = FeedForward(c.d_model, c.d_ff, c.activation)
        sub = (c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)
        self.attn_sublayer = SublayerConnection(*sub)
        self.ff_sublayer = SublayerConnection(*sub)

    def forward(
        self, x: Tensor, mask: Mask = None, *, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Args:
            x: (B, S, D).
            mask: broadcastable to (B, H, S, S), usually the (B, 1, 1, S) source padding mask.

        Returns:
            (B, S, D) output and the (B, H, S, S) self-attention weights (if requested).
        """
        attn = self.self_attn(self.attn_sublayer.before(x), mask, need_weights=need_weights)
        x = self.attn_sublayer.after(x, attn.output)
        x = self.ff_sublayer.after(x, self.feed_forward(self.ff_sublayer.before(x)))
        return x, attn.weights


@dataclass(frozen=True)
class DecoderLayerCache:
    """Incremental-decoding state of one decoder layer.

    Attributes:
        self_attn: keys/values of the L target positions decoded so far, (B·G, H, L, d_k).
        cross_attn: keys/values of the encoder output, (B, H, S, d_k), computed once per source;
            G ≥ 1 consecutive decoder rows share each source row (the beams of one sentence).
    """

    self_attn: KVCache | None
    cross_attn: KVCache

    def index_select(self, index: Tensor, source_index: Tensor | None) -> DecoderLayerCache:
        """Select/reorder rows: ``index`` (B',) into the decoder rows, ``source_index`` into the
        source rows of the cross-attention keys/values (None: keep them as they are)."""
        return DecoderLayerCache(
            None if self.self_attn is None else self.self_attn.index_select(index),
            self.cross_attn if source_index is None else self.cross_attn.index_select(source_index),
        )


class DecoderLayerOutput(NamedTuple):
    """Output (B, T, D), the cache for the next step, and attention weights if requested."""

    output: Tensor
    cache: DecoderLayerCache
    self_weights: Tensor | None
    cross_weights: Tensor | None


class DecoderLayer(nn.Module):
    """Decoder layer: masked self-attention, encoder–decoder attention, feed-forward (§3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.self_attn = SelfAttention(c.d_model, c.num_heads, dropout=c.attention_dropout)
        self.cross_attn = CrossAttention(c.d_model, c.num_heads, dropout=c.attention_dropout)
        self.feed_forward = FeedForward(c.d_model, c.d_ff, c.activation)
        sub = (c.d_model, c.dropout, c.norm_first, c.layer_norm_eps)
        self.self_sublayer = SublayerConnection(*sub)
        self.cross_sublayer = SublayerConnection(*sub)
        self.ff_sublayer = SublayerConnection(*sub)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Mask = None,
        memory_mask: Tensor | None = None,
        *,
        cache: DecoderLayerCache | None = None,
        need_weights: bool = False,
    ) -> DecoderLayerOutput:
        """Args:
        x: (B·G, T, D) decoder states of the T new positions; G ≥ 1 consecutive rows share one
            source row (the beams of a sentence), else G = 1.
        memory: (B, S, D) encoder output (may be None when ``cache`` holds its keys/values).
        self_mask: broadcastable to (B·G, H, T, L + T): causal (and target padding), or CAUSAL.
        memory_mask: broadcastable to (B, H, T, S): source padding (constant along T if G > 1).
        cache: state from earlier steps, or None for a full (training) pass.
        """
        self_cache = None if cache is None else cache.self_attn
        cross_cache = None if cache is None else cache.cross_attn
        sa = self.self_attn(
            self.self_sublayer.before(x), self_mask, cache=self_cache, need_weights=need_weights
        )
        x = self.self_sublayer.after(x, sa.output)
        ca = self.cross_attn(
            self.cross_sublayer.before(x),
            memory,
            memory_mask,
            cache=cross_cache,
            need_weights=need_weights,
        )
        x = self.cross_sublayer.after(x, ca.output)
        x = self.ff_sublayer.after(x, self.feed_forward(self.ff_sublayer.before(x)))
        return DecoderLayerOutput(x, DecoderLayerCache(sa.cache, ca.cache), sa.weights, ca.weights)
