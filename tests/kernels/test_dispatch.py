"""aiayn.kernels.dispatch and ``aiayn kernels``: the table says what the operations run, by the
same choice they make, per CPU class; the command prints it and builds nothing where nothing
runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from aiayn.kernels import cpu, dispatch
from aiayn.kernels.linear import native_int8
from aiayn.layers.quantized import Int8Kernel
from aiayn.settings import performance_settings


def test_spans_merge_neighbours_by_hand() -> None:
    assert dispatch._spans([(8, "a"), (1024, "a"), (2**62, "b")]) == [
        ("1–1024", "a"),
        ("1025+", "b"),
    ]
    assert dispatch._spans([(3, "a"), (2**62, "b")]) == [("1–3", "a"), ("4+", "b")]


def _int8_kernel_of(rows: int) -> str:
    """The kernel the table names for ``rows`` int8 rows."""
    for row in dispatch.int8_rows():
        low, _, high = row.sizes.removesuffix(" rows").replace("+", "–").partition("–")
        if int(low) <= rows and (not high or rows <= int(high)):
            return row.kernel
    raise AssertionError(rows)


def test_the_int8_rows_are_what_a_layer_runs_on_every_class() -> None:
    names = {"native": "aiayn", "onednn": "oneDNN", "int_mm": "_int_mm", "reference": "reference"}
    for level in cpu.LEVELS:
        with cpu.capped(level), performance_settings(int8_native_max_rows=4):
            for rows in (1, 4, 5, 3000):
                chosen = Int8Kernel.choice(torch.zeros(rows, 8))
                assert names[chosen] in _int8_kernel_of(rows), (level, rows, chosen)


def test_the_report_names_the_class_and_the_kernels() -> None:
    with cpu.capped("generic"):
        lines = dispatch.report()
    assert lines[0].startswith("CPU: ") and "class in force: generic" in lines[1]
    assert not any("aiayn linear" in line for line in lines)
    if native_int8() is not None:
        with cpu.capped("avx2"):
            assert any("aiayn linear_avx2" in line for line in dispatch.report())


def test_the_command_prints_it_and_builds_nothing_on_a_generic_class(tmp_path: object) -> None:
    env = {**os.environ, "AIAYN_CPU_CAP": "generic", "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "kernels", "build"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "nothing to build: the CPU class is generic (capped)" in done.stdout
    assert "int8 linear, 1" in done.stdout and "aiayn linear" not in done.stdout
    assert not os.listdir(str(tmp_path))


def test_the_command_exits_1_when_a_kernel_that_should_run_fails_to_build(tmp_path: object) -> None:
    from aiayn.kernels.build import why_not_here

    if why_not_here() is not None:
        pytest.skip(f"no kernel runs here: {why_not_here()}")
    env = {**os.environ, "CXX": "/nonexistent/c++", "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "kernels", "build"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout
    assert "not run: could not be built" in done.stdout
    assert "PyTorch's kernels instead" in done.stderr and "!! WARNING" not in done.stderr


def test_the_slot_attention_row_is_what_attend_slots_runs_on_every_class() -> None:
    """The table names aiayn's build where attend_slots takes its kernel, the gathered
    reference elsewhere (each CPU class, the kernel off by the settings too)."""
    from aiayn.attention import slots

    query, pool = torch.zeros(1, 1, 1, 4), torch.zeros(2, 1, 3, 4)
    cache = slots.SlotCache(pool, pool, torch.tensor([1]), torch.tensor([2]), 2)
    for level in cpu.LEVELS:
        for limit in (0, 32):
            with cpu.capped(level), performance_settings(native_attention_max_queries=limit):
                (row,) = [r for r in dispatch.table() if r.operation == "attention over slots"]
                runs_kernel = slots._native(query, cache, None) is not None
                assert ("aiayn" in row.kernel) == runs_kernel, (level, limit, row)
