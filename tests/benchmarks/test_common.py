"""The matmul-peak helpers of benchmarks/_common.py: the fastest kernel is chosen among those that
ran, and every kernel listed computes the product it is timed as (no timing asserted)."""

from __future__ import annotations

import math

import pytest
import torch

from _common import (
    Peak,
    aiayn_kernels,
    describe_cpu,
    fastest,
    fp32_kernels,
    int8_kernels,
    matmul_peaks,
    report_name,
    without_cpu_classes,
)
from aiayn.kernels import cpu
from aiayn.kernels.linear import native_fp32, native_int8
from aiayn.settings import performance_settings


def test_fastest_takes_the_highest_rate_of_the_kernels_that_ran() -> None:
    rates = {"torch.mm (MKL)": 2.0e11, "oneDNN packed linear": 3.5e11, "missing": None}
    assert fastest(rates) == ("oneDNN packed linear", 3.5e11)
    assert fastest({"a": math.nan, "b": 1.0, "c": None}) == ("b", 1.0)
    with pytest.raises(ValueError, match="no matmul kernel ran"):
        fastest({"a": None, "b": math.nan})


def test_peak_caption_names_the_winner_and_the_others() -> None:
    rates = {"torch.mm (MKL)": 2e11, "oneDNN packed linear": 3.5e11, "x": None}
    peak = Peak(3.5e11, "oneDNN packed linear", rates)
    assert (
        peak.describe() == "350 GFLOP/s (oneDNN packed linear; others: torch.mm (MKL) 200, x n/a)"
    )
    assert peak.describe("GOP/s").startswith("350 GOP/s")


def test_fp32_kernels_compute_the_same_product() -> None:
    torch.manual_seed(0)
    kernels = fp32_kernels(64)
    results = [fn() for fn in kernels.values() if fn is not None]
    assert len(results) >= 1
    for r in results[1:]:  # a @ b, whichever kernel (the packed weight is bᵀ as a linear's)
        torch.testing.assert_close(r, results[0], rtol=1e-4, atol=1e-4)


def test_int8_kernels_run_and_int_mm_is_exact() -> None:
    kernels = int8_kernels(32)
    assert "torch._int_mm" in kernels
    out = kernels["torch._int_mm"]()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int32
    for name, fn in kernels.items():
        if fn is not None:
            result = fn()
            assert isinstance(result, torch.Tensor), name
            assert result.shape == (32, 32), name


def test_matmul_peaks_reports_every_kernel_and_picks_the_maximum() -> None:
    peak = matmul_peaks("int8", n=32, repeats=1)
    rates = {k: v for k, v in peak.by_kernel.items() if v is not None}
    assert peak.kernel in rates and peak.flops == max(rates.values())
    assert set(peak.by_kernel) == set(int8_kernels(8))


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512bw avx512_vnni sha_ni
processor\t: 1
model name\t: AMD EPYC
"""


def test_describe_cpu_names_model_numbers_and_matmul_flags() -> None:
    assert describe_cpu(CPUINFO) == "AMD EPYC (family 25, model 17; avx2 avx512f avx512_vnni)"
    plain = "model name\t: Old CPU\nflags\t: fpu sse2\n"
    assert describe_cpu(plain) == (
        "Old CPU (none of avx2, avx512f, avx512_vnni, avx512_bf16, amx_int8, amx_bf16)"
    )
    assert describe_cpu("processor\t: 0\n") == ""


def test_the_kernels_line_follows_the_settings_and_the_cpu_class() -> None:
    with performance_settings(fp32_native_max_rows=3, int8_native_max_rows=7):
        line = aiayn_kernels()
    if native_int8() is not None:
        assert "int8 linear, 1–7 rows: aiayn linear" in line
    if native_fp32() is not None:
        assert "fp32 linear, 1–3 rows: aiayn linear_fp32" in line
    with cpu.capped("generic"):
        line = aiayn_kernels()
    assert line.startswith("CPU class generic:") and "aiayn linear" not in line


def test_argv_loses_its_cpu_classes_and_names_follow_the_class() -> None:
    argv = ["--rounds", "3", "--cpu-classes", "native", "avx2", "--seed", "1"]
    assert without_cpu_classes(argv) == ["--rounds", "3", "--seed", "1"]
    assert without_cpu_classes(["--cpu-classes", "avx2"]) == []
    assert report_name("translate_vs_ct2", "avx2") == "translate_vs_ct2_avx2"
    assert report_name("translate_vs_ct2", "native") == "translate_vs_ct2"
    assert report_name("translate_vs_ct2", None) == "translate_vs_ct2"
