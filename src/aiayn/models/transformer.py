"""The encoder–decoder Transformer of "Attention Is All You Need" (§3, Figure 1), in one file.

    src ─ Embedding×√D + PE ─ Dropout ─ N × SelfAttentionBlock ─(norm)─ memory
    tgt ─ Embedding×√D + PE ─ Dropout ─ N × CrossAttentionBlock(memory) ─(norm)─ Linear ─ softmax

The family is its config (:class:`~aiayn.config.TransformerConfig`) and the builder functions
below, which hand each block its parts; the blocks themselves read no config.

Shape legend:
    B  batch size        S  source length        T  target length (new positions)
    D  d_model           H  heads                V  vocabulary size
    L  target positions already decoded (incremental decoding)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from aiayn.attention import (
    CAUSAL,
    CrossAttention,
    Mask,
    SelfAttention,
    causal_mask,
    combine_masks,
    padding_mask,
)
from aiayn.config import TransformerConfig
from aiayn.layers import (
    CrossAttentionBlock,
    DecoderLayerCache,
    Dropout,
    Embedder,
    FeedForward,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    NormFactory,
    SelfAttentionBlock,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    layer_norm,
)
from aiayn.layers.relative_position import RelativePositionBias

# -- the family's builder: the paper's parts, from its config -------------------------------------


def build_positional(config: TransformerConfig) -> nn.Module:
    """The positional encoding the config names: sinusoidal (§3.5; interleaved as in the paper,
    or in Marian's halves), learned, or none."""
    if config.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, config.max_len)
    if config.positional == "sinusoidal-halves":
        return SinusoidalPositionalEncoding(config.d_model, config.max_len, layout="halves")
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.d_model, config.max_len)
    return NoPositionalEncoding()


def norm_factory(config: TransformerConfig) -> NormFactory:
    """LayerNorm with the config's ε (§3.1)."""
    return layer_norm(config.layer_norm_eps)


def encoder_layer(config: TransformerConfig) -> SelfAttentionBlock:
    """One encoder layer (§3.1): self-attention and the feed-forward network of eq. (2)."""
    c = config
    return SelfAttentionBlock(
        SelfAttention(c.d_model, c.num_heads, dropout=c.attention_dropout),
        FeedForward(c.d_model, c.d_ff, c.activation),
        norm_factory(c),
        norm_first=c.norm_first,
        dropout=c.dropout,
    )


def decoder_layer(config: TransformerConfig) -> CrossAttentionBlock:
    """One decoder layer (§3.1): masked self-attention, encoder–decoder attention, eq. (2)."""
    c = config
    return CrossAttentionBlock(
        SelfAttention(c.d_model, c.num_heads, dropout=c.attention_dropout),
        CrossAttention(c.d_model, c.num_heads, dropout=c.attention_dropout),
        FeedForward(c.d_model, c.d_ff, c.activation),
        norm_factory(c),
        norm_first=c.norm_first,
        dropout=c.dropout,
    )


def embedder(config: TransformerConfig, embedding: TokenEmbedding) -> Embedder:
    """Dropout(Embedding(x)·√D + PE) (§3.4, §3.5, §5.4), around a possibly shared embedding."""
    return Embedder(embedding, build_positional(config), config.dropout)


class EncoderOutput(NamedTuple):
    """memory (B, S, D), and per layer the (B, H, S, S) self-attention weights if requested."""

    memory: Tensor
    self_weights: list[Tensor] | None


class DecoderOutput(NamedTuple):
    """Decoder result.

    Attributes:
        hidden: (B, T, D) final decoder states (before the output projection).
        cache: one :class:`DecoderLayerCache` per layer, for the next incremental step.
        self_weights: per layer (B, H, T, L + T) masked self-attention weights, if requested.
        cross_weights: per layer (B, H, T, S) encoder–decoder weights, if requested.
    """

    hidden: Tensor
    cache: list[DecoderLayerCache]
    self_weights: list[Tensor] | None
    cross_weights: list[Tensor] | None


class Stack(nn.Module):
    """What an encoder and a decoder stack (§3.1) hold: the input embedder, N blocks, then
    (pre-norm) a final norm.

    Args:
        embedder: token ids (+ token types, + positions) -> (B, S, D).
        layers: the N blocks.
        final_norm: the stack's last norm (pre-norm models), or None.
        position_bias: a relative position bias (T5), computed once per pass for every layer's
            (self-)attention scores, or None.
        final_dropout: P_drop after the final norm (T5), 0 for none.
    """

    def __init__(
        self,
        embedder: Embedder,
        layers: Sequence[nn.Module],
        final_norm: nn.Module | None,
        *,
        position_bias: RelativePositionBias | None = None,
        final_dropout: float = 0.0,
    ):
        super().__init__()
        self.embedder = embedder
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.position_bias = position_bias
        self.final_dropout = Dropout(final_dropout)


class Encoder(Stack):
    """An encoder stack (§3.1): the input embedder, then N self-attention blocks
    (:class:`SelfAttentionBlock`), then (pre-norm) a final norm. Args as :class:`Stack`; the
    position bias is added to every layer's attention scores.
    """

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        *,
        token_types: Tensor | None = None,
        need_weights: bool = False,
    ) -> EncoderOutput:
        """Args:
        src: (B, S) source token ids.
        src_mask: (B, 1, 1, S) source padding mask, True = real token; None = no padding.
        token_types: (B, S) segment ids for an embedder with token types (BERT), or None.
        """
        if token_types is None:
            x = self.embedder(src)  # (B, S, D)
        else:
            x = self.embedder(src, token_types=token_types)  # (B, S, D)
        s = x.size(1)
        bias = None if self.position_bias is None else self.position_bias(s, s)  # (1, H, S, S)
        weights: list[Tensor] | None = [] if need_weights else None
        for layer in self.layers:
            out = layer(x, src_mask, bias=bias, need_weights=need_weights)
            x = out.output  # (B, S, D)
            if weights is not None and out.weights is not None:
                weights.append(out.weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOutput(self.final_dropout(x), weights)


class Decoder(Stack):
    """A decoder stack (§3.1): the input embedder (target tokens + positions -> (B, T, D)), N
    cross-attention blocks over the encoder output (:class:`CrossAttentionBlock`), then
    (pre-norm) a final norm. Args as :class:`Stack`; the position bias is causal (T5), for
    every layer's self-attention, computed once per call for the new positions only.
    """

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        self_mask: Mask,
        memory_mask: Tensor | None,
        *,
        cache: list[DecoderLayerCache] | None = None,
        offset: int = 0,
        need_weights: bool = False,
    ) -> DecoderOutput:
        """Args:
        tgt: (B·G, T) target token ids at positions ``offset .. offset + T - 1``; G ≥ 1
            consecutive rows share one source row (the beams of a sentence), usually G = 1.
        memory: (B, S, D) encoder output (None allowed when ``cache`` is given).
        self_mask: broadcastable to (B, H, T, offset + T), True = may attend; or CAUSAL.
        memory_mask: (B, 1, 1, S) source padding mask.
        cache: per-layer state from the previous call, or None.
        offset: position of ``tgt[:, 0]``; equals the cached length L.
        """
        x = self.embedder(tgt, offset)  # (B, T, D)
        t = tgt.size(1)
        bias = None if self.position_bias is None else self.position_bias(t, offset + t, offset)
        new_cache: list[DecoderLayerCache] = []
        self_w: list[Tensor] | None = [] if need_weights else None
        cross_w: list[Tensor] | None = [] if need_weights else None
        for i, layer in enumerate(self.layers):
            out = layer(
                x,
                memory,
                self_mask,
                memory_mask,
                cache=None if cache is None else cache[i],
                self_bias=bias,  # (1, H, T, L + T) or None
                need_weights=need_weights,
            )
            x = out.output  # (B, T, D)
            new_cache.append(out.cache)
            if self_w is not None and cross_w is not None:
                assert out.self_weights is not None and out.cross_weights is not None
                self_w.append(out.self_weights)
                cross_w.append(out.cross_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return DecoderOutput(self.final_dropout(x), new_cache, self_w, cross_w)


class EncoderDecoder(nn.Module):
    """What every encoder–decoder family shares (§3, Figure 1): an :class:`Encoder`, a
    :class:`Decoder` and an output layer, and the calls aiayn's searches, trainer and commands
    make of them. A family's class builds the three parts from its config.

    ``forward(src, tgt_in)`` returns log-probabilities (B, T, V) of the next target token at
    every position; ``encode`` and ``decode`` expose the two halves for decoding.

    Attributes:
        config: the family's config (it has ``pad_id``).
        encoder, decoder: the two stacks.
        output_proj: the pre-softmax linear layer (D -> V), possibly tied to an embedding.
        output_scale: multiplies the decoder states before ``output_proj`` (1, or T5 v1.0's
            d_model^−½).
    """

    config: Any
    encoder: Encoder
    decoder: Decoder
    output_proj: nn.Linear
    output_scale: float = 1.0

    def source_mask(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (B, 1, 1, S) padding mask, True = real token."""
        return padding_mask(src, self.config.pad_id)

    def target_mask(self, tgt: Tensor, offset: int = 0) -> Mask:
        """Mask of masked decoder self-attention for (B, T) target ids at ``offset``.

        A whole prefix (offset 0): causal AND target padding, (B, 1, T, T). Position 0 holds the
        decoder's start token, which is never padding even where it has the padding id (Marian's
        ``decoder_start_token_id`` is its pad id). During incremental decoding (offset > 0) only
        the causal part, left unbuilt (``CAUSAL``): the cached positions are not known here, and
        decoders never feed padding as a prefix.
        """
        if offset > 0:
            return CAUSAL
        real = tgt != self.config.pad_id  # (B, T)
        real[:, :1] = True  # the start token
        mask = combine_masks(
            real[:, None, None, :],  # (B, 1, 1, T)
            causal_mask(tgt.size(1), device=tgt.device),  # (1, 1, T, T)
        )
        assert mask is not None
        return mask  # (B, 1, T, T)

    def encode(self, src: Tensor, *, need_weights: bool = False) -> EncoderOutput:
        """(B, S) source ids -> memory (B, S, D)."""
        return self.encoder(src, self.source_mask(src), need_weights=need_weights)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None,
        *,
        cache: list[DecoderLayerCache] | None = None,
        offset: int = 0,
        need_weights: bool = False,
    ) -> DecoderOutput:
        """Decoder states for target positions ``offset .. offset + T - 1``.

        Args:
            tgt: (B·G, T) target inputs (shifted right: they start with BOS); G ≥ 1 consecutive
                rows share one source row (beam search), usually G = 1.
            memory: (B, S, D) from :meth:`encode` (None allowed when ``cache`` is given).
            src_mask: (B, 1, 1, S) source padding mask, or None: attend to every source position.
            cache: per-layer caches returned by the previous call, for incremental decoding.
            offset: number of target positions already in ``cache``.
        """
        return self.decoder(
            tgt,
            memory,
            self.target_mask(tgt, offset),
            src_mask,
            cache=cache,
            offset=offset,
            need_weights=need_weights,
        )

    def logits(self, hidden: Tensor) -> Tensor:
        """The final linear layer (§3.4), after ``output_scale``: (B, T, D) -> (B, T, V)."""
        if self.output_scale != 1.0:
            hidden = hidden * self.output_scale
        return self.output_proj(hidden)  # (B, T, D) @ (D, V)

    def log_probs(self, hidden: Tensor) -> Tensor:
        """The final linear layer and (log-)softmax in fp32 (§3.4): (B, T, D) -> (B, T, V)."""
        return torch.log_softmax(self.logits(hidden).float(), dim=-1)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced pass.

        Args:
            src: (B, S) source ids.
            tgt: (B, T) target inputs (BOS y_1 … y_{T-1}).

        Returns:
            (B, T, V) log-probabilities of the next target token at each position.
        """
        src_mask = self.source_mask(src)
        memory = self.encoder(src, src_mask).memory  # (B, S, D)
        hidden = self.decode(tgt, memory, src_mask).hidden  # (B, T, D)
        return self.log_probs(hidden)


class Transformer(EncoderDecoder):
    """Encoder–decoder Transformer (§3) with shared/tied embeddings (§3.4); with the options of
    :class:`~aiayn.config.TransformerConfig` also Marian (OPUS-MT) models.
    """

    config: TransformerConfig

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        c = config
        src_embedding = TokenEmbedding(c.vocab_size, c.d_model, c.pad_id)
        tgt_embedding = (
            src_embedding
            if c.share_embeddings
            else TokenEmbedding(c.target_vocab_size, c.d_model, c.pad_id)
        )
        final_norm = norm_factory(c) if c.norm_first else None
        self.encoder = Encoder(
            embedder(c, src_embedding),
            [encoder_layer(c) for _ in range(c.num_encoder_layers)],
            None if final_norm is None else final_norm(c.d_model),
        )
        self.decoder = Decoder(
            embedder(c, tgt_embedding),
            [decoder_layer(c) for _ in range(c.num_decoder_layers)],
            None if final_norm is None else final_norm(c.d_model),
        )
        self.output_proj = nn.Linear(c.d_model, c.target_vocab_size, bias=c.output_bias)  # (D, V)
        if c.tie_output:
            self.output_proj.weight = tgt_embedding.weight  # §3.4: pre-softmax = embedding matrix
        else:
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=c.d_model**-0.5)
        if self.output_proj.bias is not None:  # (V,), Marian's final_logits_bias
            nn.init.zeros_(self.output_proj.bias)
