"""GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): the
paper's decoder without encoder–decoder attention, as a language model.

    tokens ─ Embedding + learned positions ─ Dropout ─ N × SelfAttentionBlock (pre-norm, causal)
           ─ LayerNorm ─ Linear (tied to the embedding) ─ logits

Differences from the paper's decoder (§3.1), each a part handed to the blocks by the builder
below: no cross-attention; pre-norm with a final LayerNorm (GPT-2 §2.3); GELU with the tanh
approximation; learned positions; embeddings not scaled by √d_model; the residual projections
initialised with std 0.02/√(2N) (GPT-2 §2.3).

The family is :class:`GPT2Config` (presets for the published sizes), the builder
:func:`gpt2_block` / :class:`GPT2`, and the converter :mod:`aiayn.convert.gpt2`.

Shape legend:
    B batch   T new positions   L cached positions   S = L + T key positions
    D d_model   H heads   V vocabulary   N layers
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, NamedTuple

import torch
from torch import Tensor, nn

from aiayn.attention import (
    KVCache,
    SelfAttention,
    SlotCache,
    decoder_only_mask,
    positions_from_padding,
)
from aiayn.config import ModelConfig, Presets, Published, check_heads
from aiayn.errors import ConfigError
from aiayn.layers import (
    ACTIVATIONS,
    Embedder,
    FeedForward,
    LearnedPositionalEmbedding,
    SelfAttentionBlock,
    TokenEmbedding,
    layer_norm,
)
from aiayn.validation import (
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
class GPT2Config(ModelConfig):
    """Hyper-parameters of a GPT-2 language model (Hugging Face's names in brackets).

    Attributes:
        vocab_size: V [vocab_size]; 50257 for the published byte-level BPE.
        max_len: learned positions [n_positions].
        d_model: D [n_embd].
        num_heads: H [n_head]; d_k = D / H.
        num_layers: N [n_layer].
        d_ff: inner size of the feed-forward network [n_inner]; None = 4·D.
        activation: of the feed-forward network [activation_function]: "gelu_tanh" (GPT-2's
            "gelu_new"), "gelu" or "relu".
        dropout: on each block's sub-layer outputs [resid_pdrop].
        embedding_dropout: on the embeddings + positions [embd_pdrop].
        attention_dropout: on the attention weights [attn_pdrop].
        layer_norm_eps: ε of every LayerNorm [layer_norm_epsilon].
        tie_output: the LM head shares the token embedding's weights [tie_word_embeddings].
        bos_id, eos_id: GPT-2's <|endoftext|> (50256) serves as both [bos/eos_token_id].
        pad_id: the id that fills batches of different lengths (never attended to); GPT-2 has
            none, so <|endoftext|>.
    """

    vocab_size: PositiveInt = 50257
    max_len: PositiveInt = 1024
    d_model: PositiveInt = 768
    num_heads: PositiveInt = 12
    num_layers: PositiveInt = 12
    d_ff: PositiveInt | None = None
    activation: Annotated[str, Choice(tuple(ACTIVATIONS))] = "gelu_tanh"
    dropout: Rate = 0.1
    embedding_dropout: Rate = 0.1
    attention_dropout: Rate = 0.1
    layer_norm_eps: PositiveFloat = 1e-5
    tie_output: bool = True
    bos_id: NonNegativeInt = 50256
    eos_id: NonNegativeInt = 50256
    pad_id: NonNegativeInt = 50256

    def __post_init__(self) -> None:
        validate(self)
        check_heads(self.d_model, self.num_heads)
        for name in ("bos_id", "eos_id", "pad_id"):
            if getattr(self, name) >= self.vocab_size:
                raise ConfigError(f"{name}={getattr(self, name)} is outside the vocabulary")

    @property
    def max_positions(self) -> int:
        """``max_len``: the learned position table's rows."""
        return self.max_len

    @property
    def inner_size(self) -> int:
        """The feed-forward network's inner size: ``d_ff``, or 4·D."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    def with_vocab_size(self, vocab_size: int) -> GPT2Config:
        """A copy for ``vocab_size`` tokens; the special ids (GPT-2's last id,
        <|endoftext|>) stay inside it as the last id."""
        last = max(vocab_size - 1, 0)
        ids = {k: min(getattr(self, k), last) for k in ("bos_id", "eos_id", "pad_id")}
        return self.replace(vocab_size=vocab_size, **ids)

    def summary(self) -> str:
        """The architecture in one line (GPT-2 paper, Table 2's names)."""
        return (
            f"N={self.num_layers} d_model={self.d_model} d_ff={self.inner_size} "
            f"h={self.num_heads} context={self.max_len} vocab={self.vocab_size} "
            f"tied={self.tie_output}"
        )


def _sized(n_layer: int, d_model: int, n_head: int) -> GPT2Config:
    return GPT2Config(num_layers=n_layer, d_model=d_model, num_heads=n_head)


GPT2_PRESETS: Presets[GPT2Config] = Presets(
    "GPT-2",
    {
        # the four published sizes (GPT-2 paper, Table 2; parameter counts with the tied head)
        "gpt2": _sized(12, 768, 12),  # 124M
        "gpt2-medium": _sized(24, 1024, 16),  # 355M
        "gpt2-large": _sized(36, 1280, 20),  # 774M
        "gpt2-xl": _sized(48, 1600, 25),  # 1.5B
        # for tests and the built-in CPU demo: a vocabulary the trainer sets from its tokenizer
        "gpt2-tiny": GPT2Config(
            vocab_size=4000,
            max_len=256,
            d_model=128,
            num_heads=4,
            num_layers=4,
            bos_id=0,
            eos_id=0,
            pad_id=0,
        ),
    },
    published={  # Hugging Face's counts of the published checkpoints (50,257 tokens)
        "gpt2": Published(124_439_808, 50257, "published GPT-2"),
        "gpt2-medium": Published(354_823_168, 50257, "published GPT-2"),
        "gpt2-large": Published(774_030_080, 50257, "published GPT-2"),
        "gpt2-xl": Published(1_557_611_200, 50257, "published GPT-2"),
    },
)

gpt2_preset = GPT2_PRESETS.build
"""A named GPT-2 preset (``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``, ``gpt2-tiny``),
optionally with fields changed."""


def expected_gpt2_parameters(config: GPT2Config) -> int:
    """Closed-form parameter count of :class:`GPT2`:

    V·D + P·D                      token and position embeddings
    + N·(4D² + 4D)                 attention: [W^Q; W^K; W^V] and W^O with biases
    + N·(2·D·F + F + D)            feed-forward W_1, b_1, W_2, b_2
    + N·4D + 2D                    two LayerNorms per block and the final one
    + V·D if the head is untied
    """
    d, f, n = config.d_model, config.inner_size, config.num_layers
    embeddings = config.vocab_size * d + config.max_len * d
    blocks = n * ((4 * d * d + 4 * d) + (2 * d * f + f + d) + 4 * d)
    head = 0 if config.tie_output else config.vocab_size * d
    return embeddings + blocks + 2 * d + head


def gpt2_block(config: GPT2Config) -> SelfAttentionBlock:
    """One GPT-2 block: pre-norm causal self-attention and a GELU feed-forward network."""
    c = config
    return SelfAttentionBlock(
        SelfAttention(c.d_model, c.num_heads, dropout=c.attention_dropout),
        FeedForward(c.d_model, c.inner_size, c.activation),
        layer_norm(c.layer_norm_eps),
        norm_first=True,
        dropout=c.dropout,
    )


class LMOutput(NamedTuple):
    """What :class:`GPT2` returns.

    Attributes:
        hidden: (B, T, D) final states (after the last LayerNorm, before the LM head).
        cache: per layer, the keys/values (B, H, S, d_k) of every position so far.
        weights: per layer (B, H, T, S) attention weights, if requested.
    """

    hidden: Tensor
    cache: list[KVCache | SlotCache]
    weights: list[Tensor] | None


class GPT2(nn.Module):
    """The GPT-2 language model: ``forward`` gives final states; :meth:`logits` the LM head.

    Args:
        config: the hyper-parameters.
    """

    def __init__(self, config: GPT2Config):
        super().__init__()
        c = self.config = config
        embedding = TokenEmbedding(c.vocab_size, c.d_model, scale=1.0)
        positions = LearnedPositionalEmbedding(c.d_model, c.max_len)
        self.embedder = Embedder(embedding, positions, c.embedding_dropout)
        self.layers = nn.ModuleList(gpt2_block(c) for _ in range(c.num_layers))
        self.final_norm = layer_norm(c.layer_norm_eps)(c.d_model)
        self.output_proj = nn.Linear(c.d_model, c.vocab_size, bias=False)  # (V, D)
        self.reset_parameters()
        if c.tie_output:
            self.output_proj.weight = embedding.weight

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights, zero biases, unit norms, and the two
        projections into the residual stream at 0.02/√(2N) (GPT-2 §2.3)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        positions = self.embedder.positional
        assert isinstance(positions, LearnedPositionalEmbedding)
        nn.init.normal_(self.embedder.embedding.weight, std=0.02)
        nn.init.normal_(positions.weight, std=0.01)
        residual_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        for block in self.layers:
            assert isinstance(block, SelfAttentionBlock)
            assert isinstance(block.feed_forward, FeedForward)
            nn.init.normal_(block.self_attn.out_proj.weight, std=residual_std)
            nn.init.normal_(block.feed_forward.linear2.weight, std=residual_std)

    def forward(
        self,
        tokens: Tensor,
        *,
        key_padding: Tensor | None = None,
        positions: Tensor | None = None,
        cache: Sequence[KVCache | SlotCache] | None = None,
        need_weights: bool = False,
    ) -> LMOutput:
        """Final states of the T new tokens after L cached ones.

        Args:
            tokens: (B, T) ids.
            key_padding: (B, L + T) boolean, True = a real token, False = padding (e.g. the left
                padding of shorter prompts); None = no padding.
            positions: (B, T) position ids of the new tokens; None = counted from each row's
                first real token (from ``key_padding``), or L .. L + T - 1 without padding.
            cache: per layer, the keys/values of the L earlier positions, or None (L = 0); or
                each row's in a slot pool (:class:`~aiayn.attention.SlotCache`: T = 1, with
                ``positions``).
        """
        offset = 0 if cache is None else cache[0].length
        if positions is None and key_padding is not None:
            positions = positions_from_padding(key_padding)[:, offset:]  # (B, T)
        x = self.embedder(tokens, offset, positions=positions)  # (B, T, D)
        mask = decoder_only_mask(key_padding, tokens.size(1))
        new_cache: list[KVCache | SlotCache] = []
        weights: list[Tensor] | None = [] if need_weights else None
        for i, block in enumerate(self.layers):
            layer_cache = None if cache is None else cache[i]
            out = block(x, mask, cache=layer_cache, need_weights=need_weights)
            x = out.output  # (B, T, D)
            new_cache.append(out.cache)
            if weights is not None and out.weights is not None:
                weights.append(out.weights)
        return LMOutput(self.final_norm(x), new_cache, weights)

    def logits(self, hidden: Tensor) -> Tensor:
        """The LM head: (B, T, D) -> (B, T, V)."""
        return self.output_proj(hidden)

    def log_probs(self, hidden: Tensor) -> Tensor:
        """log-softmax of the LM head in fp32: (B, T, D) -> (B, T, V)."""
        return torch.log_softmax(self.logits(hidden).float(), dim=-1)
