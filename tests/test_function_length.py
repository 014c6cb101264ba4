"""Every function and method in src/aiayn fits on a screen: at most 60 lines, counted from its
``def`` line to the last line of its body (decorators excluded, docstring and nested functions
included)."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_LINES = 60
SOURCE = Path(__file__).resolve().parents[1] / "src" / "aiayn"


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[int, str, int]]:
    """``(line, name, length)`` of each function in ``source`` longer than ``limit`` lines,
    nested ones and methods included, in the order of their ``def`` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.lineno, node.name, length))
    return sorted(found)


def test_long_functions_counts_from_def_to_last_line() -> None:
    source = (
        "@decorator\n@another\ndef f():\n    '''Doc.'''\n    return 1\n\n\ndef g():\n    pass\n"
    )
    assert long_functions(source, limit=3) == []  # f: 3 lines (decorators not counted)
    assert long_functions(source, limit=2) == [(3, "f", 3)]
    nested = (
        "class A:\n    def m(self):\n        def inner():\n            pass\n        return 1\n"
    )
    assert long_functions(nested, limit=2) == [(2, "m", 4)]
    assert long_functions(nested, limit=1) == [(2, "m", 4), (3, "inner", 2)]


def test_no_function_in_src_is_longer_than_a_screen() -> None:
    files = sorted(SOURCE.rglob("*.py"))
    assert files, f"no Python files under {SOURCE}"
    too_long = [
        f"{path.relative_to(SOURCE.parents[1])}:{line} {name} {length} lines"
        for path in files
        for line, name, length in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not too_long, f"functions longer than {MAX_LINES} lines:\n" + "\n".join(too_long)
