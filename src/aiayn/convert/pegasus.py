"""Hugging Face Pegasus checkpoints (``PegasusForConditionalGeneration``) -> aiayn's pre-norm
:class:`~aiayn.models.Transformer`, exactly.

Pegasus (Zhang et al. 2020) is the paper's encoder–decoder with pre-norm layers
(x + Sublayer(LayerNorm(x))), a LayerNorm after each stack, embeddings × √d_model when
``scale_embedding``, Marian's sinusoids in halves and one vocabulary for both stacks: aiayn's
``norm_first`` model. Its layers, embeddings, ``final_logits_bias`` and sinusoid tables are named
as Marian's, so the Marian converter (:mod:`aiayn.convert.marian`) reads everything but the two
final LayerNorms (``model.{encoder,decoder}.layer_norm``), which go to the stacks'
``final_norm``. Folders aiayn wrote from a model with the paper's interleaved sinusoids are
permuted back (:mod:`aiayn.convert.residual_basis`).

Keys of older Pegasus configs that state what Pegasus computes (``normalize_before``,
``add_final_layer_norm``, ``static_position_embeddings``: true) are accepted; another value is
refused by name, as is any option the Marian converter refuses. The tokenizer read is aiayn's
joint BPE (``tokenizer.json``) of a folder aiayn wrote: Pegasus' own SentencePiece tokenizer is
refused by name.

Shape legend:  V vocabulary   D d_model
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from aiayn.convert.generation import Seq2SeqSpecials, generation_defaults
from aiayn.convert.marian import (
    marian_config_from_hf,
    marian_model,
    marian_state_dict_from_hf,
)
from aiayn.data.pretrained_tokenizer import T5_SPM, TOKENIZER_JSON
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.models.transformer import Transformer

PEGASUS_OWN: dict[str, bool] = {
    "normalize_before": True,
    "add_final_layer_norm": True,
    "static_position_embeddings": True,
}
"""Keys of older Pegasus configs, with the value that is what Pegasus computes."""

HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50265,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
    "forced_eos_token_id": 1,
}
"""transformers' ``PegasusConfig`` defaults where they differ from ``MarianConfig``'s (the rest
are equal)."""

FINAL_NORMS: dict[str, str] = {
    "model.encoder.layer_norm.weight": "encoder.final_norm.weight",  # (D,)
    "model.encoder.layer_norm.bias": "encoder.final_norm.bias",  # (D,)
    "model.decoder.layer_norm.weight": "decoder.final_norm.weight",  # (D,)
    "model.decoder.layer_norm.bias": "decoder.final_norm.bias",  # (D,)
}
"""The stacks' final LayerNorms: Pegasus' names -> aiayn's."""


def as_marian_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    """A Pegasus ``config.json`` as the Marian config of the same layers (one vocabulary).

    Raises:
        UserError: another ``model_type``, or a key of :data:`PEGASUS_OWN` with another value.
    """
    if hf_config.get("model_type") != "pegasus":
        raise UserError(f"model_type {hf_config.get('model_type')!r} is not Pegasus ('pegasus')")
    for key, value in PEGASUS_OWN.items():
        if key in hf_config and hf_config[key] is not value:
            raise UserError(f"{key}={hf_config[key]!r} is not supported (Pegasus computes {value})")
    config = {k: v for k, v in hf_config.items() if k not in PEGASUS_OWN}
    return {
        **HF_DEFAULTS,
        **config,
        "model_type": "marian",
        "share_encoder_decoder_embeddings": True,
        "decoder_vocab_size": None,
    }


def pegasus_config_from_hf(hf_config: Mapping[str, Any]) -> Any:
    """aiayn's (pre-norm) config of a Pegasus ``config.json``."""
    return marian_config_from_hf(as_marian_config(hf_config)).replace(norm_first=True)


def pegasus_from_hf_tensors(
    hf_config: Mapping[str, Any], hf_tensors: Mapping[str, Tensor]
) -> tuple[Transformer, int]:
    """aiayn's pre-norm Transformer (eval mode, fp32) from a Pegasus config dict and its tensors;
    also the number of checkpoint tensors mapped.

    Raises:
        UserError: an unsupported option, or an unexpected, missing or mis-shaped tensor, named.
    """
    config = pegasus_config_from_hf(hf_config)
    layers = {k: t for k, t in hf_tensors.items() if k not in FINAL_NORMS}
    state, mapped = marian_state_dict_from_hf(as_marian_config(hf_config), layers)
    d_model = config.d_model
    for hf_name, name in FINAL_NORMS.items():
        tensor = hf_tensors.get(hf_name)
        if tensor is None:
            raise UserError(f"missing tensor {hf_name!r} in the checkpoint")
        if tuple(tensor.shape) != (d_model,):
            raise UserError(
                f"tensor {hf_name!r} has shape {tuple(tensor.shape)}; the config says {(d_model,)}"
            )
        state[name] = tensor.float().contiguous()
        mapped += 1
    return marian_model(config, hf_config, state), mapped


def pegasus_generation_defaults(
    hf_config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None
) -> Seq2SeqSpecials:
    """The special ids and generation settings of a Pegasus checkpoint (see
    :func:`~aiayn.convert.generation.generation_defaults`; ids default to ``PegasusConfig``'s)."""
    vocab = hf_config.get("vocab_size", HF_DEFAULTS["vocab_size"])
    return generation_defaults(
        hf_config, generation_config, target_vocab=vocab, id_defaults=HF_DEFAULTS
    )


def pegasus_tokenizer_from_hf(folder: Path) -> TextTokenizer | None:
    """aiayn's joint BPE of a Pegasus folder aiayn wrote (None when the folder has no tokenizer).

    Raises:
        UserError: Pegasus' own SentencePiece tokenizer, which aiayn does not read.
    """
    file = folder / TOKENIZER_JSON
    if file.is_file():
        Tokenizer.load(file)  # aiayn's fixed special ids, or refused by name
        return TextTokenizer.load(file)
    if (folder / T5_SPM).is_file():
        raise UserError(
            f"{folder}: Pegasus' SentencePiece tokenizer ({T5_SPM}) is not supported; only the "
            f"joint BPE {TOKENIZER_JSON} of a folder aiayn wrote"
        )
    return None
