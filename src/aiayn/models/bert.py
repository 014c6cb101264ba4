"""BERT (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding"): the paper's encoder alone, bidirectional, pre-trained as a masked language model.

    tokens ─ Embedding + learned positions + TokenType ─ LayerNorm ─ Dropout
           ─ N × SelfAttentionBlock (post-norm, GELU) ─ hidden (B, S, D)
    hidden[:, 0] ─ Linear ─ tanh ─ pooled (B, D)                                  the pooler
    hidden ─ Linear ─ GELU ─ LayerNorm ─ Linear (the embedding, own bias) ─ (B, S, V)   MLM head
    pooled ─ Dropout ─ Linear ─ (B, C)                                     classification head

Differences from the paper's encoder (Vaswani et al. §3.1), each a part handed to the blocks by the
builder below: the input is the sum of token, learned position and segment ("token type")
embeddings (BERT §3, "Input/Output Representations", Figure 2), normalised by a LayerNorm before
the dropout; embeddings not scaled by √D; GELU instead of ReLU (BERT appendix A.2); ε = 1e-12.
The blocks stay post-norm, so the stack has no final norm.

Heads (``BertConfig.head``): none (the encoder, ``BertModel``); the masked-LM head of
pre-training (BERT §3.1 "Task #1", appendix A.1), whose dense + GELU + LayerNorm transform comes
from the released code and whose output layer is the word embedding with its own bias per token;
or sequence classification on the pooled [CLS] state C (BERT §4.1: softmax(C Wᵀ), W ∈ ℝ^{K×H}).
The pooler (dense + tanh on the first position's state) was trained with next-sentence
prediction (§3.1 "Task #2"); the NSP layer itself is not part of this model.

The family is :class:`BertConfig` (presets for the published sizes), the builder functions below
and :class:`BERT`; the converter is :mod:`aiayn.convert.bert`.

Shape legend:
    B batch   S sequence length   D d_model   H heads   F d_ff   V vocabulary
    P positions (max_len)   T token types   C labels   N layers
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple

import torch
from torch import Tensor, nn

from aiayn.attention import SelfAttention
from aiayn.config import ModelConfig, Presets, Published, check_heads, check_labels
from aiayn.errors import ConfigError
from aiayn.layers import (
    ACTIVATIONS,
    Dropout,
    Embedder,
    FeedForward,
    LearnedPositionalEmbedding,
    NormFactory,
    SelfAttentionBlock,
    TokenEmbedding,
    activation_fn,
    layer_norm,
)
from aiayn.models.transformer import Encoder
from aiayn.validation import (
    Choice,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Rate,
    validate,
    validated,
)

HEADS = ("none", "mlm", "classification")
"""What :class:`BERT` puts on top of the encoder: nothing, the masked-LM head, or a classifier."""


@validated("model")
@dataclass(frozen=True)
class BertConfig(ModelConfig):
    """Hyper-parameters of a BERT model (Hugging Face's names in brackets).

    Attributes:
        vocab_size: V [vocab_size]; 30522 for the uncased WordPiece vocabulary.
        max_len: P, learned positions [max_position_embeddings].
        type_vocab_size: T, segment ids (sentence A / B) [type_vocab_size].
        d_model: D [hidden_size].
        num_heads: H [num_attention_heads]; d_k = D / H.
        num_layers: N [num_hidden_layers].
        d_ff: F, inner size of the feed-forward network [intermediate_size].
        activation: of the feed-forward network and the MLM transform [hidden_act]: "gelu"
            (exact, erf), "gelu_tanh", "relu" or "silu".
        dropout: on the embeddings and each sub-layer's output [hidden_dropout_prob].
        attention_dropout: on the attention weights [attention_probs_dropout_prob].
        classifier_dropout: before the classifier; None = ``dropout`` [classifier_dropout].
        layer_norm_eps: ε of every LayerNorm [layer_norm_eps].
        pad_id: the [PAD] id (its embedding starts at zero) [pad_token_id]. Padding is told to
            the model by an explicit attention mask, not by this id.
        head: "none" [BertModel], "mlm" [BertForMaskedLM] or "classification"
            [BertForSequenceClassification].
        num_labels: C, outputs of the classification head [num_labels, len(id2label)].
        pooler: the dense + tanh pooler on the first position [add_pooling_layer];
            the classification head needs it.
        id2label: the C labels' names in order [id2label], or () for none (class indices).
    """

    vocab_size: PositiveInt = 30522
    max_len: PositiveInt = 512
    type_vocab_size: PositiveInt = 2
    d_model: PositiveInt = 768
    num_heads: PositiveInt = 12
    num_layers: NonNegativeInt = 12
    d_ff: PositiveInt = 3072
    activation: Annotated[str, Choice(tuple(ACTIVATIONS))] = "gelu"
    dropout: Rate = 0.1
    attention_dropout: Rate = 0.1
    classifier_dropout: Rate | None = None
    layer_norm_eps: PositiveFloat = 1e-12
    pad_id: NonNegativeInt = 0
    head: Annotated[str, Choice(HEADS)] = "none"
    num_labels: PositiveInt = 2
    pooler: bool = True
    id2label: tuple[str, ...] = ()  # a list read back from JSON/YAML becomes a tuple

    def __post_init__(self) -> None:
        validate(self)
        check_heads(self.d_model, self.num_heads)
        if self.pad_id >= self.vocab_size:
            raise ConfigError(f"pad_id={self.pad_id} is outside the vocabulary")
        if self.head == "classification" and not self.pooler:
            raise ConfigError("head='classification' needs pooler=True (it reads the pooled state)")
        check_labels(self.id2label, self.num_labels)

    def summary(self) -> str:
        """The architecture in one line (BERT §3's names: L, H, A as N, d_model, h)."""
        return (
            f"N={self.num_layers} d_model={self.d_model} d_ff={self.d_ff} h={self.num_heads} "
            f"vocab={self.vocab_size} head={self.head} pooler={self.pooler}"
        )

    @property
    def max_positions(self) -> int:
        """``max_len``: the learned position table's rows."""
        return self.max_len

    @property
    def classifier_rate(self) -> float:
        """P_drop before the classifier: ``classifier_dropout``, or ``dropout``."""
        return self.dropout if self.classifier_dropout is None else self.classifier_dropout


BERT_PRESETS: Presets[BertConfig] = Presets(
    "BERT",
    {
        # the published sizes (BERT §3: BASE L=12, H=768, A=12; LARGE L=24, H=1024, A=16), counted
        # as Hugging Face's BertModel (with the pooler, no head)
        "bert-base-uncased": BertConfig(),  # 109,482,240 (the paper's "110M")
        "bert-large-uncased": BertConfig(
            d_model=1024, num_heads=16, num_layers=24, d_ff=4096
        ),  # 335,141,888 (the paper's "340M")
        # for tests and demonstrations in seconds
        "bert-tiny": BertConfig(
            vocab_size=1000, max_len=128, d_model=64, num_heads=4, num_layers=2, d_ff=256
        ),
    },
    published={
        "bert-base-uncased": Published(109_482_240, 30522, "published BERT (BertModel)"),
        "bert-large-uncased": Published(335_141_888, 30522, "published BERT (BertModel)"),
    },
)

bert_preset = BERT_PRESETS.build
"""A named BERT preset (see :data:`BERT_PRESETS`), optionally with fields changed."""


def expected_bert_parameters(config: BertConfig) -> int:
    """Closed-form parameter count of :class:`BERT`:

    (V + P + T)·D + 2D             token, position and segment embeddings; their LayerNorm
    + N·(4D² + 4D)                 attention: [W^Q; W^K; W^V] and W^O with biases
    + N·(2·D·F + F + D)            feed-forward W_1, b_1, W_2, b_2
    + N·4D                         the two LayerNorms of each block
    + D² + D if pooled             the pooler
    + D² + 3D + V for "mlm"        transform dense and LayerNorm, output bias (weight tied)
    + D·C + C for "classification" the classifier
    """
    c = config
    d, f, n = c.d_model, c.d_ff, c.num_layers
    embeddings = (c.vocab_size + c.max_len + c.type_vocab_size) * d + 2 * d
    blocks = n * ((4 * d * d + 4 * d) + (2 * d * f + f + d) + 4 * d)
    pooler = d * d + d if c.pooler else 0
    head = {
        "none": 0,
        "mlm": d * d + 3 * d + c.vocab_size,
        "classification": d * c.num_labels + c.num_labels,
    }[c.head]
    return embeddings + blocks + pooler + head


# -- the family's builder: BERT's parts, from its config ------------------------------------------


def bert_layer(config: BertConfig) -> SelfAttentionBlock:
    """One BERT block: post-norm self-attention and a GELU feed-forward network (§3)."""
    c = config
    return SelfAttentionBlock(
        SelfAttention(c.d_model, c.num_heads, dropout=c.attention_dropout),
        FeedForward(c.d_model, c.d_ff, c.activation),
        layer_norm(c.layer_norm_eps),
        norm_first=False,
        dropout=c.dropout,
    )


def bert_embedder(config: BertConfig) -> Embedder:
    """Dropout(LayerNorm(token + position + segment embeddings)) (§3, Figure 2)."""
    c = config
    return Embedder(
        TokenEmbedding(c.vocab_size, c.d_model, c.pad_id, scale=1.0),
        LearnedPositionalEmbedding(c.d_model, c.max_len),
        c.dropout,
        token_types=nn.Embedding(c.type_vocab_size, c.d_model),  # (T, D)
        norm=layer_norm(c.layer_norm_eps)(c.d_model),
    )


def bert_encoder(config: BertConfig) -> Encoder:
    """The embedder and N post-norm blocks, without a final norm."""
    layers = [bert_layer(config) for _ in range(config.num_layers)]
    return Encoder(bert_embedder(config), layers, None)


class Pooler(nn.Module):
    """tanh(W h_0 + b): the first position's ([CLS]) final state, through a dense layer."""

    def __init__(self, d_model: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)  # (D, D)

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, S, D) -> (B, D)."""
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, D) @ (D, D)


class MaskedLMHead(nn.Module):
    """LayerNorm(act(W_t h + b_t)) Eᵀ + b (BERT appendix A.1 and the released code): a dense
    transform, then the output layer, whose weight the model ties to the word embedding E.

    Args:
        d_model: D.
        vocab_size: V.
        activation: a name of :data:`~aiayn.layers.ACTIVATIONS` (BERT's "gelu").
        norm: builds the transform's norm.
    """

    def __init__(self, d_model: int, vocab_size: int, activation: str, norm: NormFactory):
        super().__init__()
        self.transform = nn.Linear(d_model, d_model)  # W_t, b_t
        self.activation = activation_fn(activation)
        self.norm = norm(d_model)
        self.decoder = nn.Linear(d_model, vocab_size)  # weight (V, D): tied; bias (V,): b

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, S, D) -> (B, S, D) -> (B, S, V)."""
        x = self.norm(self.activation(self.transform(hidden)))  # (B, S, D) @ (D, D)
        return self.decoder(x)  # (B, S, D) @ (D, V)


class SequenceClassifier(nn.Module):
    """Dropout, then C = W p + b on the pooled state p (BERT §4.1)."""

    def __init__(self, d_model: int, num_labels: int, dropout: float):
        super().__init__()
        self.dropout = Dropout(dropout)
        self.linear = nn.Linear(d_model, num_labels)  # (C, D)

    def forward(self, pooled: Tensor) -> Tensor:
        """(B, D) -> (B, C) logits."""
        return self.linear(self.dropout(pooled))  # (B, D) @ (D, C)


class BertOutput(NamedTuple):
    """What :class:`BERT` returns.

    Attributes:
        hidden: (B, S, D) final states of every position.
        pooled: (B, D) the pooler's output, or None for a model without a pooler.
        weights: per layer (B, H, S, S) attention weights, if requested.
    """

    hidden: Tensor
    pooled: Tensor | None
    weights: list[Tensor] | None


class BERT(nn.Module):
    """A BERT encoder with its optional pooler and head (see the module docstring).

    ``forward(tokens, token_types, attention_mask)`` gives the final states and the pooled state;
    :meth:`mlm_logits` and :meth:`classify` apply the heads.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        c = self.config = config
        self.encoder = bert_encoder(c)
        self.pooler = Pooler(c.d_model) if c.pooler else None
        self.mlm_head: MaskedLMHead | None = None
        self.classifier: SequenceClassifier | None = None
        if c.head == "mlm":
            norm = layer_norm(c.layer_norm_eps)
            self.mlm_head = MaskedLMHead(c.d_model, c.vocab_size, c.activation, norm)
        elif c.head == "classification":
            self.classifier = SequenceClassifier(c.d_model, c.num_labels, c.classifier_rate)
        self.reset_parameters()
        if self.mlm_head is not None:  # the output layer is the word embedding (appendix A.1)
            self.mlm_head.decoder.weight = self.encoder.embedder.embedding.weight

    def reset_parameters(self) -> None:
        """BERT's initialisation (the released code): N(0, 0.02) weights and embeddings, zero
        biases, unit norms, a zero [PAD] embedding."""
        for module in self.modules():
            embedding = (nn.Embedding, TokenEmbedding, LearnedPositionalEmbedding)
            if isinstance(module, (nn.Linear, *embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        with torch.no_grad():
            self.encoder.embedder.embedding.weight[self.config.pad_id].zero_()

    def forward(
        self,
        tokens: Tensor,
        token_types: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> BertOutput:
        """Final states of every position and the pooled state.

        Args:
            tokens: (B, S) ids.
            token_types: (B, S) segment ids (0 = sentence A, 1 = sentence B); None = all 0.
            attention_mask: (B, S), true or 1 at real tokens and false or 0 at padding
                (Hugging Face's ``attention_mask``); None = no padding. A padded position's own
                state is computed but meaningless; a row with no real token gives finite values.
        """
        mask = padding_from_attention_mask(attention_mask, tokens)  # (B, 1, 1, S) or None
        out = self.encoder(tokens, mask, token_types=token_types, need_weights=need_weights)
        hidden = out.memory  # (B, S, D)
        pooled = None if self.pooler is None else self.pooler(hidden)  # (B, D)
        return BertOutput(hidden, pooled, out.self_weights)

    def pooled(self, hidden: Tensor) -> Tensor:
        """The pooler: (B, S, D) final states -> (B, D)."""
        if self.pooler is None:
            raise ValueError("this BERT has no pooler (config.pooler is False)")
        return self.pooler(hidden)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """The masked-LM head: (B, S, D) final states -> (B, S, V) logits."""
        if self.mlm_head is None:
            raise ValueError(
                f"this BERT has no masked-LM head (config.head is {self.config.head!r})"
            )
        return self.mlm_head(hidden)

    def classify(
        self,
        tokens: Tensor,
        token_types: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Sequence classification: (B, S) ids (arguments as :meth:`forward`) -> (B, C) logits."""
        if self.classifier is None:
            raise ValueError(f"this BERT has no classifier (config.head is {self.config.head!r})")
        pooled = self(tokens, token_types, attention_mask).pooled
        assert pooled is not None  # the config requires the pooler with a classifier
        return self.classifier(pooled)


def padding_from_attention_mask(attention_mask: Tensor | None, tokens: Tensor) -> Tensor | None:
    """Hugging Face's (B, S) ``attention_mask`` (1 = real) -> aiayn's (B, 1, 1, S) boolean key
    mask (True = may attend), or None."""
    if attention_mask is None:
        return None
    if attention_mask.shape != tokens.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}; the tokens have "
            f"{tuple(tokens.shape)}"
        )
    return attention_mask.bool()[:, None, None, :]  # (B, S) -> (B, 1, 1, S)
