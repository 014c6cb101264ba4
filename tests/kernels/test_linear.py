"""aiayn's own linear kernels (aiayn.kernels.linear).

int8: its weight layout by hand, and its products, quantisation and scaling bit for bit against
the plain-fp32 reference of the scheme, over shapes that are and are not whole blocks and row
counts on both of its paths (fewer than 4 rows, and tiles of 4), with and without bias.
fp32: its layout by hand, and its products against ``F.linear`` (summation order only) with and
without bias and residual. Each in both of its builds (AVX-512, AVX2), the CPU class capped by
:func:`aiayn.kernels.cpu.capped`. Held to run where they can: on a CPU of class AVX2 or higher
with a C++ compiler, they must build."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from aiayn.kernels import cpu
from aiayn.kernels.linear import (
    fp32_blocks,
    native_fp32,
    native_fp32_unavailable,
    native_int8,
    native_int8_unavailable,
    native_quantize_rows,
    padded_to_blocks,
    vnni_blocks,
)
from aiayn.layers.quantized import (
    QuantizedLinear,
    absmax_scales,
    int8_linear_reference,
    quantize_rows,
)


def _capped(level: str) -> Iterator[None]:
    """Run the test under the CPU class cap ``level`` (skipped on a CPU below it)."""
    with cpu.capped(level) as in_force:
        if in_force != level:
            pytest.skip(f"this CPU (or AIAYN_CPU_CAP) is below {level}")
        yield


def _build_for(level: str, loader: Any, why: Any, name: str) -> Iterator[Any]:
    """The kernel ``loader()`` gives under the CPU class cap ``level``, for the test's span."""
    for _ in _capped(level):
        op = loader()
        if op is None:
            pytest.skip(f"aiayn's {name} kernel: {why()}")
        yield op


@pytest.fixture(params=["avx512_vnni", "avx2"])
def ops(request: pytest.FixtureRequest) -> Iterator[Any]:
    """aiayn's int8 product in each of its builds."""
    yield from _build_for(request.param, native_int8, native_int8_unavailable, "int8")


@pytest.fixture(params=["avx512", "avx2"])
def fp32_ops(request: pytest.FixtureRequest) -> Iterator[Any]:
    """aiayn's fp32 product in each of its builds."""
    yield from _build_for(request.param, native_fp32, native_fp32_unavailable, "fp32")


def test_they_build_where_the_cpu_and_a_compiler_allow() -> None:
    if shutil.which("c++") is None or os.environ.get("AIAYN_NATIVE") == "0":
        pytest.skip("no C++ compiler here, or the kernels turned off")
    if cpu.at_least("avx2"):
        assert native_fp32() is not None, native_fp32_unavailable()
        assert native_int8() is not None, native_int8_unavailable()
    with cpu.capped("generic"):  # nothing runs, nothing is looked up
        assert native_int8() is None and native_fp32() is None
        assert "generic" in str(native_int8_unavailable())


def test_the_weight_layout_by_hand() -> None:
    """One output channel of 5 inputs: two groups of 4 inputs in one block of 16 channels."""
    weight = torch.tensor([[1, 2, 3, 4, 5]], dtype=torch.int8)
    blocks, compensation = vnni_blocks(weight)
    assert blocks.shape == (1, 2, 64) and compensation.shape == (16,)
    assert blocks[0, 0, :4].tolist() == [1, 2, 3, 4] and blocks[0, 1, :4].tolist() == [5, 0, 0, 0]
    assert int(blocks.abs().sum()) == 15  # the rest is padding
    assert compensation.tolist() == [128 * 15] + [0] * 15
    # channel o, input i sits at block o // 16, group i // 4, lane (o % 16) * 4 + i % 4
    w = torch.arange(40 * 9, dtype=torch.int32).remainder(255).sub(127).to(torch.int8).view(40, 9)
    blocks, _ = vnni_blocks(w)
    for o, i in [(0, 0), (17, 5), (39, 8), (31, 3)]:
        assert blocks[o // 16, i // 4, (o % 16) * 4 + i % 4] == w[o, i]


@pytest.mark.parametrize("d_in, d_out", [(5, 3), (64, 48), (66, 50), (512, 1000), (2048, 96)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 33])
def test_the_product_equals_the_reference_bit_for_bit(
    ops: Any, d_in: int, d_out: int, rows: int
) -> None:
    torch.manual_seed(d_in * 7 + rows)
    layer = QuantizedLinear.of(nn.Linear(d_in, d_out))
    blocks, compensation = vnni_blocks(layer.weight)
    scales = padded_to_blocks(layer.scales, d_out)
    x = torch.randn(rows, d_in) * torch.logspace(-3, 3, rows)[:, None]  # rows of every size
    residual = torch.randn(rows, d_out)
    for bias in (layer.bias, None):
        padded = None if bias is None else padded_to_blocks(bias, d_out)
        got = ops(x, blocks, compensation, scales, padded, None, d_out)
        want = int8_linear_reference(x, layer.weight, layer.scales, bias)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        got = ops(x, blocks, compensation, scales, padded, residual, d_out)
        torch.testing.assert_close(got, want + residual, atol=0, rtol=0)  # added last


def test_the_rows_quantise_as_the_reference_with_zero_and_tied_rows() -> None:
    """x_q + 128 and the scales; a row of zeros (scale 1, all 128) and values halfway between
    two steps (rounded to even, as torch.round)."""
    with cpu.capped("avx512_vnni"):
        quantize = native_quantize_rows()
    if quantize is None:
        pytest.skip("aiayn's int8 kernel for AVX-512 VNNI does not run here")
    x = torch.randn(6, 37) * 5
    x[1] = 0.0
    x[2, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # scale 1: ties round to 0, 2, -2
    x[2, 4:] = 0.0
    unsigned, scales = quantize(x)
    want_scales = absmax_scales(x)
    torch.testing.assert_close(scales, want_scales, atol=0, rtol=0)
    want = quantize_rows(x, want_scales).to(torch.int16) + 128
    assert unsigned.dtype == torch.uint8 and torch.equal(unsigned.to(torch.int16), want)
    assert unsigned[2, :4].tolist() == [255, 128, 130, 126] and unsigned[1].eq(128).all()


def test_wrong_operands_are_refused_by_name(ops: Any) -> None:
    layer = QuantizedLinear.of(nn.Linear(8, 16))
    blocks, compensation = vnni_blocks(layer.weight)
    scales = padded_to_blocks(layer.scales, 16)
    with pytest.raises(RuntimeError, match="x: a contiguous CPU float32"):
        ops(torch.zeros(2, 8).double(), blocks, compensation, scales, None, None, 16)
    with pytest.raises(RuntimeError, match="inputs do not fit"):
        ops(torch.zeros(2, 12), blocks, compensation, scales, None, None, 16)


def test_the_fp32_layout_by_hand() -> None:
    """Two output channels of two inputs: one block of 16 channels, input by input."""
    blocks = fp32_blocks(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert blocks.shape == (1, 2, 16)
    assert blocks[0, 0, :2].tolist() == [1.0, 3.0] and blocks[0, 1, :2].tolist() == [2.0, 4.0]
    assert float(blocks.abs().sum()) == 10.0  # the rest is padding
    w = torch.randn(40, 9)
    blocks = fp32_blocks(w)  # channel o, input i at block o // 16, row i, lane o % 16
    for o, i in [(0, 0), (17, 5), (39, 8), (31, 3)]:
        assert blocks[o // 16, i, o % 16] == w[o, i]


@pytest.mark.parametrize("d_in, d_out", [(1, 1), (5, 3), (64, 48), (66, 50), (512, 1000)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_the_fp32_product_equals_f_linear(fp32_ops: Any, d_in: int, d_out: int, rows: int) -> None:
    """Every row count on both of its paths (tiles of 4 rows and the rest), with and without
    bias and residual, the residual added after the bias."""
    torch.manual_seed(d_in * 7 + rows)
    weight, bias = torch.randn(d_out, d_in), torch.randn(d_out)
    x, residual = torch.randn(rows, d_in), torch.randn(rows, d_out)
    blocks = fp32_blocks(weight)
    for b in (bias, None):
        for r in (residual, None):
            padded = None if b is None else padded_to_blocks(b, d_out)
            got = fp32_ops(x, blocks, padded, r, d_out)
            exact = torch.nn.functional.linear(x.double(), weight.double(), _double(b))
            exact = exact + (0 if r is None else r.double())
            # fp32 rounding of sums of d_in products of size ~1: a few 1e-6 · √d_in
            torch.testing.assert_close(got.double(), exact, atol=4e-6 * d_in**0.5, rtol=1e-6)


def _double(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.double()


def test_wrong_fp32_operands_are_refused_by_name(fp32_ops: Any) -> None:
    blocks = fp32_blocks(torch.randn(16, 8))
    with pytest.raises(RuntimeError, match="x: a contiguous CPU float32"):
        fp32_ops(torch.zeros(2, 8).double(), blocks, None, None, 16)
    with pytest.raises(RuntimeError, match="with x's K"):
        fp32_ops(torch.zeros(2, 12), blocks, None, None, 16)
    with pytest.raises(RuntimeError, match="n does not fit"):
        fp32_ops(torch.zeros(2, 8), blocks, None, None, 17)
    with pytest.raises(RuntimeError, match="residual: contiguous float32"):
        fp32_ops(torch.zeros(2, 8), blocks, None, torch.zeros(2, 15), 16)
