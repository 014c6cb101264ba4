"""One validation for every config field and CLI flag: declared constraints, checked in one place.

A config dataclass declares each field's rule in its type, with :data:`typing.Annotated`::

    @validated("train")
    @dataclass(frozen=True)
    class TrainConfig:
        lr_scale: Annotated[float, Bounds(gt=0, le=1e4)] = 1.0
        clip_norm: PositiveFloat | None = None
        precision: Annotated[str, Choice(("auto", "fp32", "bf16", "fp16"))] = "auto"

        def __post_init__(self) -> None:
            validate(self)  # types, ranges, finiteness, choices; then cross-field checks by hand

:func:`validate` checks every field against its type (a bool is not an int; an int is accepted
for a float; ``X | None``; ``Literal[...]``; ``tuple[X, Y]`` and ``tuple[X, ...]``, where a list
read from YAML/JSON becomes a tuple) and its constraints (:class:`Bounds`, :class:`Choice`,
:class:`DeviceName`). Every float must be finite unless its :class:`Bounds` allows infinity; NaN
never passes. A failure is a :class:`~aiayn.errors.ConfigError` naming ``section.field`` and the
value. A CLI flag takes its argparse ``type=`` from the same declaration (:func:`flag`, or
:func:`flag_type` for a flag with no config field), so a flag and the field it sets cannot
disagree; :func:`device_flag` and :func:`resolve_device` are the one rule for devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from aiayn.errors import ConfigError, UserError
from aiayn.limits import MAX_LENGTH_PENALTY_ALPHA

if TYPE_CHECKING:
    import torch

_T = TypeVar("_T")

INT64_LIMIT = 2**63
"""Every int field must be below this (and above its negation): ints end up in int64 tensors."""


def _num(x: float) -> str:
    """A bound as written in messages and docs: 1e-30, 0.5, 10000, 2**32."""
    if isinstance(x, int) and x >= 2**16 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Bounds:
    """A numeric range: ``ge``/``gt`` below, ``le``/``lt`` above (None = open). A float must
    also be finite, unless ``allow_inf`` (NaN never passes)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    allow_inf: bool = False

    def describe(self, number: bool = False) -> str:
        """The rule in words, e.g. ``>= 1``, ``in [0, 1)``, ``finite and > 0`` (``number``:
        the field is a float, so a one-sided range also says "finite")."""
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt)
        high = ("]", self.le) if self.le is not None else (")", self.lt)
        if low[1] is not None and high[1] is not None:
            return f"in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
        parts = [f"{op} {_num(v)}" for op, v in self._sides() if v is not None]
        finite = number and not self.allow_inf
        return " and ".join((["finite"] if finite else []) + parts) or "finite"

    def _sides(self) -> tuple[tuple[str, float | None], ...]:
        return ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))

    def admits(self, value: float) -> bool:
        """Whether ``value`` (a number, NaN/inf included) is in the range."""
        if isinstance(value, float) and not math.isfinite(value):
            return not math.isnan(value) and self.allow_inf and self._in_range(value)
        return self._in_range(value)

    def _in_range(self, value: float) -> bool:
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )


@dataclass(frozen=True)
class Choice:
    """The value must be one of ``values`` (compared with their types: True is not 1)."""

    values: tuple[Any, ...]

    def describe(self) -> str:
        """``one of 'a', 'b'``."""
        return "one of " + ", ".join(repr(v) for v in self.values)

    def admits(self, value: Any) -> bool:
        """Whether ``value`` is one of the values, of the same type."""
        return any(type(value) is type(v) and value == v for v in self.values)


_DEVICE = re.compile(r"(auto|cpu|mps|cuda)(:(0|[1-9][0-9]{0,3}))?")


@dataclass(frozen=True)
class DeviceName:
    """A device name: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (whether this machine
    has it is :func:`resolve_device`'s check, when the device is used)."""

    def describe(self) -> str:
        """The accepted names."""
        return "auto, cpu, cuda, cuda:N or mps"

    def admits(self, value: Any) -> bool:
        """Whether ``value`` is such a name."""
        match = _DEVICE.fullmatch(value) if isinstance(value, str) else None
        return match is not None and not (match[1] == "auto" and match[2])


Rule = Bounds | Choice | DeviceName

# The common rules, named once (see docs/reliability.md, "Validated values").
PositiveInt = Annotated[int, Bounds(ge=1)]
"""Sizes, counts, step numbers: >= 1."""
NonNegativeInt = Annotated[int, Bounds(ge=0)]
"""Counts where 0 means none/off, token ids (their upper bound is the vocabulary: by hand)."""
PositiveFloat = Annotated[float, Bounds(gt=0)]
"""Finite and > 0: epsilons, clipping norms, temperatures."""
NonNegativeFloat = Annotated[float, Bounds(ge=0)]
"""Finite and >= 0."""
PenaltyAlpha = Annotated[float, Bounds(ge=0, le=MAX_LENGTH_PENALTY_ALPHA)]
"""A length penalty's α: finite, in 0 .. :data:`~aiayn.limits.MAX_LENGTH_PENALTY_ALPHA`."""
Rate = Annotated[float, Bounds(ge=0, lt=1)]
"""In [0, 1): dropout probabilities, label smoothing, Adam's β."""
Seed = Annotated[int, Bounds(ge=0, lt=2**32)]
"""In [0, 2**32): what Python's, NumPy's and torch's generators all accept."""
Device = Annotated[str, DeviceName()]
"""A device name (see :class:`DeviceName`)."""


# -- the registry of validated classes -------------------------------------------------------
_SECTIONS: dict[type, str | None] = {}


def validated(section: str | None) -> Callable[[type[_T]], type[_T]]:
    """Class decorator (above ``@dataclass``): register a config class whose fields
    :func:`validate` checks; messages name ``section.field`` (just ``field`` for None)."""

    def register(cls: type[_T]) -> type[_T]:
        assert dataclasses.is_dataclass(cls), cls
        _SECTIONS[cls] = section
        return cls

    return register


def registered() -> dict[type, str | None]:
    """Every registered config class and its section name."""
    return dict(_SECTIONS)


@functools.cache
def field_hints(cls: Any) -> dict[str, Any]:
    """The resolved type hints of a dataclass, ``Annotated`` constraints kept."""
    return typing.get_type_hints(cls, include_extras=True)


def validate(config: Any) -> None:
    """Check every init field of a registered dataclass instance against its declared type and
    constraints; lists become tuples for tuple fields. Raises :class:`ConfigError` naming
    ``section.field`` and the value."""
    cls: Any = type(config)
    assert cls in _SECTIONS, f"{cls.__name__} is not registered with @validated"
    section, hints = _SECTIONS[cls], field_hints(cls)
    for f in dataclasses.fields(config):
        if f.init:
            value = getattr(config, f.name)
            where = f"{section}.{f.name}" if section else f.name
            checked = check_value(value, hints[f.name], where)
            if checked is not value:
                object.__setattr__(config, f.name, checked)


# -- checking one value ------------------------------------------------------------------------
def split_rules(hint: Any) -> tuple[Any, tuple[Rule, ...]]:
    """(the type inside ``Annotated``, its rules); a plain type has none."""
    if typing.get_origin(hint) is Annotated:
        inner, *extras = typing.get_args(hint)
        return inner, tuple(e for e in extras if isinstance(e, Rule))
    return hint, ()


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def is_int_at_least(value: object, low: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the type ``hint`` (rules not checked; a list fits a tuple type)."""
    base, _ = split_rules(hint)
    origin = typing.get_origin(base)
    if _is_union(base):
        return any(fits(value, arm) for arm in typing.get_args(base))
    if origin is Literal:
        return Choice(typing.get_args(base)).admits(value)
    if base is tuple or origin is tuple:
        return isinstance(value, tuple | list)
    if base is type(None):
        return value is None
    if base is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is Any:
        return True
    return isinstance(value, base)


def check_value(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against ``hint`` (type and rules); returns it, a list as a tuple.
    Raises :class:`ConfigError` naming ``where`` and the value."""
    base, rules = split_rules(hint)
    if _is_union(base):
        arm = next((a for a in typing.get_args(base) if fits(value, a)), None)
        if arm is None:
            raise _wrong_type(where, value, base)
        value = check_value(value, arm, where)
        if value is None:
            return value
    elif typing.get_origin(base) is Literal:
        rules = (Choice(typing.get_args(base)), *rules)
    elif base is tuple or typing.get_origin(base) is tuple:
        value = _check_tuple(value, base, where)
    elif not fits(value, base):
        raise _wrong_type(where, value, base)
    elif base is float and not any(isinstance(r, Bounds) for r in rules):
        rules = (*rules, Bounds())  # every float is finite unless a Bounds allows inf
    for rule in rules:
        _apply(rule, value, where, number=base is float)
    return value


def _apply(rule: Rule, value: Any, where: str, *, number: bool) -> None:
    if isinstance(rule, Bounds):
        if not number and not -INT64_LIMIT < value < INT64_LIMIT:
            raise ConfigError(_at(where, f"must fit 64 bits (|x| < 2**63), got {_show(value)}"))
        if not rule.admits(_as_float(value) if number else value):
            raise ConfigError(_at(where, f"must be {rule.describe(number)}, got {_show(value)}"))
    elif not rule.admits(value):
        raise ConfigError(_at(where, f"must be {rule.describe()}, got {_show(value)}"))


def _check_tuple(value: Any, base: Any, where: str) -> tuple[Any, ...]:
    args = typing.get_args(base)
    if not isinstance(value, tuple | list):
        raise _wrong_type(where, value, base)
    if not args:  # a bare ``tuple``: any items
        return tuple(value)
    if len(args) == 2 and args[1] is Ellipsis:
        args = (args[0],) * len(value)
    elif len(args) != len(value):
        raise _wrong_type(where, value, base)
    items = enumerate(zip(value, args, strict=True))
    checked = tuple(check_value(v, a, f"{where}[{i}]") for i, (v, a) in items)
    if isinstance(value, tuple) and all(c is v for c, v in zip(checked, value, strict=True)):
        return value
    return checked


def _as_float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond float's range
        return math.inf if value > 0 else -math.inf


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _at(where: str, problem: str) -> str:
    return f"{where} {problem}" if where else problem


def _wrong_type(where: str, value: Any, hint: Any) -> ConfigError:
    return ConfigError(
        _at(where, f"has the wrong type: {_show(value)} (expected {type_name(hint)})")
    )


def type_name(hint: Any) -> str:
    """A type in words: ``an integer``, ``a number or null``, ``a list of 2 numbers``."""
    base, _ = split_rules(hint)
    args, origin = typing.get_args(base), typing.get_origin(base)
    if _is_union(base):
        return " or ".join(type_name(a) for a in args)
    if origin is Literal:
        return Choice(args).describe()
    if base is tuple or origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(type_name(args[0]))}"
        return f"a list of {len(args)} {_plural(type_name(args[0]))}" if args else "a list"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return "null" if base is type(None) else names.get(base, getattr(base, "__name__", str(base)))


def _plural(name: str) -> str:
    return name.split(" ", 1)[-1] + "s" if name.startswith(("a ", "an ")) else name


def describe_rule(hint: Any) -> str:
    """A field's rule in words, for docs and help: ``>= 1``, ``in [0, 1), or null``..."""
    base, rules = split_rules(hint)
    if _is_union(base) and not rules:
        arms = [a for a in typing.get_args(base) if a is not type(None)]
        text = " or ".join(describe_rule(a) for a in arms)
        return f"{text}, or null" if len(arms) < len(typing.get_args(base)) else text
    if typing.get_origin(base) is Literal:
        return Choice(typing.get_args(base)).describe()
    if base is tuple or typing.get_origin(base) is tuple:
        args = [a for a in typing.get_args(base) if a is not Ellipsis]
        inner = {describe_rule(a) for a in args if split_rules(a)[1] or a is float}
        return f"{type_name(base)}, each {inner.pop()}" if len(inner) == 1 else type_name(base)
    if base is float and not rules:
        rules = (Bounds(),)
    said = [r.describe(base is float) if isinstance(r, Bounds) else r.describe() for r in rules]
    return "; ".join(said) or type_name(base)


def is_numeric(hint: Any) -> bool:
    """Whether a field of type ``hint`` holds numbers (int or float, maybe optional or in a
    tuple; bool is not a number)."""
    base, _ = split_rules(hint)
    if _is_union(base) or base is tuple or typing.get_origin(base) is tuple:
        return any(is_numeric(a) for a in typing.get_args(base) if a is not Ellipsis)
    return base in (int, float)


def has_rule(hint: Any) -> bool:
    """Whether every numeric part of ``hint`` carries a declared :class:`Bounds`."""
    base, rules = split_rules(hint)
    if _is_union(base) or base is tuple or typing.get_origin(base) is tuple:
        parts = [a for a in typing.get_args(base) if a is not Ellipsis and is_numeric(a)]
        return all(has_rule(a) for a in parts)
    return not is_numeric(base) or any(isinstance(r, Bounds | Choice) for r in rules)


# -- CLI flags ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlagType:
    """An argparse ``type=``: parses the text as ``hint``'s type (text that is no such number
    gets argparse's own "invalid int value"), then applies its rules: a value they refuse is an
    :class:`argparse.ArgumentTypeError` (argparse prints it after the usage and exits 2)."""

    hint: Any

    @property
    def __name__(self) -> str:  # argparse's "invalid <name> value: ..."
        return str(getattr(split_rules(self.hint)[0], "__name__", "value"))

    def __call__(self, text: str) -> Any:
        base, _ = split_rules(self.hint)
        value = int(text) if base is int else float(text) if base is float else text
        try:
            return check_value(value, self.hint, "")
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None


def flag(cls: type, name: str) -> FlagType:
    """The argparse ``type=`` of a flag that sets field ``name`` of config class ``cls``: the
    field's own type and rules (a flag left out is None: ``X | None`` becomes ``X``)."""
    hint = field_hints(cls)[name]
    base, rules = split_rules(hint)
    if _is_union(base):
        arms = [a for a in typing.get_args(base) if a is not type(None)]
        assert len(arms) == 1, f"{cls.__name__}.{name}: a flag needs one type, not {base}"
        hint = _annotated(arms[0], rules)
    return FlagType(hint)


def flag_type(kind: type, *rules: Rule) -> FlagType:
    """The argparse ``type=`` of a flag with no config field: ``kind`` (int, float, str) and
    the same rule objects the config fields use."""
    return FlagType(_annotated(kind, rules))


def _annotated(kind: Any, rules: tuple[Rule, ...]) -> Any:
    """``Annotated[kind, *rules]`` (just ``kind`` without rules)."""
    return typing.cast(Any, Annotated)[(kind, *rules)] if rules else kind


def choices_of(cls: type, name: str) -> tuple[Any, ...]:
    """The values a ``Literal`` or :class:`Choice` field allows (argparse ``choices=``)."""
    base, rules = split_rules(field_hints(cls)[name])
    if typing.get_origin(base) is Literal:
        return typing.get_args(base)
    found = [r.values for r in rules if isinstance(r, Choice)]
    assert found, f"{cls.__name__}.{name} declares no choices"
    return found[0]


# -- devices ------------------------------------------------------------------------------------
def resolve_device(name: str) -> torch.device:
    """The torch device a ``--device``/``train.device`` name means on this machine: ``auto`` =
    CUDA when available, else CPU. An unknown name, ``cuda`` without CUDA, ``cuda:N`` beyond the
    visible GPUs or ``mps`` without MPS is a one-line :class:`UserError` naming the value."""
    import torch

    if not DeviceName().admits(name):
        raise UserError(f"unknown device {name!r} (use {DeviceName().describe()})")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f"device {name!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= count:
            raise UserError(f"device {name!r}: this machine has {count} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device {name!r}: MPS is not available on this machine")
    return device


def device_flag(text: str) -> str:
    """argparse ``type=`` of ``--device``: the name, once :func:`resolve_device` accepts it."""
    try:
        resolve_device(text)
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def numeric_fields(cls: type) -> Sequence[str]:
    """The init fields of a dataclass that hold numbers (see :func:`is_numeric`)."""
    hints = field_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if f.init and is_numeric(hints[f.name])]
