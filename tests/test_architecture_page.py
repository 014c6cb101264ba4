"""docs/architecture.md is held to the code: its layer table names every package in the order
the layering test enforces, its list of the files a family reaches is derived here from the
family registry, and every name in its walks through the modules imports."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

import aiayn
from aiayn.models.families import FAMILIES, Family, resolve
from test_layers_import import LAYERS

SRC = Path(aiayn.__file__).resolve().parent
PAGE = SRC.parents[1] / "docs" / "architecture.md"
REGISTRY = "aiayn.models.families"

LAYER_SECTION = "The layers, low to high"
FAMILY_SECTION = "Adding a family"
WALKS = ("One `aiayn translate`", "One `aiayn train`", "One served request")
"""The sections (their titles' beginnings) of the page read here."""

REFERENCE = re.compile(r"aiayn(\.\w+)+:\w+")
AIAYN_NAME = re.compile(r"aiayn(\.\w+)+")
"""A module's dotted name (in an entry's ``modules``), or a name a walk writes in full
(``aiayn.cli.translate.run``), which must import."""
PLAIN = (bool, int, float, type(None))


# -- the page ----------------------------------------------------------------------------------
def section(title: str) -> str:
    """The text of the page's ``##`` section whose title begins with ``title``."""
    parts = re.split(r"^## ", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    found = [p.partition("\n")[2] for p in parts[1:] if p.startswith(title)]
    assert len(found) == 1, f"docs/architecture.md: no one section '## {title}…'"
    return found[0]


def fenced_lines(text: str) -> list[str]:
    """The lines of the first fenced block of ``text``, blank lines and ``#`` comments left out."""
    block = text.split("```")[1].partition("\n")[2]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def table_packages(text: str) -> list[str]:
    """The packages a table's rows name in their first cell (```name```), in order."""
    cells = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("|")]
    return [c.strip("`") for c in cells if re.fullmatch(r"`\w+`", c)]


def numbered_items(text: str) -> list[str]:
    """The items of the numbered list in ``text``, each with its continuation lines."""
    items: list[str] = []
    for line in text.splitlines():
        if re.match(r"\d+\. ", line):
            items.append(line)
        elif items and line.startswith("   ") and line.strip():
            items[-1] += " " + line.strip()
    return items


# -- what the registry reaches ----------------------------------------------------------------
def held(value: object, hook: str) -> Iterator[tuple[str, object]]:
    """``(hook, object)`` for every class, function, module or value ``value`` holds: references
    (``"package.module:attribute"``) resolved, module names imported, the registry's own records
    (``HFSource``, ``Training``…) and plain containers opened; names, flags and globs are data.
    Mapping keys (a ``model_type``, a task name) are left out of the hook's name."""
    if isinstance(value, str):
        if REFERENCE.fullmatch(value):
            yield hook, resolve(value)
        elif AIAYN_NAME.fullmatch(value):
            yield hook, importlib.import_module(value)
    elif isinstance(value, PLAIN):
        return
    elif dataclasses.is_dataclass(value) and type(value).__module__ == REGISTRY:
        for f in dataclasses.fields(value):
            yield from held(getattr(value, f.name), f"{hook}.{f.name}".lstrip("."))
    elif type(value) is dict:
        for item in value.values():
            yield from held(item, hook)
    elif type(value) in (tuple, list, set, frozenset):
        for item in value:  # type: ignore[attr-defined]
            yield from held(item, hook)
    else:
        yield hook, value


def config_members(family: Family) -> Iterator[tuple[str, object]]:
    """``("config", member)`` for every function and class the family's config class defines."""
    for member in vars(family.config).values():
        member = getattr(member, "__func__", getattr(member, "fget", member))
        if inspect.isfunction(member) or inspect.isclass(member):
            yield "config", member


@cache
def assigned_names(file: Path) -> frozenset[str]:
    """The names a module binds by assignment at its top level."""
    tree = ast.parse(file.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets += [node.target] if isinstance(node, ast.AnnAssign) else []
        found.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(found)


def defining_file(obj: object) -> Path:
    """The source file that defines ``obj``: a module's, a class's or function's own, else that of
    the module that assigns the value at its top level (not one that imports it)."""
    if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj):
        found = inspect.getsourcefile(inspect.unwrap(obj))  # type: ignore[arg-type]
        assert found is not None, obj
        return Path(found).resolve()
    for name, module in sorted(sys.modules.items()):
        if name.startswith("aiayn") and isinstance(module, ModuleType) and module.__file__:
            names = {k for k, v in vars(module).items() if v is obj}
            if names & assigned_names(Path(module.__file__)):
                return Path(module.__file__).resolve()
    raise AssertionError(f"no aiayn module assigns {obj!r:.80}")


def hooks_by_file() -> dict[str, set[str]]:
    """Every source file (relative to src/aiayn) that some family's registry entry reaches ->
    the hooks (``Family`` fields, dotted into its records) that reach it; the registry's own
    module holds every entry (``FAMILIES``)."""
    found: dict[str, set[str]] = defaultdict(set)
    found[REGISTRY.removeprefix("aiayn.").replace(".", "/") + ".py"].add("FAMILIES")
    for family in FAMILIES.values():
        for hook, obj in [*held(family, ""), *config_members(family)]:
            file = defining_file(obj)
            if file.is_relative_to(SRC):  # a library's class held as a value is not aiayn's
                found[file.relative_to(SRC).as_posix()].add(hook)
    return dict(found)


def page_hooks_by_file() -> dict[str, set[str]]:
    """The page's list: each line a path, then the hooks that reach it, comma-separated."""
    listed: dict[str, set[str]] = {}
    for line in fenced_lines(section(FAMILY_SECTION)):
        path, _, hooks = line.strip().partition(" ")
        assert path not in listed, f"{path} is listed twice"
        listed[path] = {h.strip() for h in hooks.split(",") if h.strip()}
    return listed


def resolves(name: str) -> bool:
    """Whether ``name`` (``aiayn.package.module.attribute…``) imports: the longest prefix that is
    a module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module and not module.startswith(f"{error.name}."):
                raise
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


# -- the checks -------------------------------------------------------------------------------
def test_the_family_file_list_is_what_the_registry_reaches() -> None:
    derived, listed = hooks_by_file(), page_hooks_by_file()
    assert not derived.keys() - listed.keys(), (
        f"docs/architecture.md, '{FAMILY_SECTION}': list these files a family's entry reaches: "
        f"{sorted(derived.keys() - listed.keys())}"
    )
    assert not listed.keys() - derived.keys(), (
        f"docs/architecture.md, '{FAMILY_SECTION}': no family's entry reaches "
        f"{sorted(listed.keys() - derived.keys())}"
    )
    wrong = {p: sorted(h) for p, h in derived.items() if listed[p] != h}
    assert not wrong, f"docs/architecture.md: the hooks that reach each file are {wrong}"


def test_the_derivation_reaches_every_kind_of_hook() -> None:
    """References, module names, classes, functions and values all lead to their files."""
    found = hooks_by_file()
    assert "config" in found["config.py"] and "presets" in found["models/gpt2.py"]
    assert "training.demos" in found["training/lm.py"]  # a dict, found where it is assigned
    assert "modules" in found["data/pretrained_tokenizer.py"]
    assert found["convert/to_ct2.py"] == {"to_ct2"}


def test_the_layer_table_names_every_package_in_the_layering_order() -> None:
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    table = table_packages(section(LAYER_SECTION))
    assert set(table) == packages, (
        f"missing: {sorted(packages - set(table))}; not packages: {sorted(set(table) - packages)}"
    )
    assert table == [p for p in LAYERS if p in packages], "the order of tests/test_layers_import.py"


@pytest.mark.parametrize("title", WALKS)
def test_every_name_in_a_walk_imports(title: str) -> None:
    items = numbered_items(section(title))
    assert len(items) >= 3, f"no numbered list under '{title}'"
    for item in items:
        names = [n for n in re.findall(r"`([^`]+)`", item) if AIAYN_NAME.fullmatch(n)]
        assert names, f"'{title}': this step names no ``aiayn.module.function``: {item}"
        missing = [n for n in names if not resolves(n)]
        assert not missing, f"docs/architecture.md, '{title}': {missing} do not import"


def test_a_name_that_does_not_import_is_caught() -> None:
    assert resolves("aiayn.serving.engine.Engine.submit")
    assert not resolves("aiayn.serving.engine.Engine.no_such_method")
    assert not resolves("aiayn.no_such_package.run")
