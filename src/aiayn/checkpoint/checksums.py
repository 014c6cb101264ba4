"""``SHA256SUMS``: the SHA-256 of every file of a checkpoint folder, in ``sha256sum`` format
(``sha256sum -c SHA256SUMS`` checks a folder by hand), written last when a checkpoint is saved
and checked file by file when it is read.

Checkpoints written before checksums (no ``SHA256SUMS``) read as unchecked:
:func:`read_checksums` returns None for them and :func:`verify_files` then checks nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from aiayn.checkpoint.files import CHECKSUM_FILE, TMP, CheckpointError, beside, reason

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
    lines = [f"{sha256(f, sync=True)}  {f.relative_to(folder).as_posix()}\n" for f in files]
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write("".join(lines))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, listing)


def sha256(file: Path, *, sync: bool = False) -> str:
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
            digest = sha256(file)
        except FileNotFoundError:
            raise CheckpointError(f"{file}: missing from the checkpoint") from None
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
