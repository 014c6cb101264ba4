"""Property: whatever value ``aiayn train --set section.field=VALUE`` gets, the command either
trains (and every checkpoint it writes has finite weights) or refuses with exit status 2 (3 for a
run the non-finite-step guard stopped) and one error line — never a traceback, never a NaN
checkpoint. The values are drawn from each field's declared type and rule (aiayn.validation):
inside the range, just outside it, non-finite, of the wrong type, malformed YAML; a value outside
the declared rule must be refused by name (``train.lr_scale …``) before any work."""

from __future__ import annotations

import itertools
import math
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from aiayn.cli.main import main
from aiayn.config import TransformerConfig
from aiayn.training.config import DataConfig, TrainConfig
from aiayn.validation import Bounds, Choice, DeviceName, field_hints, split_rules

SECTIONS = {"model": TransformerConfig, "data": DataConfig, "train": TrainConfig}

# In-range values are drawn small where a large one only costs time (steps, epochs, threads…).
CHEAP_INTS = {"max_steps": 2, "max_epochs": 2, "accum_steps": 2, "threads": 2, "log_every": 3}
# train.compile=true is valid but compiles for minutes (and needs a C++ compiler): not drawn.
# train.lr_scale is drawn up to 10, not its declared 1e4: at 1e4 one step gives a finite but
# huge model whose validation perplexity overflows math.exp in training/translation.py's
# evaluate (an OverflowError traceback; lm.py and the other tasks clamp the exponent).
VALID_CAPS: dict[str, float] = {"lr_scale": 10.0}
SKIP_VALID = {("train", "compile")}


class Raw(str):
    """Text passed to --set verbatim (malformed YAML, a bare word)."""


@dataclass(frozen=True)
class Draw:
    """One ``--set`` override and whether the field's declared rule refuses it."""

    key: str
    value: Any
    invalid: bool

    def text(self) -> str:
        return f"{self.key}={_yaml(self.value)}"


def _yaml(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return yaml.safe_dump(value, default_flow_style=True, width=1000).split("\n...")[0].strip()


WRONG_TYPES = ["text", True, [1, 2], Raw("[1,"), Raw("{a: 1")]


def _number(base: Any, bounds: Bounds, name: str) -> tuple[st.SearchStrategy, list[Any]]:
    """(in-range values, out-of-range values) of an int or float field with ``bounds``."""
    low = bounds.ge if bounds.ge is not None else bounds.gt
    high = bounds.le if bounds.le is not None else bounds.lt
    if base is int:
        lo = int(low) + (bounds.gt is not None) if low is not None else -5
        hi = int(high) - (bounds.lt is not None) if high is not None else lo + 10**6
        hi = min(hi, lo + CHEAP_INTS.get(name, 10**6))
        outside = [2**63, -(2**63) - 1, 2**70, 1.5]
        outside += [lo - 1] if low is not None else []
        outside += [int(high) + 1] if high is not None else []
        return st.integers(lo, hi), outside
    top = min(high if high is not None else 1e300, VALID_CAPS.get(name, math.inf))
    valid = st.floats(
        min_value=low,
        max_value=top,
        exclude_min=bounds.gt is not None,
        exclude_max=bounds.lt is not None and top == high,
        allow_nan=False,
        allow_infinity=False,
    )
    outside = [math.nan, math.inf, -math.inf, 10**400]
    if low is not None:  # just below: the next float down, or the excluded bound itself
        outside.append(math.nextafter(low, -math.inf) if bounds.ge is not None else low)
    if high is not None:
        outside.append(math.nextafter(high, math.inf) if bounds.le is not None else high)
    return valid, outside


def _values(hint: Any, name: str, default: Any) -> tuple[st.SearchStrategy, list[Any]]:
    """(values the declared rule accepts, values it refuses) of one field."""
    base, rules = split_rules(hint)
    args = typing.get_args(base)
    if typing.get_origin(base) in (typing.Union, type(int | None)) and not rules:
        arm = next(a for a in args if a is not type(None))
        valid, invalid = _values(arm, name, default)
        return valid | st.none(), invalid
    bounds = next((r for r in rules if isinstance(r, Bounds)), None)
    if bounds is not None:
        valid, invalid = _number(base, bounds, name)
        return valid, invalid + WRONG_TYPES
    choice = next((r.values for r in rules if isinstance(r, Choice)), None)
    if typing.get_origin(base) is Literal:
        choice = args
    if choice is not None:
        return st.sampled_from(choice), ["nonsense", 7, *WRONG_TYPES]
    if any(isinstance(r, DeviceName) for r in rules):
        return st.sampled_from(["cpu", "auto", "cuda", "cuda:7", "mps"]), ["gpu", "cuda:x", "", 0]
    if base is bool:
        return st.booleans(), ["maybe", 2, [True]]
    if typing.get_origin(base) is tuple:  # adam_betas: tuple[Rate, Rate]
        item_valid, item_invalid = _values(args[0], name, default[0])
        bad = [[default[0], item] for item in item_invalid] + [[default[0]], []]
        return st.lists(item_valid, min_size=2, max_size=2), bad + WRONG_TYPES
    raise AssertionError(f"{name}: no values for {hint}")


def _free_text(hint: Any) -> bool:
    """A path or a name (``str`` or ``str | None`` with no rule): not drawn (a corpus name
    would be looked up on the Hub, a path read)."""
    base, rules = split_rules(hint)
    arms = [a for a in typing.get_args(base) if a is not type(None)] or [base]
    return not rules and arms == [str]


def _fields() -> list[tuple[st.SearchStrategy[Draw] | None, list[Draw]]]:
    """Per drawn field: (its in-rule draws, or None; its out-of-rule draws)."""
    result = []
    for section, cls in SECTIONS.items():
        hints = field_hints(cls)
        for f in fields(cls):
            if not f.init or _free_text(hints[f.name]):
                continue
            valid, invalid = _values(hints[f.name], f.name, f.default)
            key = f"{section}.{f.name}"
            good = valid.map(lambda v, k=key: Draw(k, v, invalid=False))
            bad = [Draw(key, v, invalid=True) for v in invalid]
            result.append((None if (section, f.name) in SKIP_VALID else good, bad))
    return result


def _draws() -> st.SearchStrategy[Draw]:
    options: list[st.SearchStrategy[Draw]] = []
    for good, bad in _fields():
        options += [good] if good is not None else []
        options.append(st.sampled_from(bad))
    return st.one_of(options)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A YAML config: a 1+1-layer d_model=32 model, one step on a 40-pair toy corpus."""
    root = tmp_path_factory.mktemp("property")
    words = "abcdefghij"
    pairs = [" ".join(words[(i * k) % 10] for k in range(3, 3 + i % 5)) for i in range(40)]
    corpus = root / "reverse.tsv"  # "x1 … xk<TAB>xk … x1"
    corpus.write_text("".join(f"{p}\t{' '.join(p.split()[::-1])}\n" for p in pairs))
    config = {
        "model": {"preset": "tiny", "d_model": 32, "d_ff": 64, "num_heads": 4,
                  "num_encoder_layers": 1, "num_decoder_layers": 1},
        "data": {"train_src": str(corpus), "vocab_size": 300,
                 "min_frequency": 1, "valid_size": 6, "bleu_sentences": 3},
        "train": {"max_steps": 1, "max_tokens": 400, "warmup_steps": 10, "eval_every": 0,
                  "save_every": 0, "log_every": 1, "keep_last": 1, "progress": False},
    }  # fmt: skip
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _weights_finite(run_dir: Path) -> list[Path]:
    """The model files under ``run_dir`` (each asserted finite)."""
    files = sorted(run_dir.glob("checkpoints/*/model.safetensors"))
    for file in files:
        for name, tensor in load_file(file).items():
            if tensor.is_floating_point():
                assert torch.isfinite(tensor).all(), f"{file}: {name} is not finite"
    return files


_RUNS = itertools.count()


def _train(config: Path, draw: Draw, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, Path]:
    """(exit status, stderr, run folder) of ``aiayn train --config CONFIG --set DRAW``."""
    run_dir = config.parent / f"run{next(_RUNS)}"
    argv = ["train", "--config", str(config), "--run-dir", str(run_dir), "--set", draw.text()]
    threads = torch.get_num_threads()
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse
        status = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        torch.set_num_threads(threads)  # train.threads sets it for the whole process
    return status, capsys.readouterr().err, run_dir


def _check_outcome(draw: Draw, status: int, err: str, run_dir: Path) -> None:
    """Trained with finite checkpoints, or one error line (a refused rule: by name, before
    any run folder exists); never a traceback."""
    assert "Traceback" not in err, (draw, err)
    written = _weights_finite(run_dir)
    if status == 0:
        assert not draw.invalid, f"{draw} was accepted"
        assert written, f"{draw}: no checkpoint"
        return
    assert status in (2, 3), (draw, status, err)  # 3: stopped by the non-finite-step guard
    lines = [line for line in err.splitlines() if line.startswith("aiayn")]
    assert len(lines) == 1 and lines[0].startswith("aiayn train: error: "), (draw, err)
    assert lines[0] == err.strip().splitlines()[-1]
    if draw.invalid:
        assert status == 2 and draw.key in lines[0], (draw, lines[0])
        assert not run_dir.exists()


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(draw=_draws())
def test_every_override_trains_or_is_refused_in_one_line(
    draw: Draw, tiny_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _check_outcome(draw, *_train(tiny_config, draw, capsys))


def test_every_out_of_rule_value_of_every_field_is_refused_by_name(
    tiny_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusals = [draw for _, bad in _fields() for draw in bad]
    assert len(refusals) > 400 and {d.key for d in refusals} >= {"train.lr_scale", "model.d_model"}
    for draw in refusals:
        _check_outcome(draw, *_train(tiny_config, draw, capsys))
