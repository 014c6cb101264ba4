"""Building blocks: embeddings and positions (§3.4–3.5), feed-forward (§3.3), norms, and the two
blocks (§3.1) every family is built from."""

from aiayn.dropout import Dropout, dropout
from aiayn.layers.embedding import (
    Embedder,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    sinusoidal_encoding,
)
from aiayn.layers.feed_forward import ACTIVATIONS, FeedForward, GatedFeedForward, activation_fn
from aiayn.layers.norm import NormFactory, RMSNorm, layer_norm, rms_norm
from aiayn.layers.transformer_layers import (
    BlockOutput,
    CrossAttentionBlock,
    DecoderLayerCache,
    DecoderLayerOutput,
    SelfAttentionBlock,
    SublayerConnection,
)

__all__ = [
    "ACTIVATIONS",
    "BlockOutput",
    "CrossAttentionBlock",
    "DecoderLayerCache",
    "DecoderLayerOutput",
    "Dropout",
    "Embedder",
    "FeedForward",
    "GatedFeedForward",
    "LearnedPositionalEmbedding",
    "NoPositionalEncoding",
    "NormFactory",
    "RMSNorm",
    "SelfAttentionBlock",
    "SinusoidalPositionalEncoding",
    "SublayerConnection",
    "TokenEmbedding",
    "activation_fn",
    "dropout",
    "layer_norm",
    "rms_norm",
    "sinusoidal_encoding",
]
