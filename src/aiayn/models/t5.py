"""T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer"): the paper's encoder–decoder with pre-norm RMSNorm blocks and a relative position
bias instead of positional encodings.

    src ─ Embedding ─ Dropout ─ N × SelfAttentionBlock(+ bias_enc) ─ RMSNorm ─ Dropout ─ memory
    tgt ─ Embedding ─ Dropout ─ N × CrossAttentionBlock(memory, + bias_dec) ─ RMSNorm ─ Dropout
        ─ (× D^−½ when tied, v1.0) ─ Linear ─ softmax

Differences from the paper's Transformer (§3), each a part the builder below hands the blocks:
no positional encoding, but a learned bias per head and relative-distance bucket
(:class:`~aiayn.layers.relative_position.RelativePositionBias`), computed once per stack;
RMSNorm without bias or mean subtraction, before each sub-layer (pre-norm), and a final one per
stack; no 1/√d_k scaling of the scores (scale 1: T5 folds it into the initialisation); no bias in
any projection; h·d_kv may differ from d_model; embeddings not scaled by √d_model. T5 v1.0 uses a
ReLU feed-forward network and ties the output layer to the shared embedding, scaling the decoder
output by d_model^−½ before it; T5 v1.1 and FLAN-T5 use a gated-GELU network (tanh
approximation) and an untied output layer without that scaling.

Decoding starts from the pad token (``decoder_start_token_id`` = 0) and stops at EOS (1).

The family is :class:`T5Config` (presets for the published sizes), the builder functions below and
:class:`T5`; the converter is :mod:`aiayn.convert.t5`.

Shape legend:
    B batch   S source length   T target length (new positions)   L positions already decoded
    D d_model   H heads   d_kv size per head   F d_ff   V vocabulary
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import torch
from torch import Tensor, nn

from aiayn.attention import CAUSAL, CrossAttention, Mask, SelfAttention
from aiayn.config import ModelConfig, Presets, Published
from aiayn.errors import ConfigError
from aiayn.layers import (
    ACTIVATIONS,
    CrossAttentionBlock,
    Embedder,
    FeedForward,
    GatedFeedForward,
    NoPositionalEncoding,
    SelfAttentionBlock,
    TokenEmbedding,
    rms_norm,
)
from aiayn.layers.relative_position import RelativePositionBias
from aiayn.models.transformer import Decoder, Encoder, EncoderDecoder
from aiayn.validation import (
    Bounds,
    Choice,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Rate,
    validate,
    validated,
)


@validated("model")
@dataclass(frozen=True)
class T5Config(ModelConfig):
    """Hyper-parameters of a T5 model (Hugging Face's names in brackets).

    Attributes:
        vocab_size: V [vocab_size], shared by source and target (32128 in the releases).
        d_model: D [d_model].
        d_kv: size of each head's queries, keys and values [d_kv]; H·d_kv may differ from D.
        d_ff: F, inner size of the feed-forward network [d_ff].
        num_heads: H [num_heads].
        num_encoder_layers: N of the encoder [num_layers].
        num_decoder_layers: N of the decoder [num_decoder_layers].
        activation: of the feed-forward network: "relu" (v1.0), "gelu_tanh" (v1.1's "gelu_new"),
            "gelu", "silu" [feed_forward_proj's last part].
        gated: the gated network (act(x W_0) ⊙ x W_1) W_2 (v1.1) [feed_forward_proj "gated-…"].
        num_buckets: relative-position buckets [relative_attention_num_buckets].
        max_distance: distance from which every relative position shares the last bucket
            [relative_attention_max_distance].
        dropout: on embeddings, sub-layer outputs, attention weights, the feed-forward
            network's inner activations and the stacks' outputs [dropout_rate].
        layer_norm_eps: ε of RMSNorm [layer_norm_epsilon].
        tie_output: the output layer is the shared embedding [tie_word_embeddings].
        scale_output: decoder states × D^−½ before the output layer (v1.0, tied)
            [tie_word_embeddings in transformers 4; scale_decoder_outputs in 5].
        max_len: the longest source ``aiayn translate`` feeds without truncating (T5 has no
            position table; 512 as the released tokenizers' model_max_length).
        pad_id: padding, never attended to; also the decoder's start token [pad_token_id].
    """

    vocab_size: PositiveInt = 32128
    d_model: PositiveInt = 512
    d_kv: PositiveInt = 64
    d_ff: PositiveInt = 2048
    num_heads: PositiveInt = 8
    num_encoder_layers: NonNegativeInt = 6
    num_decoder_layers: NonNegativeInt = 6
    activation: Annotated[str, Choice(tuple(ACTIVATIONS))] = "relu"
    gated: bool = False
    num_buckets: Annotated[int, Bounds(ge=4)] = 32
    max_distance: PositiveInt = 128
    dropout: Rate = 0.1
    layer_norm_eps: PositiveFloat = 1e-6
    tie_output: bool = True
    scale_output: bool = True
    max_len: PositiveInt = 512
    pad_id: NonNegativeInt = 0

    def __post_init__(self) -> None:
        validate(self)
        if self.max_distance <= self.num_buckets // 2:
            raise ConfigError(
                f"max_distance must exceed num_buckets / 2 = {self.num_buckets // 2} (the "
                f"distances bucketed one by one), got {self.max_distance}"
            )
        if self.pad_id >= self.vocab_size:
            raise ConfigError(f"pad_id={self.pad_id} is outside the vocabulary")

    def summary(self) -> str:
        """The architecture in one line (the T5 paper's names)."""
        return (
            f"N={self.num_encoder_layers}+{self.num_decoder_layers} d_model={self.d_model} "
            f"d_ff={self.d_ff} h={self.num_heads} d_kv={self.d_kv} gated={self.gated} "
            f"vocab={self.vocab_size} tied={self.tie_output}"
        )

    @property
    def inner_dim(self) -> int:
        """H·d_kv, the width of the concatenated heads."""
        return self.num_heads * self.d_kv


def _v1_0(d_model: int, d_ff: int, heads: int, layers: int) -> T5Config:
    return T5Config(
        d_model=d_model,
        d_ff=d_ff,
        num_heads=heads,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
    )


def _v1_1(d_model: int, d_ff: int, heads: int, layers: int) -> T5Config:
    return _v1_0(d_model, d_ff, heads, layers).replace(
        activation="gelu_tanh", gated=True, tie_output=False, scale_output=False
    )


T5_PRESETS: Presets[T5Config] = Presets(
    "T5",
    {
        # the published checkpoints' shapes (T5 paper §3.7 for v1.0; FLAN-T5 = T5 v1.1 LM-adapted)
        "t5-small": _v1_0(512, 2048, 8, 6),  # 60.5M
        "t5-base": _v1_0(768, 3072, 12, 12),  # 223M
        "t5-large": _v1_0(1024, 4096, 16, 24),  # 738M
        "flan-t5-small": _v1_1(512, 1024, 6, 8),  # 77.0M
        "flan-t5-base": _v1_1(768, 2048, 12, 12),  # 248M
        "flan-t5-large": _v1_1(1024, 2816, 16, 24),  # 783M
        # for tests and demonstrations in seconds
        "t5-tiny": T5Config(
            vocab_size=1000,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_heads=4,
            num_encoder_layers=2,
            num_decoder_layers=2,
            max_len=256,
        ),
    },
    published={
        "t5-small": Published(60_506_624, 32128, "published T5"),
        "t5-base": Published(222_903_552, 32128, "published T5"),
        "flan-t5-small": Published(76_961_152, 32128, "published FLAN-T5"),
        "flan-t5-base": Published(247_577_856, 32128, "published FLAN-T5"),
    },
)

t5_preset = T5_PRESETS.build
"""A named T5 preset (see :data:`T5_PRESETS`), optionally with fields changed."""


def expected_t5_parameters(config: T5Config) -> int:
    """Closed-form parameter count of :class:`T5`:

    V·D                                  the shared embedding
    + 2·buckets·H                        one relative position bias per stack
    + N_enc·(4·D·I + D·F·(2|3) + 2D)     attention (no biases), feed-forward, two RMSNorms
    + N_dec·(8·D·I + D·F·(2|3) + 3D)     self- and cross-attention, feed-forward, three RMSNorms
    + 2D                                 the final RMSNorms
    + V·D if the output layer is untied
    with I = H·d_kv, and 3 feed-forward matrices when gated.
    """
    c = config
    d, i = c.d_model, c.inner_dim
    ff = (3 if c.gated else 2) * d * c.d_ff
    encoder = c.num_encoder_layers * (4 * d * i + ff + 2 * d)
    decoder = c.num_decoder_layers * (8 * d * i + ff + 3 * d)
    head = 0 if c.tie_output else c.vocab_size * d
    return c.vocab_size * d + 2 * c.num_buckets * c.num_heads + encoder + decoder + 2 * d + head


# -- the family's builder: T5's parts, from its config --------------------------------------------


def t5_feed_forward(config: T5Config) -> nn.Module:
    """ReLU network without biases (v1.0), or the gated one (v1.1: "gated-gelu"); both drop
    out their inner activations at ``dropout`` in training, as Hugging Face's T5 does."""
    c = config
    if c.gated:
        return GatedFeedForward(c.d_model, c.d_ff, c.activation, bias=False, dropout=c.dropout)
    return FeedForward(c.d_model, c.d_ff, c.activation, bias=False, dropout=c.dropout)


def t5_encoder_layer(config: T5Config) -> SelfAttentionBlock:
    """One encoder block: pre-RMSNorm self-attention (scale 1, no biases) and feed-forward."""
    c = config
    attn = SelfAttention(
        c.d_model, c.num_heads, head_dim=c.d_kv, dropout=c.dropout, bias=False, scale=1.0
    )
    norm = rms_norm(c.layer_norm_eps)
    return SelfAttentionBlock(attn, t5_feed_forward(c), norm, norm_first=True, dropout=c.dropout)


def t5_decoder_layer(config: T5Config) -> CrossAttentionBlock:
    """One decoder block: causal self-attention, encoder–decoder attention, feed-forward."""
    c = config
    heads = dict(head_dim=c.d_kv, dropout=c.dropout, bias=False, scale=1.0)
    return CrossAttentionBlock(
        SelfAttention(c.d_model, c.num_heads, **heads),  # type: ignore[arg-type]
        CrossAttention(c.d_model, c.num_heads, **heads),  # type: ignore[arg-type]
        t5_feed_forward(c),
        rms_norm(c.layer_norm_eps),
        norm_first=True,
        dropout=c.dropout,
    )


def t5_position_bias(config: T5Config, *, bidirectional: bool) -> RelativePositionBias:
    """The stack's relative position bias: bidirectional in the encoder, causal in the decoder."""
    c = config
    return RelativePositionBias(
        c.num_heads,
        bidirectional=bidirectional,
        num_buckets=c.num_buckets,
        max_distance=c.max_distance,
    )


_S = TypeVar("_S", Encoder, Decoder)


def _t5_stack(
    stack: type[_S],
    config: T5Config,
    embedding: TokenEmbedding,
    layer: Callable[[T5Config], nn.Module],
    num_layers: int,
    *,
    bidirectional: bool,
) -> _S:
    """A stack of ``num_layers`` blocks built by ``layer`` around the shared embedding, with its
    relative position bias, a final RMSNorm and dropout."""
    c = config
    return stack(
        Embedder(embedding, NoPositionalEncoding(), c.dropout),
        [layer(c) for _ in range(num_layers)],
        rms_norm(c.layer_norm_eps)(c.d_model),
        position_bias=t5_position_bias(c, bidirectional=bidirectional),
        final_dropout=c.dropout,
    )


def t5_encoder(config: T5Config, embedding: TokenEmbedding) -> Encoder:
    """The encoder stack around the shared embedding."""
    n = config.num_encoder_layers
    return _t5_stack(Encoder, config, embedding, t5_encoder_layer, n, bidirectional=True)


def t5_decoder(config: T5Config, embedding: TokenEmbedding) -> Decoder:
    """The decoder stack around the shared embedding."""
    n = config.num_decoder_layers
    return _t5_stack(Decoder, config, embedding, t5_decoder_layer, n, bidirectional=False)


def _refuse_float16(encoder: Encoder, args: object) -> None:
    """T5's activations overflow float16 (the released checkpoints were trained in bfloat16):
    refuse it before any work, pointing at bfloat16."""
    if encoder.embedder.embedding.weight.dtype == torch.float16:
        raise ValueError(
            "T5 overflows float16 (its activations exceed 65504 in the released checkpoints): "
            "run it in bfloat16 or float32"
        )


class T5(EncoderDecoder):
    """A T5 encoder–decoder: an :class:`~aiayn.models.transformer.EncoderDecoder`, so that
    aiayn's searches, fast step and translation commands run it unchanged.

    ``forward(src, tgt_in)`` returns log-probabilities (B, T, V); ``tgt_in`` starts with the pad
    token (T5's decoder start).
    """

    config: T5Config

    def __init__(self, config: T5Config):
        super().__init__()
        c = self.config = config
        shared = TokenEmbedding(c.vocab_size, c.d_model, scale=1.0)  # [shared]
        nn.init.normal_(shared.weight, std=1.0)  # T5's initialisation of the shared embedding
        self.encoder = t5_encoder(c, shared)
        self.decoder = t5_decoder(c, shared)
        self.output_proj = nn.Linear(c.d_model, c.vocab_size, bias=False)  # (D, V) [lm_head]
        if c.tie_output:
            self.output_proj.weight = shared.weight
        self.output_scale = c.d_model**-0.5 if c.scale_output else 1.0
        self.encoder.register_forward_pre_hook(_refuse_float16)

    def target_mask(self, tgt: Tensor, offset: int = 0) -> Mask:
        """Causal only: the decoder's first input is the pad token (its start token), so target
        padding cannot be told by id; right padding is never seen by a real position anyway."""
        return CAUSAL


def t5_position_biases(model: T5) -> dict[str, RelativePositionBias]:
    """The model's two learned relative position biases: the encoder's (bidirectional) and the
    decoder's (causal), by stack name."""
    biases = {"encoder": model.encoder.position_bias, "decoder": model.decoder.position_bias}
    return {name: bias for name, bias in biases.items() if bias is not None}
