"""aiayn's own int8 kernel (aiayn.layers.int8_native): its weight layout by hand, and its
products, quantisation and scaling bit for bit against the plain-fp32 reference of the scheme,
over shapes that are and are not whole blocks, with and without bias. Held to run where it can:
on a CPU with AVX-512 VNNI and a C++ compiler, it must build."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
from torch import nn

from aiayn.layers.int8_native import (
    native_int8,
    native_int8_unavailable,
    padded_to_blocks,
    vnni_blocks,
)
from aiayn.layers.quantized import (
    QuantizedLinear,
    absmax_scales,
    int8_linear_reference,
    quantize_rows,
)


def _cpu_has_vnni() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return " avx512_vnni" in info.read()
    except OSError:
        return False


def _ops() -> Any:
    ops = native_int8()
    if ops is None:
        pytest.skip(f"aiayn's int8 kernel: {native_int8_unavailable()}")
    return ops


def test_it_builds_where_the_cpu_and_a_compiler_allow() -> None:
    if not _cpu_has_vnni() or shutil.which("c++") is None:
        pytest.skip("no AVX-512 VNNI or no C++ compiler here")
    assert native_int8() is not None, native_int8_unavailable()


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
def test_the_product_equals_the_reference_bit_for_bit(d_in: int, d_out: int, rows: int) -> None:
    ops = _ops()
    torch.manual_seed(d_in * 7 + rows)
    layer = QuantizedLinear.of(nn.Linear(d_in, d_out))
    blocks, compensation = vnni_blocks(layer.weight)
    scales = padded_to_blocks(layer.scales, d_out)
    x = torch.randn(rows, d_in) * torch.logspace(-3, 3, rows)[:, None]  # rows of every size
    for bias in (layer.bias, None):
        padded = None if bias is None else padded_to_blocks(bias, d_out)
        got = ops.linear(x, blocks, compensation, scales, padded, d_out)
        want = int8_linear_reference(x, layer.weight, layer.scales, bias)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_the_rows_quantise_as_the_reference_with_zero_and_tied_rows() -> None:
    """x_q + 128 and the scales; a row of zeros (scale 1, all 128) and values halfway between
    two steps (rounded to even, as torch.round)."""
    ops = _ops()
    x = torch.randn(6, 37) * 5
    x[1] = 0.0
    x[2, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # scale 1: ties round to 0, 2, -2
    x[2, 4:] = 0.0
    unsigned, scales = ops.quantize_rows(x)
    want_scales = absmax_scales(x)
    torch.testing.assert_close(scales, want_scales, atol=0, rtol=0)
    want = quantize_rows(x, want_scales).to(torch.int16) + 128
    assert unsigned.dtype == torch.uint8 and torch.equal(unsigned.to(torch.int16), want)
    assert unsigned[2, :4].tolist() == [255, 128, 130, 126] and unsigned[1].eq(128).all()


def test_wrong_operands_are_refused_by_name() -> None:
    ops = _ops()
    layer = QuantizedLinear.of(nn.Linear(8, 16))
    blocks, compensation = vnni_blocks(layer.weight)
    scales = padded_to_blocks(layer.scales, 16)
    with pytest.raises(RuntimeError, match="x: a contiguous CPU float32"):
        ops.linear(torch.zeros(2, 8).double(), blocks, compensation, scales, None, 16)
    with pytest.raises(RuntimeError, match="inputs do not fit"):
        ops.linear(torch.zeros(2, 12), blocks, compensation, scales, None, 16)
