"""Hugging Face model folders: what every family's converter shares.

A folder written by ``save_pretrained`` (or downloaded from the Hub) holds::

    config.json                         the architecture (``model_type`` names the family)
    model.safetensors                   the weights, or sharded: model.safetensors.index.json
                                        + model-0000k-of-0000n.safetensors; older folders
                                        pytorch_model.bin (+ .index.json when sharded)
    tokenizer.json | vocab.json + merges.txt   the vocabulary (optional); T5: spiece.model;
                                        Marian: source.spm, target.spm, vocab.json
    generation_config.json              the decoding defaults (optional; older folders keep
                                        them in config.json)

Formats: Hugging Face, "Models" and "Sharded checkpoints" in the transformers documentation;
safetensors, https://huggingface.co/docs/safetensors. ``.bin`` files are read with
``torch.load(weights_only=True)``: tensors only, no pickled code runs.

A source that is not an existing folder is taken for a Hub name (``gpt2``, ``openai-community/
gpt2``) and fetched with ``huggingface_hub.snapshot_download`` (the weights in one format only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from aiayn.data.text_tokenizer import GPT2_MERGES, GPT2_VOCAB, TOKENIZER_JSON, TextTokenizer
from aiayn.errors import UserError

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
_SEQ2SEQ_TOKENIZERS = [
    "spiece.model",
    "source.spm",
    "target.spm",
    "target_vocab.json",
    "special_tokens_map.json",
]

_HUB_COMMON = [
    CONFIG_FILE,
    GENERATION_CONFIG,
    TOKENIZER_JSON,
    GPT2_VOCAB,
    GPT2_MERGES,
    TOKENIZER_CONFIG,
    *_SEQ2SEQ_TOKENIZERS,
]
_HUB_SAFETENSORS = [SAFETENSORS_FILE, SAFETENSORS_INDEX, "model-*-of-*.safetensors"]
_HUB_TORCH = [TORCH_FILE, TORCH_INDEX, "pytorch_model-*-of-*.bin"]


def resolve_hf_source(source: str | Path) -> Path:
    """The folder of ``source``: itself when it is a folder, else a Hub snapshot of that name."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise UserError(f"{source}: a file, not a Hugging Face model folder")
    if _is_path(str(source)):
        raise UserError(f"{source}: no such folder")
    folder = _download(str(source), _HUB_COMMON + _HUB_SAFETENSORS)
    if not _weight_files(folder):  # an older repository: PyTorch pickles only
        folder = _download(str(source), _HUB_COMMON + _HUB_TORCH)
    return folder


def _is_path(source: str) -> bool:
    """Whether ``source`` can only be a path: Hub names are ``name`` or ``owner/name``."""
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or "\\" in source


def _download(name: str, patterns: list[str]) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:  # invalid names, network, unknown repositories: all one message
        raise UserError(
            f"{name}: no such folder, and not a model on the Hugging Face Hub "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def read_hf_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of ``folder`` as a dict."""
    file = folder / CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{file}: cannot read the model config ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{file}: not a JSON object")
    return config


def read_hf_generation(folder: Path) -> dict[str, Any]:
    """The folder's ``generation_config.json`` as a dict ({} when it has none; older folders keep
    the same keys in ``config.json``)."""
    file = folder / GENERATION_CONFIG
    if not file.is_file():
        return {}
    try:
        source = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{file}: cannot read the generation config ({exc})") from None
    if not isinstance(source, dict):
        raise UserError(f"{file}: not a JSON object")
    return source


def read_hf_weights(folder: Path) -> dict[str, Tensor]:
    """Every tensor of ``folder``'s weights (safetensors preferred, sharded or not), by name."""
    files = _weight_files(folder)
    if not files:
        raise UserError(
            f"no weights in {folder} (expected {SAFETENSORS_FILE}, {SAFETENSORS_INDEX}, "
            f"{TORCH_FILE} or {TORCH_INDEX})"
        )
    tensors: dict[str, Tensor] = {}
    for file in files:
        tensors.update(_read_weight_file(file))
    return tensors


def _weight_files(folder: Path) -> list[Path]:
    """The weight files of one format, safetensors first; [] when there are none."""
    for single, index in ((SAFETENSORS_FILE, SAFETENSORS_INDEX), (TORCH_FILE, TORCH_INDEX)):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            return [folder / name for name in _shards(folder / index)]
    return []


def _shards(index: Path) -> list[str]:
    """The shard file names an ``*.index.json`` maps tensor names to, in order."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{index}: not a readable shard index ({exc})") from None


def _read_weight_file(file: Path) -> dict[str, Tensor]:
    try:
        if file.suffix == ".safetensors":
            return load_file(str(file))
        loaded = torch.load(file, map_location="cpu", weights_only=True)
    except (OSError, SafetensorError, RuntimeError, ValueError) as exc:
        raise UserError(f"{file}: cannot read the weights ({exc})") from None
    if not isinstance(loaded, dict) or not all(isinstance(t, Tensor) for t in loaded.values()):
        raise UserError(f"{file}: not a state dict of tensors")
    return loaded


def read_hf_tokenizer(folder: Path) -> TextTokenizer | None:
    """The folder's vocabulary (``tokenizer.json`` or ``vocab.json`` + ``merges.txt``), or None."""
    has_pair = (folder / GPT2_VOCAB).is_file() and (folder / GPT2_MERGES).is_file()
    if (folder / TOKENIZER_JSON).is_file() or has_pair:
        return TextTokenizer.load(folder)
    return None


def write_hf_folder(
    out: Path,
    config: dict[str, Any],
    tensors: dict[str, Tensor],
    tokenizer: TextTokenizer | None = None,
) -> Path:
    """Write ``config.json``, ``model.safetensors`` and, when given, ``tokenizer.json`` with a
    ``tokenizer_config.json`` naming the fast tokenizer class (what ``AutoTokenizer`` reads)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    contiguous = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
    from aiayn.checkpoint import save_safetensors  # the user's umask, not 0600

    save_safetensors(contiguous, out / SAFETENSORS_FILE, metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(out / TOKENIZER_JSON)
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        text = json.dumps(tokenizer_config, indent=2) + "\n"
        (out / TOKENIZER_CONFIG).write_text(text, encoding="utf-8")
    return out
