"""Models built from the layers, one file per family: the paper's encoder–decoder Transformer
(:mod:`~aiayn.models.transformer`, which also runs Marian/OPUS-MT models), GPT-2
(:mod:`~aiayn.models.gpt2`) and T5 (:mod:`~aiayn.models.t5`)."""

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
from aiayn.models.t5 import T5, T5_PRESETS, T5Config, expected_t5_parameters, t5_preset
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
    "T5",
    "T5_PRESETS",
    "Decoder",
    "DecoderOutput",
    "Encoder",
    "EncoderOutput",
    "GPT2Config",
    "LMOutput",
    "T5Config",
    "Transformer",
    "build_positional",
    "count_parameters",
    "expected_gpt2_parameters",
    "expected_parameter_count",
    "expected_t5_parameters",
    "gpt2_block",
    "gpt2_preset",
    "parameter_breakdown",
    "t5_preset",
]
