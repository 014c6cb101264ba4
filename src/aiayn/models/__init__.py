"""Models built from the layers, one file per family: the paper's encoder–decoder Transformer
(:mod:`~aiayn.models.transformer`) and GPT-2 (:mod:`~aiayn.models.gpt2`)."""

from aiayn.models.gpt2 import (
    GPT2,
    GPT2_PRESETS,
    GPT2Config,
    LMOutput,
    expected_gpt2_parameters,
    gpt2_block,
    gpt2_preset,
)
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
    "GPT2",
    "GPT2_PRESETS",
    "Decoder",
    "DecoderOutput",
    "Encoder",
    "EncoderOutput",
    "GPT2Config",
    "LMOutput",
    "Transformer",
    "build_positional",
    "count_parameters",
    "expected_gpt2_parameters",
    "expected_parameter_count",
    "gpt2_block",
    "gpt2_preset",
    "parameter_breakdown",
]
