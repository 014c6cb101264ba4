"""aiayn checkpoints -> Hugging Face folders: what every family's exporter shares.

Each family's converter holds one name table, Hugging Face name -> aiayn name (a layer index
written ``{}``, a third of a fused [W^Q; W^K; W^V] ``in_proj`` as its ``part``).
:func:`tensors_to_hf` reads that table backwards: every aiayn tensor goes to the Hugging Face
tensor(s) it came from, ``in_proj`` split into its three blocks. The tokenizer files of a
converted model go back as the folder had them (:func:`copy_tokenizer_files`), and an
encoder–decoder's special ids and decoding settings as ``generation_config.json``
(:func:`generation_config_to_hf`, the inverse of
:func:`~aiayn.convert.generation.generation_defaults`).

Shape legend:  I = H·d_k (one projection's rows)   (other shapes: each family's own tables)
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from aiayn.convert.hf_folder import GENERATION_CONFIG
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.models.bert import BertConfig
    from aiayn.models.vit import ViTConfig

Target = tuple[str, int | None]
"""An aiayn tensor (name, layer index written ``{}``) and the third of it a Hugging Face tensor
is (0, 1, 2 for W^Q, W^K, W^V of a fused ``in_proj``), or None for the whole tensor."""


def _pattern(name: str) -> tuple[str, str | None]:
    """``encoder.layers.3.norm.weight`` -> (``encoder.layers.{}.norm.weight``, ``"3"``): the
    first layer index written ``{}`` (as the name tables write it), or (name, None)."""
    match = re.search(r"\.(\d+)\.", name)
    if match is None:
        return name, None
    return f"{name[: match.start()]}.{{}}.{name[match.end() :]}", match.group(1)


def tensors_to_hf(
    state: Mapping[str, Tensor],
    table: Mapping[str, Target],
    *,
    skip: Collection[str] = (),
) -> dict[str, Tensor]:
    """aiayn's tensors under the Hugging Face names ``table`` (Hugging Face name -> aiayn name
    and part) gives them, fused projections split: (3I, …) -> 3 × (I, …). Rows of ``table``
    named in ``skip`` are not written (another name of the same tensor is).

    Raises:
        KeyError: an aiayn tensor the table has no Hugging Face name for (a converter's
            defect, not the user's: callers pass only tensors their table holds).
    """
    backwards: dict[str, list[tuple[str, int | None]]] = {}
    for hf_name, (name, part) in table.items():
        if hf_name not in skip:
            backwards.setdefault(name, []).append((hf_name, part))
    tensors: dict[str, Tensor] = {}
    for name, tensor in state.items():
        targets = backwards.get(name)
        index = None
        if targets is None:
            pattern, index = _pattern(name)
            targets = backwards.get(pattern)
        if targets is None:
            raise KeyError(f"{name} has no Hugging Face name")
        for hf_name, part in targets:
            hf_name = hf_name if index is None else hf_name.replace("{}", index, 1)
            piece = tensor if part is None else tensor.chunk(3)[part]  # (3I, …) -> (I, …)
            tensors[hf_name] = piece.detach().clone().contiguous()
    return tensors


def write_json(folder: Path, name: str, value: Mapping[str, Any]) -> None:
    """``folder / name`` as indented JSON (a new file: the user's umask)."""
    (folder / name).write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


class SavesFiles(Protocol):
    """A converted model's tokenizer: it saves its Hugging Face files and a manifest."""

    def save(self, folder: str | Path) -> None: ...


def copy_tokenizer_files(tokenizer: SavesFiles, out: Path, manifest: str) -> dict[str, Any]:
    """Write the Hugging Face files of a converted model's tokenizer into ``out`` (those its
    ``manifest`` lists: ``spiece.model``, ``source.spm`` …, ``tokenizer.json``) and return the
    manifest (its special tokens and settings), which stays behind."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        listed: dict[str, Any] = json.loads((Path(tmp) / manifest).read_text(encoding="utf-8"))
        for name in listed["files"]:
            shutil.copyfile(Path(tmp) / name, out / name)  # a new file: the user's umask
    return listed


GENERATION_KEYS: tuple[tuple[str, str], ...] = (
    ("num_beams", "num_beams"),
    ("max_length", "max_length"),
    ("length_penalty", "length_penalty"),
    ("early_stopping", "early_stopping"),
    ("renormalize_logits", "renormalize_logits"),
)
"""Settings of :class:`~aiayn.convert.generation.Seq2SeqSpecials` -> generation_config.json's
keys, written when set."""


def generation_config_to_hf(generation: Mapping[str, Any]) -> dict[str, Any]:
    """``generation_config.json`` (a dict) of a checkpoint's recorded special ids and decoding
    settings (:class:`~aiayn.convert.generation.Seq2SeqSpecials` as a dict):
    :func:`~aiayn.convert.generation.generation_defaults` reads it back to the same values."""
    try:
        config: dict[str, Any] = {
            "decoder_start_token_id": int(generation["decoder_start_id"]),
            "eos_token_id": int(generation["eos_id"]),
            "pad_token_id": int(generation["pad_id"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"the checkpoint's generation settings lack {exc}") from None
    banned = generation.get("banned_ids") or ()
    if banned:
        config["bad_words_ids"] = [[int(i)] for i in banned]
    if generation.get("forced_eos"):
        config["forced_eos_token_id"] = config["eos_token_id"]
    for ours, theirs in GENERATION_KEYS:
        if generation.get(ours) is not None:
            config[theirs] = generation[ours]
    return config


def write_generation_config(out: Path, generation: Mapping[str, Any]) -> None:
    """``out/generation_config.json`` of :func:`generation_config_to_hf`."""
    write_json(out, GENERATION_CONFIG, generation_config_to_hf(generation))


def label_maps(id2label: tuple[str, ...], num_labels: int) -> dict[str, Any]:
    """A classifier's labels as transformers' config writes them: ``id2label`` and
    ``label2id`` when the labels have names, else only ``num_labels`` (transformers then names
    them LABEL_0 …)."""
    if not id2label:
        return {"num_labels": num_labels}
    return {
        "id2label": {str(i): name for i, name in enumerate(id2label)},
        "label2id": {name: i for i, name in enumerate(id2label)},
    }


HF_ACTIVATION_NAMES: dict[str, str] = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "relu": "relu",
    "silu": "silu",
}
"""aiayn's activation -> the Hugging Face name of the same function (``hidden_act``;
:data:`~aiayn.convert.checks.HF_ACTIVATIONS` reads each back)."""


def encoder_fields_to_hf(config: BertConfig | ViTConfig) -> dict[str, Any]:
    """The fields of a BERT-style Hugging Face ``config.json`` (BERT's, ViT's) from what aiayn's
    BERT and ViT configs share: the encoder's sizes, activation and dropouts (the inverse of
    :func:`~aiayn.convert.checks.encoder_fields_from_hf` less ε, which each writes in place)."""
    c = config
    return {
        "hidden_size": c.d_model,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "intermediate_size": c.d_ff,
        "hidden_act": HF_ACTIVATION_NAMES[c.activation],
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.attention_dropout,
    }


def prefixed(
    tensors: Mapping[str, Tensor], prefix: str, heads: tuple[str, ...]
) -> dict[str, Tensor]:
    """A task model's names: the body's under ``prefix`` (``"bert."``), the heads' (names
    starting with one of ``heads``) as they are."""
    return {
        (name if name.startswith(heads) else prefix + name): tensor
        for name, tensor in tensors.items()
    }
