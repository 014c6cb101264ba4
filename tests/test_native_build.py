"""aiayn.native_build: one build folder per checkout and source contents."""

from __future__ import annotations

import re
from pathlib import Path

from aiayn.native_build import build_name


def test_build_name_follows_the_checkout_and_the_contents(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"
    for source in (a, b):
        source.parent.mkdir()
        source.write_text("int x;")
    name = build_name("aiayn_k", (a,))
    assert re.fullmatch(r"aiayn_k_[0-9a-f]{12}", name)
    assert build_name("aiayn_k", (a,)) == name  # the same checkout reuses its build
    assert build_name("aiayn_k", (b,)) != name  # another checkout of the same source: its own
    a.write_text("int y;")
    assert build_name("aiayn_k", (a,)) != name  # edited sources: a new build
