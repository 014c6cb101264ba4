"""docs/ stays small and results/ stays bounded (docs/benchmarks.md, "Where results live"): the
docs hold the generated tables (docs/results/*.md) and the pictures; the raw numbers the tables
are made from live at the repository root in results/, each file gzipped JSON (or JSON lines)
written with no time in its gzip header. The sizes are the files' real sizes on disk, summed:
a raw result left in docs/, or a results/ folder grown past its bound, fails here."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "results"
TABLES = DOCS / "results"

MB = 1024 * 1024
DOCS_BUDGET = 2 * MB
"""docs/ without its images (about 0.7 MB when the raw results left it, 19.8 MB before)."""
RESULTS_BUDGET = 8 * MB
"""results/ (about 4.9 MB when it was made: 52 per-run Multi30k results and every report's)."""
IMAGES = frozenset({".png", ".svg", ".jpg", ".jpeg", ".gif"})
RAW_SUFFIXES = (".json.gz", ".jsonl.gz")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def files_under(folder: Path, skip: frozenset[str] = frozenset()) -> dict[Path, int]:
    """Each file under ``folder`` (its suffix not in ``skip``) and its size in bytes."""
    return {
        p: p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix.lower() not in skip
    }


def over_budget(sizes: dict[Path, int], budget: int, name: str, root: Path = ROOT) -> str | None:
    """Why ``sizes`` exceed ``budget`` (their sum and the five largest files, named from
    ``root``), or None."""
    total = sum(sizes.values())
    if total <= budget:
        return None
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    listed = ", ".join(f"{p.relative_to(root)} ({n:,})" for p, n in largest)
    return f"{name} holds {total:,} bytes, over its {budget:,}; largest: {listed}"


def parse_raw(path: Path) -> object:
    """A results/ file's content: gzip (checked by its magic bytes and its header's zero time),
    then JSON, or JSON lines for .jsonl.gz."""
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b", f"{path.name} is not gzip"
    assert raw[4:8] == b"\0\0\0\0", f"{path.name}: its gzip header holds a time (not mtime=0)"
    text = gzip.decompress(raw).decode("utf-8")
    if path.name.endswith(".jsonl.gz"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def test_the_budget_check_sums_real_sizes_and_fails_over_budget(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_bytes(b"x" * 600)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_bytes(b"y" * 500)
    (tmp_path / "c.png").write_bytes(b"z" * 5000)
    sizes = files_under(tmp_path, IMAGES)
    assert sum(sizes.values()) == 1100  # the picture left out
    assert over_budget(sizes, 1100, "tmp", tmp_path) is None
    message = over_budget(sizes, 1000, "tmp", tmp_path)
    assert message is not None and "1,100 bytes, over its 1,000; largest: a.md (600)" in message


def test_docs_without_images_stay_under_two_mb() -> None:
    problem = over_budget(files_under(DOCS, IMAGES), DOCS_BUDGET, "docs/ (images aside)")
    assert problem is None, problem


def test_docs_results_holds_only_the_tables() -> None:
    raw = [p.relative_to(ROOT) for p in files_under(TABLES) if p.suffix != ".md"]
    assert not raw, f"raw results belong in results/ as .json.gz: {raw}"


def test_results_stay_under_their_bound() -> None:
    sizes = files_under(RESULTS)
    assert sizes, "results/ holds no raw results"
    problem = over_budget(sizes, RESULTS_BUDGET, "results/")
    assert problem is None, problem


def test_every_results_file_is_gzipped_json() -> None:
    for path in files_under(RESULTS):
        assert path.name.endswith(RAW_SUFFIXES), f"{path.relative_to(ROOT)}: not .json(l).gz"
        content = parse_raw(path)
        assert content, f"{path.relative_to(ROOT)} is empty"


def test_links_into_the_results_resolve() -> None:
    """Every relative link of README.md and docs/ into docs/results/ or results/ names a file
    that is there (a table, or a raw file moved out of docs/)."""
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if "results/" not in path or re.match(r"[a-z]+:", path):
                continue
            if not (page.parent / path).is_file():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing results:\n" + "\n".join(broken)


@pytest.fixture
def common() -> ModuleType:
    """benchmarks/_common.py (the benchmarks are not a package: their folder goes on the path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _common

        return _common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_benchmarks_write_deterministic_gzipped_json(common: ModuleType, tmp_path: Path) -> None:
    data = {"name": "x", "rows": [{"bleu": 38.5, "text": "Straße"}]}
    first, second = tmp_path / "a" / "r.json.gz", tmp_path / "b" / "r.json.gz"
    common.write_json_gz(first, data)
    common.write_json_gz(second, data)
    assert first.read_bytes() == second.read_bytes()  # no time, no file name in the header
    assert parse_raw(first) == data
    assert common.read_json(first) == data
    plain = tmp_path / "old.json"
    plain.write_text(json.dumps(data), encoding="utf-8")
    assert common.read_json(plain) == data
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_report_puts_its_table_in_docs_and_its_numbers_in_results(
    common: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "TABLES", tmp_path / "docs" / "results")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    path = common.write_report("bench", {"x": 1}, ["| a |", "|---|"])
    assert path == tmp_path / "docs" / "results" / "bench.md"
    assert path.read_text(encoding="utf-8") == "| a |\n|---|\n"
    assert parse_raw(tmp_path / "results" / "bench.json.gz") == {"x": 1}
