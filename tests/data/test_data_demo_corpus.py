"""The built-in demo corpus: present, well-formed, attributed, and reproducible from its script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aiayn.data import demo_corpus_path, filter_pairs

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_demo_corpus_ships_with_the_package() -> None:
    path = demo_corpus_path()
    assert path.is_file()
    assert path.name == "tatoeba_en_de.tsv.gz"
    assert path.stat().st_size < 1_000_000


def test_demo_corpus_contents(demo_pairs: list[tuple[str, str]]) -> None:
    assert len(demo_pairs) == 20_000
    english = [en for en, _ in demo_pairs]
    german = [de for _, de in demo_pairs]
    assert len(set(english)) == len(english)  # one pair per English sentence
    assert len(set(german)) == len(german)
    assert max(len(s.split()) for s in english + german) <= 15
    kept, report = filter_pairs(demo_pairs)
    assert kept == demo_pairs  # already normalised, nothing to drop
    assert report.kept == 20_000


def test_notice_attributes_the_corpus() -> None:
    notice = (REPO_ROOT / "NOTICE").read_text(encoding="utf-8")
    assert "www.manythings.org/anki and tatoeba.org" in notice
    assert "CC BY 2.0" in notice
    assert "tatoeba_en_de.tsv.gz" in notice


def test_script_reproduces_the_shipped_file(tatoeba_tsv: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.tsv.gz"
    script = REPO_ROOT / "scripts" / "make_demo_corpus.py"
    subprocess.run(
        [sys.executable, str(script), str(tatoeba_tsv), "--output", str(out)],
        check=True,
        capture_output=True,
    )
    assert out.read_bytes() == demo_corpus_path().read_bytes()
