"""Pretrained checkpoints of other libraries <-> aiayn's model families.

:func:`from_hf` reads a Hugging Face model folder (or Hub name), picks the family from
``config.json``'s ``model_type`` and converts the weights exactly (every tensor used, shapes
checked); :func:`to_hf` writes an aiayn model back as a folder transformers loads (GPT-2). One
module per family holds its name map (:mod:`aiayn.convert.gpt2`, :mod:`aiayn.convert.t5`,
:mod:`aiayn.convert.marian`, :mod:`aiayn.convert.bert`); :mod:`aiayn.convert.hf_folder` reads
and writes the folders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from aiayn.convert import marian as _marian
from aiayn.convert.bert import bert_from_hf_tensors
from aiayn.convert.generation import Seq2SeqSpecials, unapplied_settings
from aiayn.convert.gpt2 import (
    HF_TO_AIAYN,
    gpt2_config_from_hf,
    gpt2_config_to_hf,
    gpt2_from_hf,
    gpt2_from_hf_tensors,
    gpt2_state_dict_from_hf,
    gpt2_state_dict_to_hf,
    gpt2_to_hf,
)
from aiayn.convert.hf_folder import (
    read_hf_config,
    read_hf_generation,
    read_hf_tokenizer,
    read_hf_weights,
    resolve_hf_source,
)
from aiayn.convert.t5 import t5_from_hf_tensors, t5_generation_defaults
from aiayn.convert.vit import vit_from_hf_tensors
from aiayn.data.bert_tokenizer import BertTokenizer, bert_tokenizer_from_hf
from aiayn.data.images import PREPROCESSOR_CONFIG, ImagePreprocessor
from aiayn.data.pretrained_tokenizer import PretrainedTokenizer, pretrained_tokenizer_from_hf
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.errors import UserError
from aiayn.models.families import family_of
from aiayn.models.gpt2 import GPT2

FromHF = Callable[[Mapping[str, Any], Mapping[str, Tensor]], tuple[nn.Module, int]]

FROM_HF: dict[str, FromHF] = {
    "gpt2": gpt2_from_hf_tensors,
    "t5": t5_from_hf_tensors,
    "marian": _marian.marian_from_hf_tensors,
    "bert": bert_from_hf_tensors,
    "vit": vit_from_hf_tensors,
}
"""Hugging Face ``model_type`` -> the converter of its config and tensors."""

Generation = Callable[[Mapping[str, Any], Mapping[str, Any] | None], Seq2SeqSpecials]

GENERATION: dict[str, Generation] = {
    "t5": t5_generation_defaults,
    "marian": _marian.marian_generation_defaults,
}
"""Encoder–decoder ``model_type`` -> the reader of its special ids and generation settings."""


@dataclass(frozen=True)
class HFConversion:
    """A converted Hugging Face model.

    Attributes:
        model: the aiayn model, in eval mode.
        tokenizer: the folder's vocabulary, or None when it has none.
        hf_config: the folder's ``config.json``.
        generation: an encoder–decoder's special ids and decoding defaults, else None.
        unapplied: generation settings of the folder that aiayn's searches do not apply.
        folder: where the folder was read (a Hub name resolves to its local snapshot).
        tensors_mapped: how many checkpoint tensors went into the model.
    """

    model: nn.Module
    tokenizer: TextTokenizer | PretrainedTokenizer | BertTokenizer | ImagePreprocessor | None
    hf_config: dict[str, Any]
    generation: Seq2SeqSpecials | None
    unapplied: list[str]
    folder: Path
    tensors_mapped: int


def from_hf(source: str | Path) -> HFConversion:
    """Convert the Hugging Face model at ``source`` (a folder or a Hub name).

    Raises:
        UserError: an unsupported ``model_type`` (by name), option or tensor.
    """
    folder = resolve_hf_source(source)
    hf_config = read_hf_config(folder)
    model_type = hf_config.get("model_type")
    if model_type not in FROM_HF:
        raise UserError(
            f"model_type {model_type!r} is not supported yet (supported: {', '.join(FROM_HF)})"
        )
    model, mapped = FROM_HF[model_type](hf_config, read_hf_weights(folder))
    generation_config = read_hf_generation(folder)
    specials, unapplied = None, []
    if model_type in GENERATION:
        specials = GENERATION[model_type](hf_config, generation_config)
        unapplied = unapplied_settings(hf_config, generation_config)
    tokenizer = _tokenizer(folder, model_type)
    return HFConversion(model, tokenizer, hf_config, specials, unapplied, folder, mapped)


def _tokenizer(
    folder: Path, model_type: str
) -> TextTokenizer | PretrainedTokenizer | BertTokenizer | ImagePreprocessor | None:
    """The folder's input processing: WordPiece for BERT, SentencePiece-based for the
    encoder–decoders, the image preprocessing for ViT, else a ``tokenizer.json`` / byte-level
    BPE pair."""
    if model_type == "bert":
        return bert_tokenizer_from_hf(folder)
    if model_type == "vit":
        has = (folder / PREPROCESSOR_CONFIG).is_file()
        return ImagePreprocessor.from_folder(folder) if has else None
    if model_type in ("t5", "marian"):
        return pretrained_tokenizer_from_hf(folder, model_type)
    return read_hf_tokenizer(folder)


def to_hf(model: nn.Module, out_dir: str | Path, tokenizer: TextTokenizer | None = None) -> Path:
    """Write ``model`` as a Hugging Face folder (families with a converter back: GPT-2)."""
    if isinstance(model, GPT2):
        return gpt2_to_hf(model, out_dir, tokenizer)
    family = family_of(model).name
    raise UserError(f"the {family} family cannot be written as a Hugging Face model yet")


__all__ = [
    "FROM_HF",
    "GENERATION",
    "HF_TO_AIAYN",
    "HFConversion",
    "Seq2SeqSpecials",
    "from_hf",
    "gpt2_config_from_hf",
    "gpt2_config_to_hf",
    "gpt2_from_hf",
    "gpt2_from_hf_tensors",
    "gpt2_state_dict_from_hf",
    "gpt2_state_dict_to_hf",
    "gpt2_to_hf",
    "to_hf",
]
