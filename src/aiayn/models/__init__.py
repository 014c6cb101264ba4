"""Models built from the layers, one file per family: the paper's encoder–decoder Transformer
(:mod:`~aiayn.models.transformer`, which also runs Marian/OPUS-MT models), GPT-2
(:mod:`~aiayn.models.gpt2`), T5 (:mod:`~aiayn.models.t5`) and BERT (:mod:`~aiayn.models.bert`)."""

from aiayn.models.bert import (
    BERT,
    BERT_PRESETS,
    BertConfig,
    BertOutput,
    bert_preset,
    expected_bert_parameters,
)
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
    "BERT",
    "BERT_PRESETS",
    "GPT2",
    "GPT2_PRESETS",
    "T5",
    "T5_PRESETS",
    "BertConfig",
    "BertOutput",
    "Decoder",
    "DecoderOutput",
    "Encoder",
    "EncoderOutput",
    "GPT2Config",
    "LMOutput",
    "T5Config",
    "Transformer",
    "bert_preset",
    "build_positional",
    "count_parameters",
    "expected_bert_parameters",
    "expected_gpt2_parameters",
    "expected_parameter_count",
    "expected_t5_parameters",
    "gpt2_block",
    "gpt2_preset",
    "parameter_breakdown",
    "t5_preset",
]
