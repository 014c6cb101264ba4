"""The one validation of config fields and CLI flags (aiayn.validation): each kind of rule, the
type checks (bool is not int, an int passes for a float, Optional, Literal, tuples), NaN and
infinity, the messages (``section.field`` and the value), the registry of config classes (every
numeric field of every config class declares a rule), the CLI flags that share the rules, the
device rule, and docs/notes/validated-values.md listing every field."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import torch

import aiayn
from aiayn import validation as v
from aiayn.cli.main import build_parser
from aiayn.config import ModelConfig, TransformerConfig
from aiayn.errors import ConfigError, UserError
from aiayn.training.config import TrainConfig
from aiayn.validation import (
    Bounds,
    Choice,
    PositiveFloat,
    PositiveInt,
    Rate,
    check_value,
    describe_rule,
    flag,
    flag_type,
    resolve_device,
    validate,
    validated,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "notes" / "validated-values.md"


@validated("demo")
@dataclass(frozen=True)
class _Demo:
    count: PositiveInt = 1
    rate: Rate = 0.5
    eps: PositiveFloat = 1.0
    limit: Annotated[float, Bounds(gt=0, allow_inf=True)] = math.inf
    steps: PositiveInt | None = None
    mode: Literal["a", "b"] = "a"
    stop: Annotated[bool | str, Choice((True, False, "never"))] = True
    betas: tuple[Rate, Rate] = (0.9, 0.98)
    ids: tuple[Annotated[int, Bounds(ge=0)], ...] = ()
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate(self)


def _refused(message: str, **fields: Any) -> None:
    with pytest.raises(ConfigError, match=message):
        _Demo(**fields)


# -- the rules ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bounds", "inside", "outside", "words"),
    [
        (Bounds(ge=1), [1, 10**9], [0, -3], ">= 1"),
        (Bounds(gt=0), [1e-300, 5], [0, -1e-9], "> 0"),
        (Bounds(le=2), [2, -5], [2.0001, 3], "<= 2"),
        (Bounds(lt=2), [1.999, -5], [2, 3], "< 2"),
        (Bounds(ge=0, lt=1), [0, 0.999], [1, -0.001], "in [0, 1)"),
        (Bounds(gt=0, le=1), [1, 1e-9], [0, 1.5], "in (0, 1]"),
        (Bounds(ge=0, lt=2**32), [0, 2**32 - 1], [2**32, -1], "in [0, 2**32)"),
    ],
)
def test_bounds_admit_their_range_only(
    bounds: Bounds, inside: list[float], outside: list[float], words: str
) -> None:
    assert all(bounds.admits(x) for x in inside)
    assert not any(bounds.admits(x) for x in outside)
    assert bounds.describe() == words


def test_a_float_must_be_finite_unless_its_bounds_allow_infinity() -> None:
    for bad in (math.nan, math.inf, -math.inf):
        _refused(r"demo\.eps must be finite and > 0, got ", eps=bad)
        _refused(r"demo\.rate must be in \[0, 1\), got ", rate=bad)
    assert _Demo(limit=math.inf).limit == math.inf  # explicitly allowed
    _refused(r"demo\.limit must be > 0, got nan", limit=math.nan)  # NaN never
    _refused(r"demo\.limit must be > 0, got -inf", limit=-math.inf)
    assert not Bounds().admits(math.nan) and Bounds().admits(1e308)


def test_an_int_passes_for_a_float_and_a_huge_one_is_not_finite() -> None:
    assert _Demo(eps=3).eps == 3
    _refused(r"demo\.eps must be finite and > 0, got 1000000", eps=10**400)


def test_bool_is_not_an_int_nor_a_float() -> None:
    _refused(r"demo\.count has the wrong type: True \(expected an integer\)", count=True)
    _refused(r"demo\.eps has the wrong type: False \(expected a number\)", eps=False)
    _refused(r"demo\.count has the wrong type: 2\.0 \(expected an integer\)", count=2.0)
    _refused(r"demo\.count has the wrong type: '3' \(expected an integer\)", count="3")


def test_ints_must_fit_64_bits() -> None:
    assert _Demo(count=2**63 - 1).count == 2**63 - 1
    _refused(
        r"demo\.count must fit 64 bits \(\|x\| < 2\*\*63\), got 9223372036854775808", count=2**63
    )


def test_optional_takes_none_or_a_checked_value() -> None:
    assert _Demo(steps=None).steps is None and _Demo(steps=3).steps == 3
    _refused(r"demo\.steps must be >= 1, got 0", steps=0)
    _refused(r"demo\.steps has the wrong type: 'x' \(expected an integer or null\)", steps="x")


def test_literal_and_choice_compare_with_types() -> None:
    assert _Demo(mode="b").mode == "b"
    _refused(r"demo\.mode must be one of 'a', 'b', got 'c'", mode="c")
    assert _Demo(stop="never").stop == "never" and _Demo(stop=False).stop is False
    _refused(r"demo\.stop must be one of True, False, 'never', got 'always'", stop="always")
    _refused(r"demo\.stop has the wrong type: 1 \(expected true or false or a string\)", stop=1)
    assert not Choice((True,)).admits(1) and not Choice((1,)).admits(True)


def test_tuples_are_checked_item_by_item_and_lists_become_tuples() -> None:
    demo = _Demo(betas=[0.5, 0.25], ids=[3, 4], names=["x"])  # read back from YAML/JSON
    assert demo.betas == (0.5, 0.25) and demo.ids == (3, 4) and demo.names == ("x",)
    assert all(isinstance(t, tuple) for t in (demo.betas, demo.ids, demo.names))
    _refused(r"demo\.betas\[1\] must be in \[0, 1\), got 1\.0", betas=(0.9, 1.0))
    _refused(r"demo\.betas\[0\] must be in \[0, 1\), got nan", betas=[math.nan, 0.9])
    _refused(
        r"demo\.betas has the wrong type: \(0\.9,\) \(expected a list of 2 numbers\)", betas=(0.9,)
    )
    _refused(r"demo\.betas has the wrong type: 0\.9 \(expected a list of 2 numbers\)", betas=0.9)
    _refused(r"demo\.ids\[2\] must be >= 0, got -1", ids=(0, 1, -1))
    _refused(r"demo\.names\[0\] has the wrong type: 1 \(expected a string\)", names=(1,))


def test_a_long_value_is_shortened_in_the_message() -> None:
    with pytest.raises(ConfigError) as error:
        _Demo(count="x" * 500)
    assert len(str(error.value)) < 150 and "..." in str(error.value)


def test_a_class_must_be_registered_to_be_validated() -> None:
    @dataclass(frozen=True)
    class Unregistered:
        size: PositiveInt = 1

    with pytest.raises(AssertionError, match="not registered"):
        validate(Unregistered())


def test_check_value_names_the_place_it_is_given() -> None:
    with pytest.raises(ConfigError, match=r"^train\.x must be in \[0, 1\), got 2$"):
        check_value(2, Rate, "train.x")
    with pytest.raises(ConfigError, match=r"^must be >= 1, got 0$"):
        check_value(0, PositiveInt, "")


# -- every config class ------------------------------------------------------------------------
def _all_config_classes() -> set[type]:
    """Every dataclass of aiayn named *Config or *Options, and every ModelConfig subclass."""
    found: set[type] = set()
    for info in pkgutil.walk_packages(aiayn.__path__, "aiayn."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
                continue
            if obj.__name__.endswith(("Config", "Options")) or issubclass(obj, ModelConfig):
                found.add(obj)
    return found


def test_every_config_class_is_registered() -> None:
    missing = _all_config_classes() - set(v.registered())
    assert not missing, f"config classes without @validated: {sorted(c.__name__ for c in missing)}"
    assert {"TrainConfig", "TransformerConfig", "DecodeOptions", "GenerateOptions"} <= {
        c.__name__ for c in v.registered()
    }


def test_every_numeric_field_of_every_config_class_declares_a_rule() -> None:
    _all_config_classes()  # import every module, so that every class is registered
    lacking = [
        f"{cls.__name__}.{f.name}"
        for cls in v.registered()
        for f in dataclasses.fields(cls)
        if f.init and not v.has_rule(v.field_hints(cls)[f.name])
    ]
    assert not lacking, f"numeric fields without a Bounds rule: {lacking}"
    assert v.numeric_fields(TrainConfig)  # the check looks at something


def test_registered_defaults_are_valid_and_round_trip() -> None:
    _all_config_classes()
    for cls in v.registered():
        hints = v.field_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init and f.default is not dataclasses.MISSING:
                assert check_value(f.default, hints[f.name], f.name) == f.default, (cls, f.name)


def test_has_rule_sees_a_numeric_field_without_one() -> None:
    assert not v.has_rule(int) and not v.has_rule(float | None)
    assert not v.has_rule(tuple[float, Rate]) and v.has_rule(tuple[Rate, ...])
    assert v.has_rule(str) and v.has_rule(bool) and v.has_rule(PositiveInt | None)


# -- CLI flags ---------------------------------------------------------------------------------
_TEXTS = ["0", "1", "-1", "2", "0.5", "1e-40", "1e30", "nan", "inf", "-inf", "4096", str(2**63)]


def test_a_flag_accepts_exactly_what_its_config_field_accepts() -> None:
    _all_config_classes()
    for cls in v.registered():
        for name in v.numeric_fields(cls):
            hint = v.field_hints(cls)[name]
            if v.split_rules(hint)[0] is tuple or "tuple" in str(hint):
                continue  # no flag sets a tuple
            try:
                parse = flag(cls, name)
            except AssertionError:
                continue  # int | float unions have no one flag type
            kind = int if "int" in parse.__name__ else float
            for text in _TEXTS:
                try:
                    value = kind(text)
                except ValueError:
                    with pytest.raises(ValueError):
                        parse(text)
                    continue
                try:
                    check_value(value, hint, name)
                    ok = True
                except ConfigError:
                    ok = False
                if ok:
                    assert parse(text) == value, (cls, name, text)
                else:
                    with pytest.raises(argparse.ArgumentTypeError):
                        parse(text)


def test_a_bad_flag_is_argparse_s_one_error_line_with_exit_status_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--lr-scale", type=flag(TrainConfig, "lr_scale"))
    parser.add_argument("--n", type=flag_type(PositiveInt))
    assert parser.parse_args(["--lr-scale", "2", "--n", "3"]).lr_scale == 2.0
    for argv, message in [
        (["--lr-scale", "nan"], "argument --lr-scale: must be in (0, 10000], got nan"),
        (["--lr-scale", "0"], "argument --lr-scale: must be in (0, 10000], got 0.0"),
        (["--n", "0"], "argument --n: must be >= 1, got 0"),
        (["--n", "two"], "argument --n: invalid int value: 'two'"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"demo: error: {message}"


def _cli_actions() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (command, action) for command, sub in subparsers.choices.items() for action in sub._actions
    ]


def test_every_cli_number_and_device_goes_through_the_shared_rules() -> None:
    actions = _cli_actions()
    plain = [f"{c} {a.option_strings}" for c, a in actions if a.type in (int, float)]
    assert not plain, f"flags parsed without a rule: {plain}"
    devices = [(c, a) for c, a in actions if a.dest == "device"]
    assert len(devices) >= 6 and all(a.type is v.device_flag for _, a in devices)
    assert sum(isinstance(a.type, v.FlagType) for _, a in actions) >= 20


# -- devices -----------------------------------------------------------------------------------
def test_resolve_device_refuses_unknown_names() -> None:
    for name in ("gpu", "cuda:", "cuda:-1", "cpu:x", "meta", "auto:0", "", "CUDA"):
        with pytest.raises(UserError, match=re.escape(f"unknown device {name!r}")):
            resolve_device(name)
    assert resolve_device("cpu") == torch.device("cpu")


def test_resolve_device_refuses_what_this_machine_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(UserError, match=r"^device 'cuda': CUDA is not available on this machine$"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(UserError, match=r"^device 'cuda:3': this machine has 1 CUDA device\(s\)$"):
        resolve_device("cuda:3")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^device 'mps': MPS is not available on this machine$"):
        resolve_device("mps")


def test_a_device_flag_is_refused_at_parse_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.cli.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--checkpoint", "nowhere", "--device", "cuda"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "aiayn translate: error: argument --device: device 'cuda': CUDA is not available on "
        "this machine"
    )


def test_train_device_is_checked_by_name_in_the_config_and_by_machine_in_the_trainer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from aiayn.training.config import RunConfig
    from aiayn.training.trainer import Trainer

    with pytest.raises(ConfigError, match=r"train\.device must be auto, cpu, cuda, cuda:N or mps"):
        TrainConfig(device="gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = RunConfig(run_dir=str(tmp_path / "run"), train=TrainConfig(device="cuda"))
    with pytest.raises(UserError, match="CUDA is not available"):
        Trainer(run)
    assert not (tmp_path / "run").exists()  # refused before any work


# -- the docs ----------------------------------------------------------------------------------
def doc_rows() -> list[str]:
    """The rows docs/notes/validated-values.md must hold: one per field of every registered
    class."""
    _all_config_classes()
    rows = []
    for cls, section in sorted(v.registered().items(), key=lambda item: item[0].__name__):
        if cls.__module__ == __name__:
            continue
        hints = v.field_hints(cls)
        for f in dataclasses.fields(cls):
            if f.init and (v.is_numeric(hints[f.name]) or v.split_rules(hints[f.name])[1]):
                where = f"{section}.{f.name}" if section else f.name
                rows.append(f"| {cls.__name__} | `{where}` | {describe_rule(hints[f.name])} |")
    return rows


def test_the_docs_list_every_rule() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [row for row in doc_rows() if row not in text]
    stale = "docs/notes/validated-values.md lacks (or has stale) rows:\n"
    assert not missing, stale + "\n".join(missing)


def test_transformer_config_keeps_its_cross_field_checks() -> None:
    with pytest.raises(ConfigError, match="d_model=512 must be divisible by num_heads=7"):
        TransformerConfig(num_heads=7)
    with pytest.raises(ConfigError, match="pad_id=37000 is outside the vocabulary"):
        TransformerConfig(pad_id=37000)
