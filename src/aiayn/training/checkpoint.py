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
        SHA256SUMS              the SHA-256 of every other file, in ``sha256sum`` format
                                (``sha256sum -c SHA256SUMS`` checks a folder by hand)

Integrity: loading checks each file it reads against ``SHA256SUMS`` (the optimizer's only when
it is read, to resume); a corrupt, truncated, missing or ill-fitting file is a
:class:`CheckpointError` naming it. Checkpoints written before checksums (no ``SHA256SUMS``, no
``"checksums"`` key in ``state.json``) load as before, unchecked.

Writing and replacing: the files go into ``NAME.tmp`` (each synced to disk), ``SHA256SUMS``
last, then ``NAME.tmp`` is renamed to ``NAME``. A ``NAME`` that already exists (``best``,
``averaged``, a re-saved step) first steps aside as ``NAME.old``, is deleted once the new
``NAME`` is in place, and stands in for ``NAME`` while ``NAME`` is missing: readers
(:func:`resolve_checkpoint`, :func:`list_checkpoints`) take it then, and the next save of
``NAME`` (or :func:`tidy_checkpoints`) puts it back. So a crash at any point leaves a complete
``NAME`` or ``NAME.old``; a leftover ``NAME.tmp`` is never read and is deleted next time.
Averaging (§6.1) takes the element-wise mean of the weights of several checkpoints.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from functools import cached_property
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
    DEFAULT_FAMILY,
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
CHECKSUM_FILE = "SHA256SUMS"

TMP, OLD, CORRUPT = ".tmp", ".old", ".corrupt"
"""Suffixes of a checkpoint being written, one standing aside while it is replaced, and one that
``--resume`` found unusable and set aside."""

_SUM_LINE = re.compile(r"([0-9a-f]{64}) [ *](\S.*)")
_STEP = re.compile(r"step_\d+")
_CHUNK = 1 << 20
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class CheckpointError(UserError):
    """A checkpoint file is missing, unreadable, corrupt (its SHA-256 differs from the recorded
    one) or does not fit the model: the checkpoint is unusable. ``--resume`` falls back to an
    older checkpoint on this error only."""


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
    def tokenizer_path(self) -> Path:
        """The tokenizer file saved with the checkpoint."""
        return self.path / TOKENIZER_FILE

    @cached_property
    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer state saved with it (:func:`read_optimizer_state`; read and checked
        once, on first use)."""
        return read_optimizer_state(self.path, self.state)


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
    """Write a checkpoint folder atomically, replacing ``path`` if it exists (see the module
    docstring: a crash at any point leaves a complete checkpoint at ``path`` or ``path.old``).

    ``optimizer_state`` (an ``optimizer.state_dict()``, e.g. gathered from FSDP shards) is saved
    instead of ``optimizer``'s own state when given.

    Raises:
        UserError: the folder cannot be written (disk full, read-only, …), naming it; earlier
            checkpoints are intact and no temporary folder is left behind.
    """
    if optimizer_state is None and optimizer is not None:
        optimizer_state = optimizer.state_dict()
    full_state = _full_state(model, state, optimizer_state)
    tmp = _beside(path, TMP)
    try:
        _recover(path)
        tmp.mkdir(parents=True)
        _write_model(tmp, model)
        if optimizer_state is not None:
            _write_optimizer(tmp, optimizer_state)
        _write_state(tmp, full_state)
        _write_tokenizer(tmp, tokenizer_file)
        _write_checksums(tmp)
        _commit(tmp, path)
    except (OSError, SafetensorError) as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"cannot write the checkpoint {path}: {_reason(error)} (nothing was replaced)"
        ) from None
    return path


def _full_state(
    model: nn.Module, state: dict[str, Any], optimizer_state: dict[str, Any] | None
) -> dict[str, Any]:
    """``state`` plus the family, format, model config, optimizer layout and checksum file."""
    config = model.config
    assert isinstance(config, ModelConfig)
    full = {
        **state,
        "family": family_of(model).name,
        "format_version": FORMAT_VERSION,
        "model_config": config.to_dict(),
        "checksums": CHECKSUM_FILE,
    }
    if optimizer_state is not None:
        full["optimizer"] = {"param_groups": optimizer_state["param_groups"]}
    return full


def _write_model(folder: Path, model: nn.Module) -> None:
    save_model(model, str(folder / MODEL_FILE))
    os.chmod(folder / MODEL_FILE, umask_mode())  # safetensors writes 0600: see save_safetensors


def _write_optimizer(folder: Path, optimizer_state: dict[str, Any]) -> None:
    """The moments as safetensors; their layout (parameter groups) goes into ``state.json``."""
    save_safetensors(_optimizer_to_flat(optimizer_state), folder / OPTIMIZER_FILE)


def save_safetensors(
    tensors: dict[str, torch.Tensor], file: Path, metadata: dict[str, str] | None = None
) -> None:
    """``safetensors.torch.save_file``, leaving the file with the mode the user's umask gives
    (safetensors writes a private temporary file, mode 0600, and renames it into place)."""
    save_file(tensors, str(file), metadata=metadata)
    os.chmod(file, umask_mode())


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` less the process's umask: the mode :func:`open` gives a new file.

    Read from ``/proc/self/status`` on Linux; elsewhere by setting the umask and back (to the
    strictest value meanwhile, so that another thread's new file is never more open).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return mode & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return mode & ~umask


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    (folder / STATE_FILE).write_text(json.dumps(state, indent=1), encoding="utf-8")


def _write_tokenizer(folder: Path, tokenizer: TokenizerSource) -> None:
    if isinstance(tokenizer, Path):
        shutil.copyfile(tokenizer, folder / TOKENIZER_FILE)  # a new file: the user's umask
    else:
        tokenizer.save(folder)


def record_checksums(folder: str | Path) -> Path:
    """Write (or rewrite) a checkpoint folder's ``SHA256SUMS`` from its files as they are now:
    after editing a file of a checkpoint by hand, this makes the edit its accepted content.
    Returns the file."""
    _write_checksums(Path(folder))
    return Path(folder) / CHECKSUM_FILE


def _write_checksums(folder: Path) -> None:
    """Sync every file of ``folder`` to disk and list its SHA-256 in ``SHA256SUMS`` (last;
    written beside and renamed into place)."""
    listing = folder / CHECKSUM_FILE
    tmp = _beside(listing, TMP)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p not in (listing, tmp))
    lines = [f"{_sha256(f, sync=True)}  {f.relative_to(folder).as_posix()}\n" for f in files]
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write("".join(lines))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, listing)


def _commit(tmp: Path, path: Path) -> None:
    """Rename the complete ``tmp`` to ``path``. An existing ``path`` steps aside as
    ``path.old`` first and is deleted once the new one is in place (and on disk). Once ``tmp``
    is ``path`` the save has succeeded: what fails after that leaves a leftover at most."""
    _sync_dir(tmp)
    old = _beside(path, OLD)
    replacing = path.exists()
    if replacing:
        os.rename(path, old)  # from here until the next rename, readers take path.old
    try:
        os.rename(tmp, path)
    except OSError:
        if replacing:
            os.rename(old, path)
        raise
    with suppress(OSError):
        _sync_dir(path.parent)
    if replacing:
        shutil.rmtree(old, ignore_errors=True)  # a leftover is deleted by the next save


def _recover(path: Path) -> None:
    """Undo what a crash while writing ``path`` left: ``path.old`` back to ``path`` if
    ``path`` is missing (it is the last complete version), else deleted; ``path.tmp`` deleted.
    A folder there that is not a checkpoint's is refused, never deleted."""
    old, tmp = _beside(path, OLD), _beside(path, TMP)
    if old.exists():
        _refuse_foreign(old)
        if path.exists():
            shutil.rmtree(old)
        else:
            os.rename(old, path)
    if tmp.exists():
        _refuse_foreign(tmp)
        shutil.rmtree(tmp)


def _refuse_foreign(folder: Path) -> None:
    """``folder`` (a ``NAME.tmp`` or ``NAME.old``) must be one aiayn wrote: a folder of files,
    empty or holding weights."""
    entries = list(folder.iterdir()) if folder.is_dir() else None
    if (
        entries is None
        or any(not e.is_file() for e in entries)
        or (entries and not (folder / MODEL_FILE).is_file())
    ):
        raise UserError(f"{folder} is in the way and is not an aiayn checkpoint: move it away")


def tidy_checkpoints(folder: Path) -> None:
    """Clean up after crashes in a folder of checkpoints (a run's ``checkpoints/``): every
    ``NAME.old`` whose ``NAME`` is missing goes back to ``NAME``; other ``NAME.old`` and
    ``NAME.tmp`` folders are deleted."""
    if not folder.is_dir():
        return
    for leftover in sorted(folder.iterdir()):
        if leftover.is_dir() and leftover.name.endswith((TMP, OLD)):
            _recover(leftover.with_name(leftover.name[:-4]))


def set_aside(path: Path) -> Path:
    """Rename an unusable checkpoint ``NAME`` to ``NAME.corrupt`` (replacing an older one of
    that name), so that it is kept for inspection but no longer listed."""
    aside = _beside(path, CORRUPT)
    if aside.is_dir():
        shutil.rmtree(aside)
    os.rename(path, aside)
    return aside


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _sync_dir(folder: Path) -> None:
    """Make renames and new entries in ``folder`` durable (POSIX; Windows has no such call)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(file: Path, *, sync: bool = False) -> str:
    """The file's SHA-256 (hex), read in 1 MiB chunks; ``sync``: flush it to disk as well."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(file, "rb") as handle:
        while size := handle.readinto(buffer):
            digest.update(view[:size])
        if sync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


def _reason(error: OSError | SafetensorError) -> str:
    """What went wrong, in words: the system's message for an ``OSError`` or for the
    ``os error N`` safetensors reports (``No space left on device``), else the first line."""
    if isinstance(error, OSError) and error.strerror:
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror}{where}"
    text = str(error).strip()
    code = _OS_ERROR.search(text)
    if code is not None:
        return os.strerror(int(code[1]))
    return text.splitlines()[0] if text else type(error).__name__


# -- reading ---------------------------------------------------------------------------------


def read_checksums(folder: Path) -> dict[str, str] | None:
    """The recorded SHA-256 of each file of a checkpoint folder (relative path -> hex digest),
    or None when it has no ``SHA256SUMS`` (written before checksums).

    Raises:
        CheckpointError: ``SHA256SUMS`` is unreadable or malformed.
    """
    file = folder / CHECKSUM_FILE
    try:
        text = file.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file}: cannot read the checksums ({error})") from None
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _SUM_LINE.fullmatch(line)
        if match is None:
            raise CheckpointError(f"{file}: line {number} is not '<sha256>  <file name>'")
        sums[match[2]] = match[1]
    return sums


def verify_files(folder: Path, sums: dict[str, str] | None, names: Iterable[str]) -> None:
    """Check the files ``names`` of ``folder`` against ``sums`` (:func:`read_checksums`;
    None: nothing to check).

    Raises:
        CheckpointError: naming a file that is missing, not listed or corrupt.
    """
    if sums is None:
        return
    for name in names:
        file = folder / name
        try:
            digest = _sha256(file)
        except FileNotFoundError:
            raise CheckpointError(f"{file}: missing from the checkpoint") from None
        except OSError as error:
            raise CheckpointError(f"{file}: cannot read it ({_reason(error)})") from None
        _check_digest(file, name, digest, sums)


def _check_digest(file: Path, name: str, digest: str, sums: dict[str, str]) -> None:
    expected = sums.get(name)
    if expected is None:
        raise CheckpointError(f"{file}: not listed in {CHECKSUM_FILE} (an incomplete checkpoint)")
    if digest != expected:
        raise CheckpointError(
            f"{file}: corrupt: its SHA-256 differs from the one recorded in {CHECKSUM_FILE} "
            "(damaged on disk or copied incompletely); restore it or use another checkpoint"
        )


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
    before families existed (no ``family`` recorded) hold the paper's model. Every file but the
    optimizer's is checked against ``SHA256SUMS`` (while the model is built).

    Raises:
        CheckpointError: a file is missing, corrupt, truncated or does not fit, naming it.
    """
    folder, family, config, state = read_checkpoint_config(path)
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
        verified.result()
    tensors = upgrade_state_dict(
        _read_tensors(folder / MODEL_FILE, "weights"), int(state.get("format_version", 1))
    )
    _load_tied(model, tensors, folder / MODEL_FILE)
    return Checkpoint(folder, model.to(map_location).eval(), config, state)


def _read_tensors(file: Path, what: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing from the checkpoint") from None
    except (OSError, SafetensorError) as error:
        raise CheckpointError(
            f"{file}: cannot read the {what}: not a complete safetensors file ({_reason(error)})"
        ) from None


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
    family = family_named(str(state.get("family", DEFAULT_FAMILY)))
    try:
        config = family.config.from_dict(upgrade_config(family.name, state["model_config"]))
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{folder / STATE_FILE}: no valid model config ({error})") from None
    return folder, family, config, state


def _read_state(folder: Path) -> dict[str, Any]:
    """``state.json``, checked against ``SHA256SUMS`` when the folder has one."""
    file = folder / STATE_FILE
    sums = read_checksums(folder)
    try:
        data = file.read_bytes()
    except OSError as error:
        raise CheckpointError(f"{file}: cannot read it ({_reason(error)})") from None
    if sums is not None:
        _check_digest(file, STATE_FILE, hashlib.sha256(data).hexdigest(), sums)
    try:
        state = json.loads(data.decode("utf-8"))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise CheckpointError(f"{file}: not valid JSON ({error})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(state).__name__}")
    if sums is None and "checksums" in state:
        raise CheckpointError(f"{folder / CHECKSUM_FILE}: missing (state.json records it)")
    return state


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


def load_optimizer(path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore the optimizer saved by :func:`save_checkpoint` into ``optimizer``.

    Raises:
        CheckpointError: the saved state is missing, corrupt or does not fit ``optimizer``'s
            parameters, naming the file.
    """
    load_optimizer_state(path, optimizer, read_optimizer_state(path, state))


def load_optimizer_state(
    path: Path, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """Load ``saved`` (:func:`read_optimizer_state` of checkpoint ``path``) into ``optimizer``
    after checking each moment's shape against its parameter's."""
    file = path / OPTIMIZER_FILE
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, per_param in saved["state"].items():
        if not 0 <= index < len(params):
            raise CheckpointError(
                f"{file}: state of parameter {index}, but there are {len(params)}"
            )
        for name, tensor in per_param.items():
            if tensor.dim() > 0 and tensor.shape != params[index].shape:
                raise CheckpointError(
                    f"{file}: {index}.{name} has shape {list(tensor.shape)}, its parameter "
                    f"{list(params[index].shape)} (written for another model?)"
                )
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{file}: does not fit the optimizer ({error})") from None


def read_optimizer_state(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The ``optimizer.state_dict()`` saved by :func:`save_checkpoint` (parameter indices),
    checked against ``SHA256SUMS``.

    Raises:
        CheckpointError: the file is missing, corrupt or malformed, or ``state`` has no
            optimizer layout, naming the file.
    """
    file = path / OPTIMIZER_FILE
    verify_files(path, read_checksums(path), [OPTIMIZER_FILE])
    flat = _read_tensors(file, "optimizer state")
    try:
        groups = state["optimizer"]["param_groups"]
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, tensor in flat.items():
            index, name = key.split(".", 1)
            per_param.setdefault(int(index), {})[name] = tensor
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{file}: not an optimizer state aiayn wrote ({error})") from None
    return {"state": per_param, "param_groups": groups}


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder itself (or its ``NAME.old`` while a crash left ``NAME`` missing), or
    the latest ``checkpoints/step_*`` of a run folder."""
    folder = Path(path)
    if (folder / STATE_FILE).is_file():
        return folder
    stand_in = _beside(folder, OLD)
    if not folder.exists() and (stand_in / STATE_FILE).is_file():
        return stand_in
    steps = list_checkpoints(folder)
    if steps:
        return steps[-1]
    if (folder / "config.json").is_file():  # a Hugging Face model folder
        raise UserError(
            f"{folder} is a Hugging Face model folder, not an aiayn checkpoint: convert it "
            f"first: aiayn convert --from-hf {folder} --to DIR"
        )
    raise UserError(f"no checkpoint found at {folder} (expected {STATE_FILE} or checkpoints/)")


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's ``checkpoints/step_*`` folders, oldest first; ``step_X.old`` stands in for a
    ``step_X`` that a crash left missing; ``.tmp`` and ``.corrupt`` folders are left out."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found: dict[str, Path] = {}
    for folder in root.glob("step_*"):
        name = folder.name.removesuffix(OLD)
        if not folder.is_dir() or not _STEP.fullmatch(name):
            continue
        if folder.name == name or not (root / name).exists():
            found[name] = folder
    return [found[name] for name in sorted(found)]


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (``best`` is elsewhere). Each
    goes at once (renamed to ``NAME.tmp``, then deleted): a crash never leaves half of one."""
    for old in list_checkpoints(run_dir)[:-keep_last]:
        garbage = _beside(old.with_name(old.name.removesuffix(OLD)), TMP)
        shutil.rmtree(garbage, ignore_errors=True)
        os.rename(old, garbage)
        shutil.rmtree(garbage)


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


def _optimizer_to_flat(sd: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        f"{index}.{name}": value.detach().contiguous().cpu()
        for index, per_param in sd["state"].items()
        for name, value in per_param.items()
        if isinstance(value, torch.Tensor)
    }


def _np_state() -> list[Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
