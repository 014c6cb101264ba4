"""Checkpoints: weights as safetensors, optimizer moments as safetensors, the rest as JSON.

A checkpoint is a self-contained folder (``aiayn translate --checkpoint DIR`` needs nothing else)::

    step_00001000/
        model.safetensors       the weights (tied tensors stored once)
        optimizer.safetensors   Adam's moments, per parameter index
        state.json              run config, model config, step, data position, optimizer
                                hyper-parameters, RNG states (of every rank when several
                                processes trained), world size, metrics
        tokenizer.json          the joint BPE vocabulary (aiayn's own models); a converted
                                pretrained model holds its own tokenizer files instead, listed
                                in pretrained_tokenizer.json (aiayn.data.pretrained_tokenizer)

It is written into ``NAME.tmp`` and renamed into place, so a crash never leaves half a checkpoint.
Averaging (§6.1) takes the element-wise mean of the weights of several checkpoints.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model
from torch import nn

from aiayn.config import ModelConfig
from aiayn.data.bert_tokenizer import MANIFEST as BERT_MANIFEST
from aiayn.data.bert_tokenizer import BertTokenizer, load_bert_tokenizer
from aiayn.data.images import PREPROCESSOR_CONFIG, ImagePreprocessor
from aiayn.data.pretrained_tokenizer import (
    MANIFEST,
    PretrainedTokenizer,
    TranslationTokenizer,
    load_pretrained_tokenizer,
)
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.models import Transformer
from aiayn.models.families import (
    FAMILIES,
    FORMAT_VERSION,
    Family,
    family_named,
    family_of,
    upgrade_config,
    upgrade_state_dict,
)

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
TOKENIZER_FILE = "tokenizer.json"


M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class Checkpoint(Generic[M]):
    """A loaded checkpoint: the model (eval mode), its family's config and the JSON state."""

    path: Path
    model: M
    config: ModelConfig
    state: dict[str, Any]

    @property
    def family(self) -> str:
        """The model family the checkpoint holds (``transformer``, ``gpt2``…)."""
        return str(self.state.get("family", "transformer"))

    @property
    def tokenizer_path(self) -> Path:
        """The tokenizer file saved with the checkpoint."""
        return self.path / TOKENIZER_FILE


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) random states, JSON-serialisable."""
    state: dict[str, Any] = {
        "python": _b64(repr(random.getstate()).encode()),
        "numpy": _b64(json.dumps(_np_state()).encode()),
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    import ast

    random.setstate(ast.literal_eval(_unb64(state["python"]).decode()))
    np_state = json.loads(_unb64(state["numpy"]).decode())
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.frombuffer(bytearray(_unb64(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(_unb64(s)), dtype=torch.uint8) for s in state["cuda"]]
        )


TokenizerSource = Path | PretrainedTokenizer | BertTokenizer | ImagePreprocessor
"""A checkpoint's input processing: a tokenizer file (saved as ``tokenizer.json``), a pretrained
model's tokenizer, which saves its own files with a manifest, or a ViT's image preprocessing
(``preprocessor_config.json``)."""


def save_checkpoint(
    path: Path,
    model: nn.Module,
    state: dict[str, Any],
    tokenizer_file: TokenizerSource,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint folder atomically (temporary folder, then rename).

    ``optimizer_state`` (an ``optimizer.state_dict()``, e.g. gathered from FSDP shards) is saved
    instead of ``optimizer``'s own state when given.
    """
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / MODEL_FILE))
    config = model.config
    assert isinstance(config, ModelConfig)
    full_state = {
        **state,
        "family": family_of(model).name,
        "format_version": FORMAT_VERSION,
        "model_config": config.to_dict(),
    }
    if optimizer_state is None and optimizer is not None:
        optimizer_state = optimizer.state_dict()
    if optimizer_state is not None:
        tensors, meta = _optimizer_to_flat(optimizer_state)
        save_file(tensors, str(tmp / OPTIMIZER_FILE))
        full_state["optimizer"] = meta
    (tmp / STATE_FILE).write_text(json.dumps(full_state, indent=1), encoding="utf-8")
    if isinstance(tokenizer_file, Path):
        shutil.copyfile(tokenizer_file, tmp / TOKENIZER_FILE)
    else:
        tokenizer_file.save(tmp)
    if path.exists():
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old)
    else:
        tmp.rename(path)
    return path


@overload
def load_checkpoint(
    path: str | Path, *, map_location: str | torch.device = "cpu"
) -> Checkpoint[Transformer]: ...


@overload
def load_checkpoint(
    path: str | Path, *, map_location: str | torch.device = "cpu", expect: type[M]
) -> Checkpoint[M]: ...


def load_checkpoint(
    path: str | Path,
    *,
    map_location: str | torch.device = "cpu",
    expect: type[nn.Module] = Transformer,
) -> Checkpoint[Any]:
    """Load a checkpoint folder (or a run folder: its latest checkpoint) into a model.

    ``expect``: the model class the caller needs (the paper's :class:`Transformer` by default;
    ``nn.Module`` for any family). A checkpoint of another family is a :class:`UserError` naming
    both, as is an unknown family or a format newer than this aiayn reads. Checkpoints written
    before families existed (no ``family`` recorded) hold the paper's model.
    """
    folder, family, config, state = read_checkpoint_config(path)
    if not issubclass(family.model, expect):
        wanted = [f.name for f in FAMILIES.values() if issubclass(f.model, expect)]
        raise UserError(
            f"{folder} holds a {family.name} model; this needs a checkpoint of "
            f"{' or '.join(wanted) or expect.__name__}"
        )
    model = family.model(config)
    try:
        version = int(state.get("format_version", 1))
        tensors = upgrade_state_dict(load_file(str(folder / MODEL_FILE)), version)
    except (OSError, SafetensorError, TypeError) as error:
        raise UserError(f"{folder / MODEL_FILE}: cannot read the weights ({error})") from None
    _load_tied(model, tensors, folder / MODEL_FILE)
    return Checkpoint(folder, model.to(map_location).eval(), config, state)


def read_checkpoint_config(path: str | Path) -> tuple[Path, Family, ModelConfig, dict[str, Any]]:
    """A checkpoint's folder, model family, model config and JSON state, without its weights.

    Raises:
        UserError: naming the folder, when its state is unreadable or names an unknown family.
    """
    folder = resolve_checkpoint(path)
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
        family = family_named(str(state.get("family", "transformer")))
        config = family.config.from_dict(upgrade_config(family.name, state["model_config"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{folder}: not a readable aiayn checkpoint ({error})") from None
    return folder, family, config, state


def _load_tied(model: nn.Module, tensors: dict[str, torch.Tensor], file: Path) -> None:
    """Load ``tensors`` into ``model``. A tied tensor is saved under one of its names only: a
    name may be missing from the file if another name of the same parameter is in it."""
    names_of: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names_of.setdefault(id(tensor), []).append(name)
    for names in names_of.values():
        present = [n for n in names if n in tensors]
        if not present:
            raise UserError(f"{file}: no tensor {names[0]!r} (written for another model?)")
        for name in names:
            tensors.setdefault(name, tensors[present[0]])
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        first = str(error).strip().splitlines()[:2]
        raise UserError(f"{file}: weights do not fit the model ({' '.join(first)})") from None


def load_optimizer(path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore the optimizer saved by :func:`save_checkpoint` into ``optimizer``."""
    optimizer.load_state_dict(read_optimizer_state(path, state))


def read_optimizer_state(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The ``optimizer.state_dict()`` saved by :func:`save_checkpoint` (parameter indices)."""
    flat = load_file(str(path / OPTIMIZER_FILE))
    meta = state["optimizer"]
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in flat.items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = tensor
    return {"state": per_param, "param_groups": meta["param_groups"]}


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder itself, or the latest ``checkpoints/step_*`` of a run folder."""
    folder = Path(path)
    if (folder / STATE_FILE).is_file():
        return folder
    steps = list_checkpoints(folder)
    if steps:
        return steps[-1]
    raise UserError(f"no checkpoint found at {folder} (expected {STATE_FILE} or checkpoints/)")


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's ``checkpoints/step_*`` folders, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith((".tmp", ".old"))
    )


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (``best`` is elsewhere)."""
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old)


def average_checkpoints(paths: list[Path], out: Path) -> Path:
    """Average the parameters of ``paths`` into a new checkpoint at ``out`` (§6.1).

    Tied weights stay tied: the averaged tensors are loaded into a freshly built (tied) model.
    The state, tokenizer and config are taken from the newest checkpoint.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    newest = load_checkpoint(paths[-1], expect=nn.Module)
    total = {name: t.double() for name, t in newest.model.state_dict().items()}
    for path in paths[:-1]:
        other = load_checkpoint(path, expect=nn.Module)
        if other.config != newest.config:
            raise UserError(f"{path} has a different model config from {paths[-1]}")
        for name, tensor in other.model.state_dict().items():
            total[name] += tensor.double()
    averaged = {name: (t / len(paths)).float() for name, t in total.items()}
    model = newest.model
    model.load_state_dict(averaged)
    state = {**newest.state, "averaged_from": [str(p) for p in paths]}
    state.pop("optimizer", None)
    return save_checkpoint(out, model, state, checkpoint_tokenizer(newest.path))


def checkpoint_tokenizer(folder: Path) -> TokenizerSource:
    """The vocabulary saved in a checkpoint folder: a pretrained tokenizer when the folder lists
    one (a converted T5 or Marian model), else its ``tokenizer.json``."""
    if (folder / MANIFEST).is_file():
        return load_pretrained_tokenizer(folder)
    if (folder / BERT_MANIFEST).is_file():
        return load_bert_tokenizer(folder)
    if (folder / PREPROCESSOR_CONFIG).is_file():
        return ImagePreprocessor.from_folder(folder)
    return folder / TOKENIZER_FILE


def load_translation_tokenizer(folder: Path) -> TranslationTokenizer:
    """The tokenizer an encoder–decoder checkpoint translates with: the pretrained model's own,
    or aiayn's joint BPE vocabulary (:class:`~aiayn.data.tokenizer.Tokenizer`)."""
    source = checkpoint_tokenizer(folder)
    if isinstance(source, (BertTokenizer, ImagePreprocessor)):
        raise UserError(f"{folder} holds an encoder-only model's inputs: it does not translate")
    return Tokenizer.load(source) if isinstance(source, Path) else source


def _optimizer_to_flat(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], Any]:
    tensors = {
        f"{index}.{name}": value.detach().contiguous().cpu()
        for index, per_param in sd["state"].items()
        for name, value in per_param.items()
        if isinstance(value, torch.Tensor)
    }
    return tensors, {"param_groups": sd["param_groups"]}


def _np_state() -> list[Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
