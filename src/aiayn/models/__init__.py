"""Models built from the layers: the paper's encoder–decoder Transformer."""

from aiayn.models.params import count_parameters, expected_parameter_count, parameter_breakdown
from aiayn.models.transformer import (
    Decoder,
    DecoderOutput,
    Encoder,
    EncoderOutput,
    Transformer,
    build_positional,
)

__all__ = [
    "Decoder",
    "DecoderOutput",
    "Encoder",
    "EncoderOutput",
    "Transformer",
    "build_positional",
    "count_parameters",
    "expected_parameter_count",
    "parameter_breakdown",
]
