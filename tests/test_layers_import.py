"""The package layers: a lower package never imports a higher one, running a model never
imports :mod:`aiayn.training`, and no module imports itself through others (no import circle).

Packages, low to high (:data:`LAYERS`); the top-level modules (``aiayn.config``,
``aiayn.errors``, ``aiayn.validation``…) are below them all and importable by all, except the
entry point ``aiayn.__main__``, which stands with ``cli``. A package may import its own layer
and any lower one. Every import statement counts, function-local ones and those under
``TYPE_CHECKING`` included (read with :mod:`ast`, nothing is run): an import placed in a function
still closes a circle, it only hides it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

import pytest

import aiayn

SRC = Path(aiayn.__file__).resolve().parent

LAYERS = (
    "kernels",
    "attention",
    "layers",
    "models",
    "data",
    "checkpoint",
    "inference",
    "decoding",
    "evaluation",
    "visualization",
    "convert",
    "serving",
    "training",
    "cli",
)
"""The packages of aiayn, low to high (one that does not exist yet is skipped)."""

ENTRY_POINTS = {"aiayn.__main__": "cli"}
"""Top-level modules that stand with a package rather than at the bottom."""

MODEL_RUNNING_PACKAGES = (
    "aiayn.kernels",
    "aiayn.checkpoint",
    "aiayn.inference",
    "aiayn.decoding",
    "aiayn.evaluation",
    "aiayn.visualization",
    "aiayn.convert",
    "aiayn.serving",
)
"""The packages that run a model (or load, convert, export or serve one)."""

TRAINING_SIDE: dict[str, str] = {
    "aiayn.cli.main": "registers every command, ``train`` included",
    "aiayn.__main__": "runs aiayn.cli.main",
    "aiayn.cli.train": "trains a model",
    "aiayn.cli.tune_alpha": "reads the training run's recorded data section (its validation "
    "pairs) through aiayn.training.config, the one parser of a run config",
}
"""The command modules that may reach :mod:`aiayn.training`, and why; every other module of
:mod:`aiayn.cli` is a model-running command (or helps one), so a new command is covered."""


ALLOWED: dict[tuple[str, str], str] = {}
"""(importing module, imported module) -> why a layering exception is accepted for now."""


@cache
def modules() -> dict[str, Path]:
    """Every module of aiayn (``aiayn.x.y``) -> its file."""
    found = {}
    for file in sorted(SRC.rglob("*.py")):
        parts = file.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = file
    return found


@cache
def imports_of(module: str) -> frozenset[str]:
    """The aiayn modules ``module`` imports anywhere in its source (statically)."""
    file = modules()[module]
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules() else base)
    return frozenset(_known(name) for name in found if name.split(".")[0] == "aiayn")


def _known(name: str) -> str:
    """``name``, or its longest prefix that is a module of aiayn (``aiayn.x.Class`` ->
    ``aiayn.x``)."""
    while name not in modules() and "." in name:
        name = name.rpartition(".")[0]
    return name


def layer_of(module: str) -> int:
    """The rank of ``module``'s package in :data:`LAYERS`; -1 for a top-level module."""
    if module in ENTRY_POINTS:
        return LAYERS.index(ENTRY_POINTS[module])
    parts = module.split(".")
    if len(parts) < 2 or not (SRC / parts[1]).is_dir():
        return -1
    assert parts[1] in LAYERS, f"aiayn.{parts[1]} is not in LAYERS: give it its place there"
    return LAYERS.index(parts[1])


def test_no_package_imports_a_higher_one() -> None:
    violations = [
        f"{module} ({LAYERS[layer_of(module)] if layer_of(module) >= 0 else 'top level'}) "
        f"imports {target} ({LAYERS[layer_of(target)]})"
        for module in modules()
        for target in sorted(imports_of(module))
        if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED
    ]
    assert not violations, "\n".join(violations)


def test_the_layers_cover_the_packages_that_exist() -> None:
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert packages <= set(LAYERS), packages - set(LAYERS)
    assert {"checkpoint", "training", "cli"} <= packages


def _closure(module: str) -> set[str]:
    """``module`` and every aiayn module it imports, directly or not (statically)."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen and name in modules():
            seen.add(name)
            todo.extend(imports_of(name))
            parent = name.rpartition(".")[0]
            todo.extend([parent] if parent.startswith("aiayn") else [])  # a package's __init__
    return seen


def model_running_modules() -> list[str]:
    """Every module of :data:`MODEL_RUNNING_PACKAGES` (a package's submodules each, not its
    ``__init__`` alone, which need not import them all) and every module of :mod:`aiayn.cli`
    not in :data:`TRAINING_SIDE`."""
    return sorted(
        name
        for name in modules()
        if any(name == p or name.startswith(p + ".") for p in MODEL_RUNNING_PACKAGES)
        or (name.startswith(("aiayn.cli.", "aiayn.__main__")) and name not in TRAINING_SIDE)
    )


def test_the_model_running_set_holds_serving_and_every_command_but_training() -> None:
    """Serving and the commands that load, average, quantise, export or serve a model are
    held to the rule; the exceptions exist and are the training side only."""
    running = set(model_running_modules())
    commands = ("serve", "average", "quantize", "export", "kernels", "translate", "attention")
    assert {f"aiayn.cli.{name}" for name in commands} <= running
    assert {"aiayn.serving", "aiayn.serving.app", "aiayn.convert.export"} <= running
    assert set(TRAINING_SIDE) <= set(modules())
    assert not running & set(TRAINING_SIDE)


@pytest.mark.parametrize("module", model_running_modules())
def test_running_a_model_never_reaches_training_statically(module: str) -> None:
    """Function-local imports included: a command's ``run`` imports what it needs late."""
    reached = sorted(m for m in _closure(module) if m.startswith("aiayn.training"))
    assert not reached, f"{module} reaches {reached}"


def test_running_a_model_never_imports_training() -> None:
    """Each model-running module imported in a fresh interpreter: no ``aiayn.training``
    module is loaded (the first module that loads one is named)."""
    script = (
        "import importlib, json, sys\n"
        "pulled = {}\n"
        f"for name in {model_running_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "    loaded = sorted(m for m in sys.modules if m.startswith('aiayn.training'))\n"
        "    if loaded and not pulled:\n"
        "        pulled[name] = loaded\n"
        "print(json.dumps(pulled))\n"
    )
    path = os.pathsep.join([str(SRC.parent), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {}


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A circle of ``graph`` (node -> the nodes it points to) as its nodes in order, the first
    repeated at the end (``[a, b, a]``), or None: a depth-first search, in sorted order."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target in path:
                return [*path[path.index(target) :], target]
            found = None if target in done else visit(target)
            if found:
                return found
        done.add(path.pop())
        return None

    for node in sorted(graph):
        found = None if node in done else visit(node)
        if found:
            return found
    return None


def test_a_circle_is_found_and_named() -> None:
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"d": ["b"], "b": ["c"], "c": ["b"]}) == ["b", "c", "b"]
    assert find_cycle({"a": ["b", "c"], "b": ["c"], "c": [], "d": ["a"]}) is None


def test_the_module_import_graph_has_no_circle() -> None:
    """Every import statement of src/aiayn, wherever it stands (module level, in a function,
    under ``TYPE_CHECKING``), read with :mod:`ast`: the graph of aiayn modules is acyclic."""
    graph = {module: imports_of(module) - {module} for module in modules()}
    assert sum(len(targets) for targets in graph.values()) > 500  # the graph was read
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])
