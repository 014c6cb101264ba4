"""The family registry: every reference resolves, every capability asks it, and a family's name
stands only in its own modules and the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from aiayn.config import Presets, Published
from aiayn.errors import ConfigError, UserError
from aiayn.models.families import (
    COMMANDS,
    DEFAULT_FAMILY,
    FAMILIES,
    Family,
    demo_runs,
    family_named,
    family_of,
    family_of_config,
    family_of_preset,
    hf_source,
    resolve,
    trainable,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "aiayn"
REGISTRY = "aiayn.models.families"


def _refs() -> list[tuple[str, str]]:
    """(where, reference) of every lazy reference in the registry."""
    refs = []
    for f in FAMILIES.values():
        for model_type, how in f.from_hf.items():
            refs += [(f"{f.name}.from_hf[{model_type}]", how.convert)]
            refs += [(f"{f.name}.tokenizer[{model_type}]", how.tokenizer)]
            if how.generation:
                refs += [(f"{f.name}.generation[{model_type}]", how.generation)]
        for name in ("to_hf", "to_ct2", "to_onnx", "inference", "first_layer", "position_bias"):
            if getattr(f, name):
                refs += [(f"{f.name}.{name}", getattr(f, name))]
        if f.attention is not None:
            refs += [(f"{f.name}.attention", f.attention.collect)]
        t = f.training
        if t is not None:
            refs += [(f"{f.name}.training.data", t.data)]
            refs += [(f"{f.name}.tasks[{k}]", v) for k, v in t.tasks.items()]
            refs += [(f"{f.name}.training.{k}", getattr(t, k)) for k in ("check", "adapt")]
            refs += [(f"{f.name}.demos[{k}]", v) for k, v in t.demos.items()]
    return [(where, ref) for where, ref in refs if ref is not None]


@pytest.mark.parametrize(("where", "ref"), _refs(), ids=[w for w, _ in _refs()])
def test_every_reference_resolves(where: str, ref: str) -> None:
    assert resolve(ref) is not None, where


def test_every_family_is_complete() -> None:
    for name, f in FAMILIES.items():
        assert f.name == name and f.commands <= set(COMMANDS), name
        assert f.default_preset in f.presets, name
        config = f.presets[f.default_preset]
        assert family_of_config(config) is f and type(config) is f.config
        assert f.count(config) == sum(p.numel() for p in f.build(config).parameters()), name
        for module in f.modules:
            assert (SRC.parent / (module.replace(".", "/") + ".py")).is_file(), module


def test_a_family_is_built_by_keyword_only() -> None:
    """Nine fields in a row are not read by position: each is named where a family is made."""
    gpt2 = family_named("gpt2")
    fields = {name: getattr(gpt2, name) for name in ("name", "title", "config", "model")}
    fields |= {"presets": gpt2.presets, "default_preset": gpt2.default_preset}
    fields |= {"count": gpt2.count, "commands": gpt2.commands, "modules": gpt2.modules}
    assert Family(**fields).build(gpt2.presets["gpt2-tiny"]) is not None
    with pytest.raises(TypeError, match="positional"):
        Family(*fields.values())  # type: ignore[misc]


def test_lookups_name_what_is_unknown() -> None:
    assert family_named("gpt2").title == "GPT-2"
    assert family_of(family_named("t5").build(family_named("t5").presets["t5-tiny"])).name == "t5"
    assert family_of_preset("flan-t5-base").name == "t5"
    assert hf_source("marian")[0].name == DEFAULT_FAMILY
    with pytest.raises(UserError, match="unknown model family 'llama'"):
        family_named("llama")
    with pytest.raises(UserError, match="unknown preset 'huge'"):
        family_of_preset("huge")
    with pytest.raises(UserError, match=r"model_type 'bart' is not supported yet \(supported: "):
        hf_source("bart")
    with pytest.raises(TypeError):
        family_of(object())  # type: ignore[arg-type]


def test_demo_runs_and_trainable_families() -> None:
    assert next(iter(demo_runs())) == "translation"
    assert set(demo_runs()) == {"translation", "lm", "vit"}
    assert set(trainable()) == {"transformer", "gpt2", "t5", "bert", "vit"}


def test_presets_build_with_overrides_and_refuse_unknown_names() -> None:
    gpt2 = family_named("gpt2").presets
    assert gpt2.build("gpt2-tiny", d_model=64).d_model == 64
    assert gpt2.published["gpt2"] == Published(124_439_808, 50257, "published GPT-2")
    with pytest.raises(ConfigError, match=r"unknown GPT-2 preset 'gpt3' \(choose from gpt2, "):
        gpt2.build("gpt3")
    with pytest.raises(ConfigError, match="unknown model config key"):
        gpt2.build("gpt2-tiny", width=3)
    with pytest.raises(AssertionError):
        Presets("X", {}, {"a": Published(1, 1, "")})


def _literals(path: Path) -> list[tuple[int, str]]:
    """(line, value) of the string constants in a file that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_a_family_name_stands_only_in_its_own_modules_and_the_registry() -> None:
    """No if-chain over family names outside the registry: a string constant equal to a family's
    name (or one of its Hugging Face model types) appears only in that family's own modules."""
    owners: dict[str, set[str]] = {}
    for f in FAMILIES.values():
        for word in (f.name, *f.from_hf):
            owners.setdefault(word, set()).update(f.modules)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = "aiayn." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        if module == REGISTRY:
            continue
        for line, value in _literals(path):
            if value in owners and module not in owners[value]:
                found.append(f"{path.relative_to(SRC.parent)}:{line}: {value!r}")
    assert not found, "family names outside their modules:\n" + "\n".join(found)


def test_the_task_module_imports_no_task() -> None:
    """``training/task.py`` asks the registry for a task; the task modules import it, never the
    reverse (no import circle)."""
    tree = ast.parse((SRC / "training" / "task.py").read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):  # every form: import a.b, from a import b, from a.b import c
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    tasks = {
        ref.partition(":")[0]
        for f in trainable().values()
        if f.training is not None
        for ref in f.training.tasks.values()
    }
    assert tasks and imported
    assert not imported & tasks


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_refuses_the_families_that_do_not_serve_it(command: str) -> None:
    from aiayn.models.families import families_serving, refuse_unless_serving

    serving = families_serving(command)
    assert serving, command
    for family in FAMILIES.values():
        if family in serving:
            refuse_unless_serving(family, command, "ckpt")
            continue
        names = " or ".join(f.name for f in serving)
        with pytest.raises(UserError, match=f"^ckpt holds a {family.name} model; .* of {names}$"):
            refuse_unless_serving(family, command, "ckpt")


def test_max_positions_is_the_learned_position_table_or_none() -> None:
    """Learned positions bound a sequence (GPT-2, BERT, the paper's model with
    ``positional: learned``); sinusoids, T5's relative positions and ViT's interpolated grid do
    not. Translation's output limit reads it."""
    from aiayn.decoding.translate import DecodeOptions, output_limits

    tiny = family_named("transformer").presets["tiny"]
    assert tiny.max_positions is None
    learned = tiny.replace(positional="learned", max_len=40)
    assert learned.max_positions == 40
    for name in ("gpt2", "bert"):
        config = family_named(name).presets[family_named(name).default_preset]
        assert config.max_positions == config.max_len > 0, name
    for name in ("t5", "vit"):
        assert family_named(name).presets[family_named(name).default_preset].max_positions is None
    options = DecodeOptions()  # source length + 50
    assert output_limits(family_named("transformer").build(learned), options, [3, 100]) == [39, 39]
    assert output_limits(family_named("transformer").build(tiny), options, [3, 100]) == [53, 150]
