"""Loading a checkpoint folder into a model of its family, every file it reads checked against
``SHA256SUMS`` (:mod:`aiayn.checkpoint.checksums`) and brought up to the current format
(:mod:`aiayn.checkpoint.upgrade`)."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import torch
from torch import nn

from aiayn.checkpoint.checksums import (
    check_contents,
    check_digest,
    read_checksums,
    verify_files,
)
from aiayn.checkpoint.files import (
    CHECKSUM_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    CheckpointError,
    read_safetensors,
    read_small,
)
from aiayn.checkpoint.folders import resolve_checkpoint
from aiayn.checkpoint.optimizer import read_optimizer_state
from aiayn.checkpoint.quantized import check_int8_tensors
from aiayn.checkpoint.tokenizers import TOKENIZER_FILE
from aiayn.checkpoint.upgrade import upgrade_config, upgrade_state_dict
from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.layers.quantized import QUANTIZE_MODES, quantize_linears
from aiayn.limits import MAX_CHECKPOINT_JSON_BYTES
from aiayn.models import Transformer
from aiayn.models.families import (
    DEFAULT_FAMILY,
    FAMILIES,
    Family,
    family_named,
    refuse_unless_serving,
)

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
        return str(self.state.get("family", DEFAULT_FAMILY))

    @property
    def quantization(self) -> str:
        """How its weights are stored: ``none`` (fp32) or ``int8``."""
        return quantization_of(self.state)

    @property
    def tokenizer_path(self) -> Path:
        """The tokenizer file saved with the checkpoint."""
        return self.path / TOKENIZER_FILE

    @cached_property
    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer state saved with it (:func:`read_optimizer_state`; read and checked
        once, on first use)."""
        return read_optimizer_state(self.path, self.state)


@overload
def load_checkpoint(
    path: str | Path,
    *,
    map_location: str | torch.device = "cpu",
    command: str | None = None,
    quantize: str = "none",
    fp32_for: str | None = None,
) -> Checkpoint[Transformer]: ...


@overload
def load_checkpoint(
    path: str | Path,
    *,
    map_location: str | torch.device = "cpu",
    expect: type[M],
    command: str | None = None,
    quantize: str = "none",
    fp32_for: str | None = None,
) -> Checkpoint[M]: ...


def load_checkpoint(
    path: str | Path,
    *,
    map_location: str | torch.device = "cpu",
    expect: type[nn.Module] = Transformer,
    command: str | None = None,
    quantize: str = "none",
    fp32_for: str | None = None,
) -> Checkpoint[Any]:
    """Load a checkpoint folder (or a run folder: its latest checkpoint) into a model.

    ``command``: what the checkpoint is loaded for (``translate``…): its family must serve it
    (the family registry's ``commands``). ``expect``: the model class the caller needs (the
    paper's :class:`Transformer` by default; ``nn.Module`` for any family). A checkpoint of
    another family is a :class:`UserError` naming both, as is an unknown family or a format
    newer than this aiayn reads. Checkpoints written
    before families existed (no ``family`` recorded) hold the paper's model. Every file but the
    optimizer's is checked against ``SHA256SUMS`` (while the model is built).

    ``quantize``: ``int8`` quantises an fp32 checkpoint's linear layers as it loads
    (:mod:`aiayn.layers.quantized`, the family's :class:`~aiayn.models.families.QuantizePolicy`);
    a checkpoint written by ``aiayn quantize`` loads its int8 layers as saved, whatever this
    says. ``fp32_for``: what needs the fp32 weights ("averaging"): a quantised checkpoint is
    then a :class:`UserError` naming the folder and it.

    Raises:
        CheckpointError: a file is missing, corrupt, truncated or does not fit, naming it; in a
            quantised checkpoint, an int8 layer's weight or scales of another dtype or shape, or
            a scale not finite and > 0 (:mod:`aiayn.checkpoint.quantized`), naming the tensor.
    """
    if quantize not in QUANTIZE_MODES:
        raise UserError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {quantize!r}")
    folder, family, config, state = read_checkpoint_config(path)
    stored = quantization_of(state)
    if fp32_for is not None and stored != "none":
        raise UserError(
            f"{folder} holds an {stored}-quantised model; {fp32_for} needs fp32 weights"
        )
    if command is not None:
        refuse_unless_serving(family, command, folder)
    if not issubclass(family.model, expect):
        wanted = [f.name for f in FAMILIES.values() if issubclass(f.model, expect)]
        raise UserError(
            f"{folder} holds a {family.name} model; this needs a checkpoint of "
            f"{' or '.join(wanted) or expect.__name__}"
        )
    sums = read_checksums(folder)
    names = [n for n in sums or () if n not in (STATE_FILE, OPTIMIZER_FILE)]
    with ThreadPoolExecutor(max_workers=1) as pool:  # hashing overlaps building the model
        verified = pool.submit(verify_files, folder, sums, names)
        model = family.model(config)
        if stored != "none":  # the int8 layers' structure, filled by the saved tensors
            quantize_linears(model, family.quantize.keeps, values=False)
        verified.result()
    _load_tied(model, _read_weights(folder, state, model), folder / MODEL_FILE)
    if quantize != "none" and stored == "none":
        model.requires_grad_(False)
        quantize_linears(model, family.quantize.keeps)
    return Checkpoint(folder, model.to(map_location).eval(), config, state)


def quantization_of(state: dict[str, Any]) -> str:
    """How a checkpoint's ``state.json`` says its weights are stored: ``none`` (fp32, the
    default) or ``int8`` (written by ``aiayn quantize``)."""
    return str(state.get("quantization", "none"))


def read_checkpoint_config(path: str | Path) -> tuple[Path, Family, ModelConfig, dict[str, Any]]:
    """A checkpoint's folder, model family, model config and JSON state, without its weights
    (``state.json`` is checked against ``SHA256SUMS``).

    Raises:
        CheckpointError: naming ``state.json`` or ``SHA256SUMS``, when missing, corrupt or
            unreadable.
        UserError: naming the folder, when its state names an unknown family or a newer format.
    """
    folder = resolve_checkpoint(path)
    state = _read_state(folder)
    file = folder / STATE_FILE
    _check_field(file, state, "family", str)
    _check_field(file, state, "format_version", int)
    _check_field(file, state, "model_config", dict)
    _check_field(file, state, "quantization", str)
    if quantization_of(state) not in QUANTIZE_MODES:
        raise CheckpointError(f"{file}: unknown quantization {state['quantization']!r}")
    family = family_named(str(state.get("family", DEFAULT_FAMILY)))
    try:
        config = family.config.from_dict(upgrade_config(family.name, state["model_config"]))
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{file}: no valid model config ({error})") from None
    return folder, family, config, state


_TYPE_NAMES = {str: "a string", int: "an integer", dict: "a JSON object"}


def _check_field(file: Path, state: dict[str, Any], key: str, kind: type) -> None:
    """``state[key]``, when present, has JSON type ``kind`` (a bool is not an integer)."""
    if key not in state:
        return
    value = state[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise CheckpointError(
            f"{file}: {key}={shown} has the wrong type (expected {_TYPE_NAMES[kind]})"
        )


def _read_state(folder: Path) -> dict[str, Any]:
    """``state.json``, checked against ``SHA256SUMS`` when the folder has one, and the folder's
    files against its manifest and ``SHA256SUMS`` (:func:`check_contents`)."""
    file = folder / STATE_FILE
    sums = read_checksums(folder)
    data = read_small(file, MAX_CHECKPOINT_JSON_BYTES)
    if sums is not None:
        check_digest(file, STATE_FILE, hashlib.sha256(data).hexdigest(), sums)
    try:
        state = json.loads(data.decode("utf-8"))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise CheckpointError(f"{file}: not valid JSON ({error})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(state).__name__}")
    if sums is None and "checksums" in state:
        raise CheckpointError(f"{folder / CHECKSUM_FILE}: missing (state.json records it)")
    check_contents(folder, sums, state)
    return state


def _read_weights(folder: Path, state: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """The checkpoint's weights, brought up to the current format, the int8 layers' tensors
    checked against ``model``'s (:func:`~aiayn.checkpoint.quantized.check_int8_tensors`)."""
    file = folder / MODEL_FILE
    tensors = upgrade_state_dict(read_safetensors(file, "weights"), state.get("format_version", 1))
    check_int8_tensors(model, tensors, file)
    return tensors


def _load_tied(model: nn.Module, tensors: dict[str, torch.Tensor], file: Path) -> None:
    """Load ``tensors`` into ``model``. A tied tensor is saved under one of its names only: a
    name may be missing from the file if another name of the same parameter is in it."""
    names_of: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names_of.setdefault(id(tensor), []).append(name)
    for names in names_of.values():
        present = [n for n in names if n in tensors]
        if not present:
            raise CheckpointError(f"{file}: no tensor {names[0]!r} (written for another model?)")
        for name in names:
            tensors.setdefault(name, tensors[present[0]])
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        first = str(error).strip().splitlines()[:2]
        raise CheckpointError(f"{file}: weights do not fit the model ({' '.join(first)})") from None
