"""``SHA256SUMS``: the SHA-256 of every file of a checkpoint folder, in ``sha256sum`` format
(``sha256sum -c SHA256SUMS`` checks a folder by hand), written last when a checkpoint is saved
and checked file by file when it is read.

What is verified against what (:func:`check_contents`): ``state.json`` lists the files the
checkpoint holds (its manifest, ``"files"``); ``SHA256SUMS`` must list exactly those (a missing
line is an error) and every file of the folder must be listed (an unlisted file is an error:
it is never read); each name in it must be a plain file name, and each file a regular file in
the folder (no link, FIFO or device: nothing outside the folder is read, and nothing hangs).
Each file's SHA-256 is checked when it is read.

Checkpoints written before checksums (no ``SHA256SUMS``) read as unchecked:
:func:`read_checksums` returns None for them and :func:`verify_files` then checks nothing; their
files must still be regular files. Checkpoints written before the manifest (checksums, no
``"files"``) must list at least the weights and ``state.json`` (and the optimizer's file when
``state.json`` describes one).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from aiayn.checkpoint.files import (
    ADDED_FILES,
    CHECKSUM_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    TMP,
    CheckpointError,
    beside,
    open_regular,
    read_small,
    reason,
    regular_file,
)
from aiayn.limits import MAX_CHECKPOINT_JSON_BYTES

_SUM_LINE = re.compile(r"([0-9a-f]{64}) [ *](\S.*)")
_CHUNK = 1 << 20


def record_checksums(folder: str | Path) -> Path:
    """Write (or rewrite) a checkpoint folder's ``SHA256SUMS`` from its files as they are now:
    after editing a file of a checkpoint by hand, this makes the edit its accepted content.
    Returns the file."""
    write_checksums(Path(folder))
    return Path(folder) / CHECKSUM_FILE


def write_checksums(folder: Path) -> None:
    """Sync every file of ``folder`` to disk and list its SHA-256 in ``SHA256SUMS`` (last;
    written beside and renamed into place)."""
    listing = folder / CHECKSUM_FILE
    tmp = beside(listing, TMP)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p not in (listing, tmp))
    _write_listing(
        folder, [(f.relative_to(folder).as_posix(), sha256(f, sync=True)) for f in files]
    )


def _write_listing(folder: Path, sums: Iterable[tuple[str, str]]) -> None:
    """Write ``SHA256SUMS`` from (name, digest) pairs, in their order: beside it, synced, then
    renamed into place."""
    listing = folder / CHECKSUM_FILE
    tmp = beside(listing, TMP)
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write("".join(f"{digest}  {name}\n" for name, digest in sums))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, listing)


def sha256(file: Path, *, sync: bool = False) -> str:
    """The file's SHA-256 (hex), read in 1 MiB chunks; ``sync``: flush it to disk as well."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with os.fdopen(open_regular(file), "rb") as handle:
        while size := handle.readinto(buffer):
            digest.update(view[:size])
        if sync:
            os.fsync(handle.fileno())
    return digest.hexdigest()


def read_checksums(folder: Path) -> dict[str, str] | None:
    """The recorded SHA-256 of each file of a checkpoint folder (relative path -> hex digest),
    or None when it has no ``SHA256SUMS`` (written before checksums).

    Raises:
        CheckpointError: ``SHA256SUMS`` is unreadable or malformed.
    """
    file = folder / CHECKSUM_FILE
    if not os.path.lexists(file):
        return None
    try:
        text = read_small(file, MAX_CHECKPOINT_JSON_BYTES).decode("ascii")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{file}: cannot read the checksums ({error})") from None
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _SUM_LINE.fullmatch(line)
        if match is None:
            raise CheckpointError(f"{file}: line {number} is not '<sha256>  <file name>'")
        name = match[2]
        if not plain_name(name) or name == CHECKSUM_FILE:
            raise CheckpointError(
                f"{file}: line {number} names {name!r}, not a file of the checkpoint folder "
                "(a plain file name: no folder, no '..')"
            )
        if name in sums:
            raise CheckpointError(f"{file}: {name!r} is listed twice")
        sums[name] = match[1]
    return sums


def plain_name(name: str) -> bool:
    """A file name without a folder: no ``/`` or ``\\``, not ``.`` or ``..``, no NUL."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def check_contents(folder: Path, sums: dict[str, str] | None, state: dict[str, object]) -> None:
    """The folder holds what ``state.json``'s manifest and ``SHA256SUMS`` say, each a regular
    file, and nothing else (:data:`ADDED_FILES` aside); without ``SHA256SUMS`` (an older
    checkpoint), every file in it must still be a regular file or a folder (never read).

    Raises:
        CheckpointError: naming the first file missing, unlisted, listed but not in the
            manifest, or not a regular file.
    """
    entries = sorted(os.listdir(folder))
    if sums is None:
        for name in entries:
            if not (folder / name).is_dir() or (folder / name).is_symlink():
                regular_file(folder / name)
        return
    for name in entries:
        if name != CHECKSUM_FILE and name not in sums and name not in ADDED_FILES:
            raise CheckpointError(
                f"{folder / name}: not listed in {CHECKSUM_FILE}, so not part of the checkpoint "
                "(aiayn reads no unlisted file): remove it"
            )
    for name in sums:
        regular_file(folder / name)
    _check_manifest(folder, sums, state)


def _check_manifest(folder: Path, sums: dict[str, str], state: dict[str, object]) -> None:
    """``SHA256SUMS`` lists exactly the manifest's files (:data:`ADDED_FILES` may be added)."""
    manifest = state.get("files")
    if manifest is None:  # written before the manifest: what every checkpoint holds
        required = {MODEL_FILE, STATE_FILE} | ({OPTIMIZER_FILE} if "optimizer" in state else set())
    elif isinstance(manifest, list) and all(isinstance(n, str) for n in manifest):
        required = set(manifest)
    else:
        raise CheckpointError(f"{folder / STATE_FILE}: files must be a list of file names")
    for name in sorted(required - sums.keys()):
        if not (folder / name).exists():
            raise CheckpointError(
                f"{folder / name}: file not found (the checkpoint's files, {STATE_FILE}, "
                "list it): the checkpoint is incomplete"
            )
        raise CheckpointError(
            f"{folder / name}: not listed in {CHECKSUM_FILE} (its line is missing: the list is "
            "incomplete or was edited)"
        )
    if manifest is not None:
        for name in sorted(sums.keys() - required - set(ADDED_FILES)):
            raise CheckpointError(
                f"{folder / name}: listed in {CHECKSUM_FILE} but not among the checkpoint's "
                f"files ({folder / STATE_FILE}: files)"
            )


def add_checksum(folder: Path, name: str) -> None:
    """List ``folder/name`` (one of :data:`ADDED_FILES`, just written) in the folder's
    ``SHA256SUMS``, if it has one, leaving the other lines as they are."""
    sums = read_checksums(folder)
    if sums is None:
        return
    sums[name] = sha256(folder / name, sync=True)
    _write_listing(folder, sorted(sums.items()))


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
            digest = sha256(file)
        except OSError as error:
            raise CheckpointError(f"{file}: cannot read it ({reason(error)})") from None
        check_digest(file, name, digest, sums)


def check_digest(file: Path, name: str, digest: str, sums: dict[str, str]) -> None:
    """``digest`` (of ``file``, listed as ``name``) must be the one ``sums`` records.

    Raises:
        CheckpointError: naming ``file``, not listed or corrupt.
    """
    expected = sums.get(name)
    if expected is None:
        raise CheckpointError(f"{file}: not listed in {CHECKSUM_FILE} (an incomplete checkpoint)")
    if digest != expected:
        raise CheckpointError(
            f"{file}: corrupt: its SHA-256 differs from the one recorded in {CHECKSUM_FILE} "
            "(damaged on disk or copied incompletely); restore it or use another checkpoint"
        )
