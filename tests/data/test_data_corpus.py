"""Corpus reading, its error messages, whitespace normalisation and pair filtering."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from aiayn.data import FilterReport, filter_pairs, normalize, read_lines, read_parallel
from aiayn.errors import UserError


def _write(path: Path, data: bytes) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


# ------------------------------------------------------------------------------ reading


def test_two_aligned_files(tmp_path: Path) -> None:
    src = _write(tmp_path / "train.en", b"Hello.\nGood night!\n")
    tgt = _write(tmp_path / "train.de.gz", b"Hallo.\r\nGute Nacht!\r\n")
    assert read_parallel(src, tgt) == [("Hello.", "Hallo."), ("Good night!", "Gute Nacht!")]


def test_tsv_first_two_columns_blank_lines_skipped(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "pairs.tsv.gz", "\ufeffHi.\tHallo!\tCC-BY x\n\nRun!\tLauf!".encode())
    assert read_parallel(tsv) == [("Hi.", "Hallo!"), ("Run!", "Lauf!")]


def test_lines_split_on_newline_only(tmp_path: Path) -> None:
    # U+2028 and form feed are line breaks for str.splitlines but not for a corpus file.
    path = _write(tmp_path / "x.txt", "a\u2028b\x0cc\nd\n".encode())
    assert read_lines(path) == ["a\u2028b\x0cc", "d"]


def test_misaligned_files_name_both_files_and_counts(tmp_path: Path) -> None:
    src = _write(tmp_path / "src.txt", b"a\nb\nc\n")
    tgt = _write(tmp_path / "tgt.txt", b"x\ny\n")
    with pytest.raises(UserError) as info:
        read_parallel(src, tgt)
    msg = str(info.value)
    assert "src.txt" in msg and "tgt.txt" in msg
    assert "3 lines" in msg and "2 lines" in msg


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"not found: .*nowhere\.tsv"):
        read_parallel(tmp_path / "nowhere.tsv")
    src = _write(tmp_path / "here.txt", b"a\n")
    with pytest.raises(UserError, match=r"not found: .*gone\.de"):
        read_parallel(src, tmp_path / "gone.de")


@pytest.mark.parametrize("name", ["empty.txt", "empty.txt.gz"])
def test_empty_file(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / name, b"")
    with pytest.raises(UserError, match=rf"empty: .*{re.escape(name)}"):
        read_parallel(path, path)


def test_tsv_of_blank_lines_has_no_pairs(tmp_path: Path) -> None:
    path = _write(tmp_path / "blank.tsv", b"\n  \n")
    with pytest.raises(UserError, match=r"no sentence pairs.*blank\.tsv"):
        read_parallel(path)


@pytest.mark.parametrize("name", ["latin1.de", "latin1.de.gz"])
def test_non_utf8_names_file_and_line(tmp_path: Path, name: str) -> None:
    src = _write(tmp_path / "ok.en", b"one\ntwo\nthree\n")
    tgt = _write(tmp_path / name, "eins\nzwei\ndrei Grüße\n".encode("latin-1"))
    with pytest.raises(UserError) as info:
        read_parallel(src, tgt)
    msg = str(info.value)
    assert name in msg
    assert "line 3" in msg
    assert "UTF-8" in msg


def test_tsv_line_without_tab_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "pairs.tsv", b"Hi.\tHallo!\nRun! Lauf!\n")
    with pytest.raises(UserError) as info:
        read_parallel(path)
    msg = str(info.value)
    assert "pairs.tsv" in msg and "line 2" in msg and "tab" in msg


def test_bad_gzip(tmp_path: Path) -> None:
    path = tmp_path / "fake.tsv.gz"
    path.write_bytes(b"a\tb\n")  # plain text under a .gz name
    with pytest.raises(UserError, match=r"fake\.tsv\.gz.*gzip"):
        read_parallel(path)


# ------------------------------------------------------------------------------ normalize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Hallo  Welt ", "Hallo Welt"),
        ("a\tb\t\tc", "a b c"),
        ("a\u00a0b\u202fc\u3000d", "a b c d"),  # NBSP, narrow NBSP, ideographic space
        ("line one\r\nline two\n", "line one line two"),
        (" \t\u00a0\n", ""),
        ("unchanged", "unchanged"),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize(text) == expected


# ------------------------------------------------------------------------------ filtering


def test_filter_pairs_counts_each_reason() -> None:
    pairs = [
        ("a b", "c d"),  # kept
        ("", "x"),  # empty
        (" \u00a0 ", "x"),  # empty after normalisation
        ("w " * 6, "x y"),  # 6 words > max_words 5: too long (before the ratio check)
        ("a b c d", "x"),  # ratio 4 > 3
        ("a b c", "x"),  # ratio 3 == 3: kept
        ("a\u00a0b", "c\t d"),  # kept, normalised
    ]
    kept, report = filter_pairs(pairs, max_words=5, max_ratio=3)
    assert kept == [("a b", "c d"), ("a b c", "x"), ("a b", "c d")]
    assert report == FilterReport(
        total=7,
        kept=3,
        dropped_empty=2,
        dropped_too_long=1,
        dropped_ratio=1,
        max_words=5,
        max_ratio=3.0,
    )
    assert report.dropped == 4
    assert str(report) == (
        "kept 3 of 7 pairs; dropped 4 (2 empty, 1 over 5 words, 1 with length ratio over 3)"
    )


def test_filter_report_is_frozen() -> None:
    _, report = filter_pairs([("a", "b")])
    with pytest.raises(AttributeError):
        report.kept = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [{"max_words": 0}, {"max_words": 2.5}, {"max_ratio": 0.5}, {"max_ratio": float("nan")}],
)
def test_filter_rejects_bad_limits(kwargs: dict[str, float]) -> None:
    with pytest.raises(UserError):
        filter_pairs([("a", "b")], **kwargs)  # type: ignore[arg-type]
