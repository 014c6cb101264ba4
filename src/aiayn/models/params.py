"""Parameter counts: measured from a model, and in closed form from a config.

Closed form for the encoder–decoder Transformer (D = d_model, F = d_ff, V = vocabulary):
    attention block   4·(D² + D)          W^Q, W^K, W^V, W^O and their biases
    feed-forward      2·D·F + F + D       W_1, b_1, W_2, b_2 (eq. 2)
    LayerNorm         2·D
    encoder layer     attention + feed-forward + 2 LayerNorms
    decoder layer     2 attentions + feed-forward + 3 LayerNorms
    embeddings        V·D each, counted once when shared/tied (§3.4)
    output bias       V (Marian's final_logits_bias; the paper has none)
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from aiayn.config import TransformerConfig


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (a tied/shared tensor counts once)."""
    return sum(p.numel() for p in model.parameters())


def parameter_breakdown(model: nn.Module) -> OrderedDict[str, int]:
    """Distinct parameters grouped by component, in the order the model defines them.

    Groups: embeddings (token, positional, token-type, patch), T5's relative position bias,
    encoder / decoder / blocks (a single stack: GPT-2, ViT) self-attention, cross-attention,
    feed-forward and layer norms, pooler and heads, output projection.
    """
    groups: OrderedDict[str, int] = OrderedDict()
    for name, param in model.named_parameters():  # a shared tensor once, under its first name
        group = _group_of(name)
        groups[group] = groups.get(group, 0) + param.numel()
    return groups


def _group_of(name: str) -> str:
    stack = name.split(".")[0] if name.startswith(("encoder.", "decoder.")) else "decoder"
    if name.startswith("layers.") and "embedder.projection" not in name:
        stack = "blocks"  # a single stack (GPT-2, ViT)
    for part, group in _NAMED_PARTS:
        if part in f".{name}":
            return group
    if name.startswith("output_proj"):
        return "output projection"
    if "final_norm" in name or "sublayer.norm" in name:
        return f"{stack if not name.startswith('final_norm') else 'blocks'} layer norms"
    for part in ("self_attn", "cross_attn", "feed_forward"):
        if f".{part}." in name:
            return f"{stack} {part.replace('_attn', '-attention').replace('_', '-')}"
    return "other"


_NAMED_PARTS: tuple[tuple[str, str], ...] = (
    (".position_bias.", "relative position bias"),
    (".embedding.", "token embeddings"),
    (".positional.", "positional embeddings"),
    (".token_types.", "token-type embeddings"),
    (".embedder.norm.", "embedding layer norm"),
    (".embedder.projection.", "patch embedding"),
    (".embedder.class_token", "patch embedding"),
    (".embedder.positions", "positional embeddings"),
    (".pooler.", "pooler"),
    (".mlm_head.", "masked-LM head"),
    (".classifier.", "classifier"),
)
"""Name fragments of the parts outside the blocks -> their group (first match wins)."""


def expected_parameter_count(config: TransformerConfig) -> int:
    """The closed-form count of the module docstring for ``Transformer(config)``."""
    d, f = config.d_model, config.d_ff
    attention = 4 * (d * d + d)
    feed_forward = 2 * d * f + f + d
    norm = 2 * d
    encoder = config.num_encoder_layers * (attention + feed_forward + 2 * norm)
    decoder = config.num_decoder_layers * (2 * attention + feed_forward + 3 * norm)
    if config.norm_first:  # one final LayerNorm per stack
        encoder += norm
        decoder += norm
    src_emb = config.vocab_size * d
    tgt_emb = 0 if config.share_embeddings else config.target_vocab_size * d
    out_proj = 0 if config.tie_output else config.target_vocab_size * d
    out_bias = config.target_vocab_size if config.output_bias else 0
    positional = 2 * config.max_len * d if config.positional == "learned" else 0
    return encoder + decoder + src_emb + tgt_emb + out_proj + out_bias + positional
