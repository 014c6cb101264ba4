"""Building blocks: embeddings and positions (§3.4–3.5), feed-forward (§3.3), layers (§3.1)."""

from aiayn.layers.dropout import Dropout, dropout
from aiayn.layers.embedding import (
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    sinusoidal_encoding,
)
from aiayn.layers.feed_forward import FeedForward
from aiayn.layers.transformer_layers import (
    DecoderLayer,
    DecoderLayerCache,
    DecoderLayerOutput,
    EncoderLayer,
    SublayerConnection,
)

__all__ = [
    "DecoderLayer",
    "DecoderLayerCache",
    "DecoderLayerOutput",
    "Dropout",
    "EncoderLayer",
    "FeedForward",
    "LearnedPositionalEmbedding",
    "NoPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "SublayerConnection",
    "TokenEmbedding",
    "dropout",
    "sinusoidal_encoding",
]
