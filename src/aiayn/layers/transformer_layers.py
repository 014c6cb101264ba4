"""The two blocks every family is built from (§3.1): sub-layers wrapped in a residual
connection and a norm.

    SelfAttentionBlock:   self-attention, feed-forward          (the paper's encoder layer;
                                                                  GPT-2, BERT, ViT)
    CrossAttentionBlock:  self-attention, encoder–decoder       (the paper's decoder layer;
                          attention, feed-forward                T5, Marian)

Post-norm (the paper):  x = Norm(x + Dropout(Sublayer(x)))
Pre-norm (option):      x = x + Dropout(Sublayer(Norm(x)))

A block receives its parts — attention modules, a feed-forward module, a norm factory — and reads
no model config: a family's builder (``aiayn.models.<family>``) decides what the parts are.

Shape legend:
    B batch   S source length   T target length   D d_model   H heads   L cached length
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor, nn

from aiayn.attention import CrossAttention, KVCache, Mask, SelfAttention, SlotCache
from aiayn.dropout import Dropout
from aiayn.layers.norm import NormFactory


class SublayerConnection(nn.Module):
    """Residual connection and norm around one sub-layer (§3.1, dropout per §5.4).

    ``before`` gives the sub-layer's input; ``after`` adds its output back to the residual stream.
    """

    def __init__(self, norm: nn.Module, dropout: float, norm_first: bool):
        super().__init__()
        self.norm = norm
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def before(self, x: Tensor) -> Tensor:
        """(B, T, D) residual stream -> (B, T, D) sub-layer input."""
        return self.norm(x) if self.norm_first else x

    def after(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        """(B, T, D) residual stream + (B, T, D) sub-layer output -> new residual stream."""
        y = x + self.dropout(sublayer_out)
        return y if self.norm_first else self.norm(y)


class BlockOutput(NamedTuple):
    """A self-attention block's output (B, T, D), its self-attention weights (B, H, T, L + T) if
    requested, and the keys/values it attended to (the cache for the next decoding step)."""

    output: Tensor
    weights: Tensor | None
    cache: KVCache | SlotCache


class SelfAttentionBlock(nn.Module):
    """Self-attention, then the feed-forward network (§3.1's encoder layer).

    Args:
        self_attn: the self-attention module.
        feed_forward: the position-wise network (D -> D).
        norm: builds the block's two norms.
        norm_first: pre-norm (True) or the paper's post-norm (False).
        dropout: P_drop on each sub-layer's output (§5.4).
    """

    def __init__(
        self,
        self_attn: SelfAttention,
        feed_forward: nn.Module,
        norm: NormFactory,
        *,
        norm_first: bool,
        dropout: float,
    ):
        super().__init__()
        d = self_attn.d_model
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.attn_sublayer = SublayerConnection(norm(d), dropout, norm_first)
        self.ff_sublayer = SublayerConnection(norm(d), dropout, norm_first)

    def forward(
        self,
        x: Tensor,
        mask: Mask = None,
        *,
        cache: KVCache | SlotCache | None = None,
        bias: Tensor | None = None,
        need_weights: bool = False,
    ) -> BlockOutput:
        """Args:
            x: (B, T, D).
            mask: broadcastable to (B, H, T, L + T): source padding, causal, or CAUSAL.
            cache: keys/values (B, H, L, d_k) of earlier positions (incremental decoding).
            bias: additive attention scores broadcastable to (B, H, T, L + T), or None.

        Returns:
            (B, T, D) output, the weights if requested, and the (B, H, L + T, d_k) keys/values.
        """
        attn = self.self_attn(
            self.attn_sublayer.before(x), mask, cache=cache, bias=bias, need_weights=need_weights
        )
        x = self.attn_sublayer.after(x, attn.output)
        x = self.ff_sublayer.after(x, self.feed_forward(self.ff_sublayer.before(x)))
        return BlockOutput(x, attn.weights, attn.cache)


@dataclass(frozen=True)
class DecoderLayerCache:
    """Incremental-decoding state of one cross-attention block.

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


class CrossAttentionBlock(nn.Module):
    """Masked self-attention, encoder–decoder attention, feed-forward (§3.1's decoder layer).

    Args:
        self_attn: the (masked) self-attention module.
        cross_attn: the encoder–decoder attention module.
        feed_forward: the position-wise network (D -> D).
        norm: builds the block's three norms.
        norm_first: pre-norm (True) or the paper's post-norm (False).
        dropout: P_drop on each sub-layer's output (§5.4).
    """

    def __init__(
        self,
        self_attn: SelfAttention,
        cross_attn: CrossAttention,
        feed_forward: nn.Module,
        norm: NormFactory,
        *,
        norm_first: bool,
        dropout: float,
    ):
        super().__init__()
        d = self_attn.d_model
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.feed_forward = feed_forward
        self.self_sublayer = SublayerConnection(norm(d), dropout, norm_first)
        self.cross_sublayer = SublayerConnection(norm(d), dropout, norm_first)
        self.ff_sublayer = SublayerConnection(norm(d), dropout, norm_first)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Mask = None,
        memory_mask: Tensor | None = None,
        *,
        cache: DecoderLayerCache | None = None,
        self_bias: Tensor | None = None,
        need_weights: bool = False,
    ) -> DecoderLayerOutput:
        """Args:
        x: (B·G, T, D) decoder states of the T new positions; G ≥ 1 consecutive rows share one
            source row (the beams of a sentence), else G = 1.
        memory: (B, S, D) encoder output (may be None when ``cache`` holds its keys/values).
        self_mask: broadcastable to (B·G, H, T, L + T): causal (and target padding), or CAUSAL.
        memory_mask: broadcastable to (B, H, T, S): source padding (constant along T if G > 1).
        cache: state from earlier steps, or None for a full (training) pass.
        self_bias: additive self-attention scores (B·G|1, H, T, L + T), or None.
        """
        self_cache = None if cache is None else cache.self_attn
        cross_cache = None if cache is None else cache.cross_attn
        sa = self.self_attn(
            self.self_sublayer.before(x),
            self_mask,
            cache=self_cache,
            bias=self_bias,
            need_weights=need_weights,
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
