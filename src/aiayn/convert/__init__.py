"""Pretrained checkpoints of other libraries <-> aiayn's model families.

:func:`from_hf` reads a Hugging Face model folder (or Hub name), picks the family from
``config.json``'s ``model_type`` (in the family registry, :mod:`aiayn.models.families`) and
converts the weights exactly (every tensor used, shapes checked); :func:`to_hf` writes an aiayn
model back as a folder transformers loads, with its tokenizer and generation settings (the
family's ``to_hf`` entry: :mod:`aiayn.convert.gpt2`, :mod:`aiayn.convert.transformer_to_hf` (the
paper's model as Marian or Pegasus), :mod:`aiayn.convert.t5_to_hf`,
:mod:`aiayn.convert.bert_to_hf`, :mod:`aiayn.convert.vit_to_hf`). One module per family holds its
name map (:mod:`aiayn.convert.gpt2`, :mod:`aiayn.convert.t5`, :mod:`aiayn.convert.marian`,
:mod:`aiayn.convert.pegasus`, :mod:`aiayn.convert.bert`, :mod:`aiayn.convert.vit`), which
:mod:`aiayn.convert.hf_export` reads backwards; :mod:`aiayn.convert.hf_folder` reads and writes the
folders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

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
    read_hf_weights,
    resolve_hf_source,
)
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.images import ImagePreprocessor
from aiayn.data.pretrained_tokenizer import PretrainedTokenizer
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.errors import UserError
from aiayn.models.families import family_of, hf_source, resolve


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
    _, how = hf_source(hf_config.get("model_type"))
    model, mapped = resolve(how.convert)(hf_config, read_hf_weights(folder))
    generation_config = read_hf_generation(folder)
    specials, unapplied = None, []
    if how.generation is not None:
        specials = resolve(how.generation)(hf_config, generation_config)
        unapplied = unapplied_settings(hf_config, generation_config)
    tokenizer = resolve(how.tokenizer)(folder)
    check_vocabulary(model, tokenizer)
    return HFConversion(model, tokenizer, hf_config, specials, unapplied, folder, mapped)


def check_vocabulary(model: nn.Module, tokenizer: object) -> None:
    """Every id the tokenizer gives has a row in the model's embeddings: its ``vocab_size``
    (and an encoder–decoder's ``target_vocab_size``) at most the model config's. A smaller
    tokenizer is fine (T5 pads its embeddings to a multiple of 128).

    Raises:
        UserError: naming both sizes.
    """
    config = getattr(model, "config", None)
    for side, field in (("", "vocab_size"), ("target ", "target_vocab_size")):
        tokens, rows = getattr(tokenizer, field, None), getattr(config, field, None)
        if isinstance(tokens, int) and isinstance(rows, int) and tokens > rows:
            raise UserError(
                f"the tokenizer has {tokens:,} {side}tokens but the model's {side}vocabulary "
                f"has {rows:,} (config.json vocab_size): ids from {rows:,} on have no embedding"
            )


def to_hf(
    model: nn.Module,
    out_dir: str | Path,
    tokenizer: object = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face folder (the families with a converter back:
    :func:`aiayn.models.families.conversion_directions`). ``tokenizer``: the checkpoint's input
    processing (:func:`aiayn.checkpoint.tokenizers.checkpoint_tokenizer`: a tokenizer file, a
    converted model's tokenizer, a ViT's image preprocessing) or None; ``state``: the
    checkpoint's ``state.json`` (a converted model's recorded decoding settings)."""
    family = family_of(model)
    if family.to_hf is None:
        raise UserError(f"the {family.name} family cannot be written as a Hugging Face model yet")
    written: Path = resolve(family.to_hf)(model, out_dir, tokenizer, state or {})
    return written


__all__ = [
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
