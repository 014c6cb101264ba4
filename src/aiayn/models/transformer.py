"""The encoder–decoder Transformer of "Attention Is All You Need" (§3, Figure 1), in one file.

    src ─ Embedding×√D + PE ─ Dropout ─ N × EncoderLayer ─(norm)─ memory
    tgt ─ Embedding×√D + PE ─ Dropout ─ N × DecoderLayer(memory) ─(norm)─ Linear ─ log-softmax

Shape legend:
    B  batch size        S  source length        T  target length (new positions)
    D  d_model           H  heads                V  vocabulary size
    L  target positions already decoded (incremental decoding)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from aiayn.attention import CAUSAL, Mask, decoder_self_attention_mask, padding_mask
from aiayn.config import TransformerConfig
from aiayn.layers import (
    DecoderLayer,
    DecoderLayerCache,
    Dropout,
    EncoderLayer,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
)


def build_positional(config: TransformerConfig) -> nn.Module:
    """The positional encoding the config names: sinusoidal (§3.5), learned, or none."""
    if config.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, config.max_len)
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.d_model, config.max_len)
    return NoPositionalEncoding()


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


class Encoder(nn.Module):
    """The encoder stack (§3.1): embeddings + positions, then N identical layers.

    Args:
        config: model hyper-parameters.
        embedding: the token embedding to use (passed in so it can be shared, §3.4).
    """

    def __init__(self, config: TransformerConfig, embedding: TokenEmbedding):
        super().__init__()
        self.embedding = embedding
        self.positional = build_positional(config)
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_encoder_layers))
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        )

    def forward(
        self, src: Tensor, src_mask: Tensor | None = None, *, need_weights: bool = False
    ) -> EncoderOutput:
        """Args:
        src: (B, S) source token ids.
        src_mask: (B, 1, 1, S) source padding mask, True = real token.
        """
        x = self.dropout(self.positional(self.embedding(src)))  # (B, S, D)
        weights: list[Tensor] | None = [] if need_weights else None
        for layer in self.layers:
            x, w = layer(x, src_mask, need_weights=need_weights)  # (B, S, D)
            if weights is not None and w is not None:
                weights.append(w)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOutput(x, weights)


class Decoder(nn.Module):
    """The decoder stack (§3.1): embeddings + positions, N layers over the encoder output.

    Args:
        config: model hyper-parameters.
        embedding: the target token embedding (possibly shared with the encoder's, §3.4).
    """

    def __init__(self, config: TransformerConfig, embedding: TokenEmbedding):
        super().__init__()
        self.embedding = embedding
        self.positional = build_positional(config)
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_decoder_layers))
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        )

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
        x = self.dropout(self.positional(self.embedding(tgt), offset))  # (B, T, D)
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
        return DecoderOutput(x, new_cache, self_w, cross_w)


class Transformer(nn.Module):
    """Encoder–decoder Transformer (§3) with shared/tied embeddings (§3.4).

    ``forward(src, tgt_in)`` returns log-probabilities (B, T, V) of the next target token at
    every position; ``encode`` and ``decode`` expose the two halves for decoding.
    """

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
        self.encoder = Encoder(c, src_embedding)
        self.decoder = Decoder(c, tgt_embedding)
        self.output_proj = nn.Linear(c.d_model, c.target_vocab_size, bias=False)  # (D, V)
        if c.tie_output:
            self.output_proj.weight = tgt_embedding.weight  # §3.4: pre-softmax = embedding matrix
        else:
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=c.d_model**-0.5)

    def source_mask(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (B, 1, 1, S) padding mask, True = real token."""
        return padding_mask(src, self.config.pad_id)

    def target_mask(self, tgt: Tensor, offset: int = 0) -> Mask:
        """Mask of masked decoder self-attention for (B, T) target ids at ``offset``.

        A whole prefix (offset 0): causal AND target padding, (B, 1, T, T). During incremental
        decoding (offset > 0) only the causal part, left unbuilt (``CAUSAL``): the cached
        positions are not known here, and decoders never feed padding as a prefix.
        """
        if offset > 0:
            return CAUSAL
        return decoder_self_attention_mask(tgt, self.config.pad_id)  # (B, 1, T, T)

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

    def log_probs(self, hidden: Tensor) -> Tensor:
        """The final linear layer and (log-)softmax (§3.4): (B, T, D) -> (B, T, V)."""
        return torch.log_softmax(self.output_proj(hidden).float(), dim=-1)

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
