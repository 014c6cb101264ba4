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
``torch.load(weights_only=True)``: tensors only, no pickled code runs; a file it refuses is
named without torch's advice to turn that off.

A folder may come from anyone, so only regular files inside it are read
(:func:`folder_file`): a shard index naming an absolute path, a ``..`` or a link leading out
of the folder, a FIFO or a device is refused by name (the one way out allowed is the Hub
cache's own layout, ``snapshots/<revision>/<file>`` linking to ``../../blobs/``). A tensor
holding NaN or an infinity is refused by name.

A source that is not an existing folder is taken for a Hub name (``gpt2``, ``openai-community/
gpt2``) and fetched with ``huggingface_hub.snapshot_download`` (the weights in one format only).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
from pathlib import Path, PurePath
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from aiayn.data.json_files import read_json_object
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


def folder_file(folder: Path, name: str, *, what: str = "file") -> Path:
    """``folder / name`` when it is a regular file inside ``folder`` (through links that stay
    inside it, or lead to the Hub cache's ``blobs/`` from a snapshot folder).

    Raises:
        UserError: ``name`` is absolute or holds ``..``; the file is missing, leads out of
            ``folder``, or is not a regular file (a FIFO, a device, a folder).
    """
    parts = PurePath(name).parts if isinstance(name, str) else ()
    if not parts or PurePath(name).is_absolute() or ".." in parts:
        raise UserError(f"{folder}: {what} {name!r} is not a file name inside the folder")
    path = folder / name
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    real = path.resolve()
    if not any(real.is_relative_to(root) for root in _roots(folder)):
        raise UserError(f"{path}: the {what} leads out of the folder (to {real})")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: the {what} is not a regular file")
    return path


def _roots(folder: Path) -> list[Path]:
    """The folders a file of ``folder`` may really be in: itself, and for a snapshot of the Hub
    cache (``models--x/snapshots/<revision>``) that repository's ``blobs/`` (a real folder)."""
    real = folder.resolve()
    roots = [real]
    blobs = real.parent.parent / "blobs"
    if real.parent.name == "snapshots" and blobs.is_dir() and not blobs.is_symlink():
        roots.append(blobs)
    return roots


def read_hf_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of ``folder`` as a dict."""
    file = folder / CONFIG_FILE
    if os.path.lexists(file):
        folder_file(folder, CONFIG_FILE, what="model config")
    return read_json_object(file, "the model config")


def read_hf_generation(folder: Path) -> dict[str, Any]:
    """The folder's ``generation_config.json`` as a dict ({} when it has none; older folders keep
    the same keys in ``config.json``)."""
    file = folder / GENERATION_CONFIG
    if not os.path.lexists(file):
        return {}
    folder_file(folder, GENERATION_CONFIG, what="generation config")
    return read_json_object(file, "the generation config")


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
    """The weight files of one format, safetensors first, each a regular file inside
    ``folder`` (:func:`folder_file`); [] when there are none."""
    for single, index in ((SAFETENSORS_FILE, SAFETENSORS_INDEX), (TORCH_FILE, TORCH_INDEX)):
        if os.path.lexists(folder / single):
            return [folder_file(folder, single, what="weights file")]
        if os.path.lexists(folder / index):
            shards = _shards(folder_file(folder, index, what="shard index"))
            return [folder_file(folder, name, what="shard") for name in shards]
    return []


def _shards(index: Path) -> list[str]:
    """The shard file names an ``*.index.json`` maps tensor names to, in order."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = set(weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{index}: not a readable shard index ({exc})") from None
    strange = [name for name in names if not isinstance(name, str)]
    if strange or not names:
        raise UserError(f"{index}: not a readable shard index (shard names {strange or 'none'})")
    return sorted(names)


def _read_weight_file(file: Path) -> dict[str, Tensor]:
    if file.suffix == ".safetensors":
        try:
            loaded = load_file(str(file))
        except (OSError, SafetensorError, RuntimeError, ValueError) as exc:
            raise UserError(f"{file}: cannot read the weights ({exc})") from None
    else:
        loaded = _torch_load(file)
    if not isinstance(loaded, dict) or not all(isinstance(t, Tensor) for t in loaded.values()):
        raise UserError(f"{file}: not a state dict of tensors")
    for name, tensor in loaded.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UserError(f"{file}: tensor {name!r} holds NaN or infinite values")
    return loaded


def _torch_load(file: Path) -> Any:
    """A ``.bin`` file's contents, unpickled with ``weights_only=True`` (tensors and plain
    containers only: no pickled code ever runs).

    Raises:
        UserError: naming the file and what is wrong, never advising ``weights_only=False``.
    """
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # any bytes reach the unpickler: every failure is the file's
        raise UserError(f"{file}: cannot read the weights ({_load_failure(exc)})") from None


def _load_failure(exc: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in aiayn's words: torch's own
    message advises the unsafe ``weights_only=False``, so it is not repeated."""
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if isinstance(exc, pickle.UnpicklingError) and found:
        return (
            f"it holds pickled code or objects other than tensors ({found.group(1)}), which "
            "aiayn never runs; ask for the model as safetensors"
        )
    if isinstance(exc, EOFError) or "EOF" in str(exc):
        return "empty or truncated"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return "not a PyTorch weights file"


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
