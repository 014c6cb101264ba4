"""Reading and cleaning a parallel corpus (the raw text before §5.1's byte-pair encoding).

A parallel corpus is a list of ``(source, target)`` sentence pairs. It comes either as two
line-aligned text files (line *i* of one translates line *i* of the other) or as one TSV file
whose first two tab-separated columns are source and target. Files ending in ``.gz`` are read
through gzip. Every problem with the user's files is a :class:`~aiayn.errors.UserError` whose
message names the file and, where it helps, the 1-based line.

Cleaning (:func:`filter_pairs`) normalises whitespace and drops empty pairs, over-long pairs and
pairs whose lengths are too unequal to be translations of each other; the
:class:`FilterReport` says how many went for which reason.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aiayn.errors import UserError
from aiayn.validation import is_int_at_least

__all__ = [
    "DEFAULT_MAX_RATIO",
    "DEFAULT_MAX_WORDS",
    "FilterReport",
    "filter_pairs",
    "normalize",
    "read_lines",
    "read_parallel",
]

DEFAULT_MAX_WORDS = 100
"""Default cap on whitespace-separated words per side (Moses' ``clean-corpus-n`` style)."""

DEFAULT_MAX_RATIO = 9.0
"""Default cap on longer/shorter word count of a pair (Moses' ``clean-corpus-n`` default)."""

_UTF8_BOM = b"\xef\xbb\xbf"


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when its name ends in ``.gz``."""
    if not path.exists():
        raise UserError(f"corpus file not found: {path}")
    if not path.is_file():
        raise UserError(f"corpus path is not a file: {path}")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: not a valid gzip file ({exc})") from exc
    except OSError as exc:
        raise UserError(f"cannot read corpus file {path}: {exc}") from exc


def read_lines(path: str | Path, *, allow_empty: bool = False) -> list[str]:
    """The lines of a UTF-8 text file (plain, or gzip when the name ends in ``.gz``).

    Lines are split on ``\\n`` only (a stray U+2028 or form feed inside a sentence does not break
    the line alignment), a trailing ``\\r`` is removed, and so is a leading UTF-8 byte-order mark.
    Line contents are otherwise returned unchanged.

    Raises:
        UserError: the file is missing, is not valid gzip, is empty (unless ``allow_empty``), or
            holds bytes that are not UTF-8 (the message names the line).
    """
    path = Path(path)
    return decode_lines(_read_bytes(path), str(path), allow_empty=allow_empty)


def decode_lines(data: bytes, name: str, *, allow_empty: bool = False) -> list[str]:
    """The lines of UTF-8 ``data`` (from a file or standard input) as :func:`read_lines` splits
    them; ``name`` is what error messages call the source."""
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    if not data:
        if allow_empty:
            return []
        raise UserError(f"corpus file is empty: {name}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        bad = data[exc.start : exc.end]
        raise UserError(
            f"{name}, line {line}: not valid UTF-8 (byte {bad!r}); "
            "convert the file to UTF-8, e.g. with iconv"
        ) from exc
    lines = text.split("\n")
    if lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_parallel(
    src_path: str | Path, tgt_path: str | Path | None = None
) -> list[tuple[str, str]]:
    """Read a parallel corpus as ``(source, target)`` pairs, unnormalised.

    Args:
        src_path: with ``tgt_path``, the source-language file, one sentence a line; without it, a
            TSV file whose first two tab-separated columns are source and target (further columns,
            such as Tatoeba's attribution column, are ignored; blank lines are skipped).
        tgt_path: the target-language file, line-aligned with ``src_path``.

    Returns:
        The pairs in file order.

    Raises:
        UserError: a file is missing, empty or not UTF-8; the two files have different numbers of
            lines (both files and counts are named); a TSV line has no tab (file and line named).
    """
    if tgt_path is not None:
        src_lines = read_lines(src_path)
        tgt_lines = read_lines(tgt_path)
        if len(src_lines) != len(tgt_lines):
            raise UserError(
                f"source and target files are not line-aligned: {src_path} has "
                f"{len(src_lines)} lines but {tgt_path} has {len(tgt_lines)} lines"
            )
        return list(zip(src_lines, tgt_lines, strict=True))

    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(read_lines(src_path), start=1):
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) < 2:
            raise UserError(
                f"{src_path}, line {number}: no tab; a TSV corpus needs 'source<TAB>target' "
                f"on every line (got {line[:60]!r})"
            )
        pairs.append((columns[0], columns[1]))
    if not pairs:
        raise UserError(f"corpus file has no sentence pairs (only blank lines): {src_path}")
    return pairs


def normalize(text: str) -> str:
    """Collapse every run of Unicode whitespace (spaces, tabs, newlines, NBSP, ...) to one space
    and strip both ends.

    >>> normalize("\\u00a0 Hallo\\t\\tWelt \\n")
    'Hallo Welt'
    """
    return " ".join(text.split())


@dataclass(frozen=True)
class FilterReport:
    """What :func:`filter_pairs` kept and dropped. Each dropped pair counts under its first reason.

    Attributes:
        total: pairs looked at.
        kept: pairs kept.
        dropped_empty: pairs with an empty side after normalisation.
        dropped_too_long: pairs with more than ``max_words`` words on either side.
        dropped_ratio: pairs whose longer side has more than ``max_ratio`` × the words of the
            shorter side.
        max_words: the limit that was applied.
        max_ratio: the limit that was applied.
    """

    total: int
    kept: int
    dropped_empty: int
    dropped_too_long: int
    dropped_ratio: int
    max_words: int
    max_ratio: float

    @property
    def dropped(self) -> int:
        """Pairs dropped for any reason."""
        return self.dropped_empty + self.dropped_too_long + self.dropped_ratio

    def __str__(self) -> str:
        return (
            f"kept {self.kept:,} of {self.total:,} pairs; dropped {self.dropped:,} "
            f"({self.dropped_empty:,} empty, {self.dropped_too_long:,} over "
            f"{self.max_words} words, {self.dropped_ratio:,} with length ratio over "
            f"{self.max_ratio:g})"
        )


def filter_pairs(
    pairs: Iterable[tuple[str, str]],
    *,
    max_words: int = DEFAULT_MAX_WORDS,
    max_ratio: float = DEFAULT_MAX_RATIO,
) -> tuple[list[tuple[str, str]], FilterReport]:
    """Normalise the pairs' whitespace and drop the unusable ones.

    Words are whitespace-separated. A pair is dropped, first matching reason first, when

    1. either side is empty after :func:`normalize`;
    2. either side has more than ``max_words`` words;
    3. ``max(words) / min(words) > max_ratio``.

    Args:
        pairs: ``(source, target)`` pairs, e.g. from :func:`read_parallel`.
        max_words: the most words allowed on either side (≥ 1).
        max_ratio: the largest allowed length ratio (≥ 1).

    Returns:
        The kept pairs, normalised and in input order, and the :class:`FilterReport`.
    """
    if not is_int_at_least(max_words, 1):
        raise UserError(f"max_words must be an integer >= 1, got {max_words!r}")
    if not max_ratio >= 1.0:  # also rejects NaN
        raise UserError(f"max_ratio must be >= 1, got {max_ratio!r}")

    kept: list[tuple[str, str]] = []
    total = empty = too_long = ratio = 0
    for src, tgt in pairs:
        total += 1
        src_words = src.split()
        tgt_words = tgt.split()
        n_src, n_tgt = len(src_words), len(tgt_words)
        if n_src == 0 or n_tgt == 0:
            empty += 1
        elif n_src > max_words or n_tgt > max_words:
            too_long += 1
        elif max(n_src, n_tgt) > max_ratio * min(n_src, n_tgt):
            ratio += 1
        else:
            kept.append((" ".join(src_words), " ".join(tgt_words)))
    report = FilterReport(
        total=total,
        kept=len(kept),
        dropped_empty=empty,
        dropped_too_long=too_long,
        dropped_ratio=ratio,
        max_words=max_words,
        max_ratio=float(max_ratio),
    )
    return kept, report
