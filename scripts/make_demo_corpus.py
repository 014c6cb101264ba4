"""Make the built-in demo corpus src/aiayn/data/demo/tatoeba_en_de.tsv.gz, deterministically.

Input: the manythings.org/anki English–German Tatoeba file (``English<TAB>German[<TAB>...]``,
dated 2018-05-13, CC BY 2.0, attribution "www.manythings.org/anki and tatoeba.org").

Selection, for variety rather than many translations of one sentence:

1. normalise whitespace; drop pairs with an empty side or more than ``--max-words`` words on
   either side;
2. keep at most one pair per distinct English sentence and per distinct German sentence
   (the translation kept for an English sentence is chosen at random with the seed);
3. sample ``--size`` of those pairs uniformly at random with the seed (this keeps the corpus'
   length distribution) and write them in their original file order.

The output gzip has no timestamp or file name in its header, so the same input, seed and options
give a byte-identical file. Run from the repository root::

    python scripts/make_demo_corpus.py ../shared/data/tatoeba/eng-deu.tsv.gz
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import random
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "src" / "aiayn" / "data" / "demo" / "tatoeba_en_de.tsv.gz"
DEFAULT_SEED = 20170612  # arXiv v1 date of "Attention Is All You Need"


def _normalize(text: str) -> str:
    """Same as aiayn.data.corpus.normalize (kept here so the script stands alone)."""
    return " ".join(text.split())


def select_pairs(
    lines: list[str], *, size: int, max_words: int, seed: int
) -> list[tuple[str, str]]:
    """The demo pairs, in input order (see the module docstring for the rules)."""
    rng = random.Random(seed)
    by_english: dict[str, list[tuple[int, str]]] = {}
    for number, line in enumerate(lines):
        columns = line.split("\t")
        if len(columns) < 2:
            continue
        en, de = _normalize(columns[0]), _normalize(columns[1])
        if not en or not de:
            continue
        if len(en.split()) > max_words or len(de.split()) > max_words:
            continue
        by_english.setdefault(en, []).append((number, de))

    chosen: list[tuple[int, str, str]] = []
    seen_german: set[str] = set()
    for en, translations in by_english.items():  # dict order = first appearance: deterministic
        candidates = [(n, de) for n, de in translations if de not in seen_german]
        if not candidates:
            continue
        number, de = candidates[rng.randrange(len(candidates))]
        seen_german.add(de)
        chosen.append((number, en, de))

    if len(chosen) < size:
        raise SystemExit(f"only {len(chosen)} distinct pairs available, asked for {size}")
    sample = rng.sample(chosen, size)
    sample.sort()  # original file order
    return [(en, de) for _, en, de in sample]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tatoeba_tsv", type=Path, help="eng-deu.tsv.gz (or plain .tsv)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--max-words", type=int, default=15)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)

    opener = gzip.open if args.tatoeba_tsv.suffix == ".gz" else open
    with opener(args.tatoeba_tsv, "rt", encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")
    pairs = select_pairs(lines, size=args.size, max_words=args.max_words, seed=args.seed)

    payload = "".join(f"{en}\t{de}\n" for en, de in pairs).encode("utf-8")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(args.output, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz,
    ):
        gz.write(payload)
    data = args.output.read_bytes()
    print(
        f"wrote {args.output}: {len(pairs)} pairs, {len(payload):,} bytes uncompressed, "
        f"{len(data):,} bytes gzip, sha256 {hashlib.sha256(data).hexdigest()}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
