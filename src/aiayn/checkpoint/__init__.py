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

Integrity: ``state.json`` lists the checkpoint's files (its manifest); ``SHA256SUMS`` must list
exactly those, every file of the folder must be listed, and each must be a regular file in the
folder (no link, FIFO or device: nothing outside is read, nothing hangs). Loading checks each
file it reads against ``SHA256SUMS`` (the optimizer's only when it is read, to resume); a
corrupt, truncated, missing, unlisted or ill-fitting file is a :class:`CheckpointError` naming
it. Checkpoints written before checksums (no ``SHA256SUMS``, no
``"checksums"`` key in ``state.json``) load as before, unchecked.

Writing replaces a checkpoint atomically: a crash at any point leaves a complete ``NAME`` or its
stand-in ``NAME.old`` (:mod:`aiayn.checkpoint.files`). Running a model needs this package only,
never :mod:`aiayn.training`.

Modules: ``files`` (names, atomic writes, recovery, umask), ``checksums`` (``SHA256SUMS``),
``upgrade`` (format versions), ``tokenizers`` (a checkpoint's input processing), ``optimizer``
(``optimizer.safetensors``), ``folders`` (finding, tidying and pruning a run's checkpoints),
``save``, ``load``, ``quantized`` (an int8 checkpoint's tensors, checked as it loads) and
``average`` (§6.1).
"""

from aiayn.checkpoint.average import average_checkpoints
from aiayn.checkpoint.checksums import read_checksums, record_checksums, verify_files
from aiayn.checkpoint.files import (
    CHECKSUM_FILE,
    CORRUPT,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    CheckpointError,
    save_safetensors,
    umask_mode,
)
from aiayn.checkpoint.folders import (
    list_checkpoints,
    prune_checkpoints,
    resolve_checkpoint,
    set_aside,
    tidy_checkpoints,
)
from aiayn.checkpoint.load import Checkpoint, load_checkpoint, read_checkpoint_config
from aiayn.checkpoint.optimizer import load_optimizer, load_optimizer_state, read_optimizer_state
from aiayn.checkpoint.save import save_checkpoint
from aiayn.checkpoint.tokenizers import (
    TOKENIZER_FILE,
    TokenizerSource,
    checkpoint_bert_tokenizer,
    checkpoint_preprocessor,
    checkpoint_tokenizer,
    load_translation_tokenizer,
)
from aiayn.checkpoint.upgrade import FORMAT_VERSION

__all__ = [
    "CHECKSUM_FILE",
    "CORRUPT",
    "FORMAT_VERSION",
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "STATE_FILE",
    "TOKENIZER_FILE",
    "Checkpoint",
    "CheckpointError",
    "TokenizerSource",
    "average_checkpoints",
    "checkpoint_bert_tokenizer",
    "checkpoint_preprocessor",
    "checkpoint_tokenizer",
    "list_checkpoints",
    "load_checkpoint",
    "load_optimizer",
    "load_optimizer_state",
    "load_translation_tokenizer",
    "prune_checkpoints",
    "read_checkpoint_config",
    "read_checksums",
    "read_optimizer_state",
    "record_checksums",
    "resolve_checkpoint",
    "save_checkpoint",
    "save_safetensors",
    "set_aside",
    "tidy_checkpoints",
    "umask_mode",
    "verify_files",
]
