"""The int8 layer (aiayn.layers.quantized): its scales and rounding by hand, its product against
the dequantised weight (fp32 tolerance) and its plain-fp32 reference, every one of its CPU kernels
giving the same bits, blocks of rows, and the swap of a model's linear layers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.kernels import cpu
from aiayn.kernels.int8 import LIBRARY_KERNELS, exact_library_kernels, onednn_available
from aiayn.kernels.linear import native_int8_unavailable
from aiayn.layers import quantized
from aiayn.layers.quantized import (
    QuantizedLinear,
    absmax_scales,
    dequantize_weight,
    int8_linear_reference,
    is_quantized,
    quantize_linears,
    quantize_rows,
    quantize_weight,
)
from aiayn.settings import performance_settings


def test_scales_are_the_row_absmax_over_127_and_one_for_a_zero_row() -> None:
    x = torch.tensor([[0.5, -1.27, 0.0], [0.0, 0.0, 0.0], [2.54, 1.0, -2.54]])
    torch.testing.assert_close(absmax_scales(x), torch.tensor([0.01, 1.0, 0.02]))


def test_rows_round_to_the_nearest_step_symmetrically() -> None:
    x = torch.tensor([[0.5, -1.27, 0.004, -0.006], [0.0, 0.0, 0.0, 0.0]])
    q = quantize_rows(x, torch.tensor([0.01, 1.0]))
    assert q.dtype == torch.int8
    # 0.5/0.01 = 50, -127, 0.4 -> 0, -0.6 -> -1 (half away from the grid: nearest); zeros stay
    assert q.tolist() == [[50, -127, 0, -1], [0, 0, 0, 0]]


def test_a_weight_quantises_per_output_channel() -> None:
    w = torch.tensor([[1.27, -0.635, 0.0], [0.0, 0.0, 0.0], [-0.254, 0.127, 0.0635]])
    q, scales = quantize_weight(w)
    torch.testing.assert_close(scales, torch.tensor([0.01, 1.0, 0.002]))
    assert q.tolist() == [[127, -64, 0], [0, 0, 0], [-127, 64, 32]]  # -63.5 and 31.75 round off
    torch.testing.assert_close(dequantize_weight(q, scales), q.float() * scales[:, None])
    assert (dequantize_weight(q, scales) - w).abs().max() <= scales.max() / 2


@pytest.mark.parametrize("bias", [True, False])
def test_the_layer_is_close_to_fp32_on_its_dequantised_weight(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias)
    layer = QuantizedLinear.of(linear)
    x = torch.randn(2, 7, 96)  # leading dimensions kept
    y = layer(x)
    assert y.shape == (2, 7, 40) and y.dtype == torch.float32
    # the activations' rounding: at most half a step of each of 96 inputs, times |W|
    on_dequantised = F.linear(x, layer.dequantized(), linear.bias)
    x_step = absmax_scales(x.reshape(-1, 96)).max()
    bound = 0.5 * x_step * layer.dequantized().abs().sum(dim=1).max()
    assert (y - on_dequantised).abs().max() <= bound
    torch.testing.assert_close(y, on_dequantised, atol=0.05, rtol=0.05)


KERNELS = ("native", "onednn", "onednn, rows quantised in PyTorch", "int_mm", "reference")
LEVELS = ("avx512_vnni", "avx2", "generic")
ROWS = (1, 3, 5, 40, 1100)


def _saturating_layer() -> QuantizedLinear:
    """A layer whose int8 weights are all ±127 in patterns (then random): the operands on
    which a kernel whose 16-bit pair sums saturate goes wrong (:mod:`aiayn.kernels.int8`)."""
    torch.manual_seed(1)
    linear = nn.Linear(66, 50)  # neither a whole number of the native kernel's blocks
    with torch.no_grad():
        linear.weight[:4] = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
        linear.weight[2, 1::2] = -1.0
        linear.weight[3, 1::2] = 1.0
    return QuantizedLinear.of(linear)


def _inputs(rows: int) -> torch.Tensor:
    """Rows of ±1 patterns (every magnitude quantises to 127), a row of zeros, then random."""
    x = torch.randn(rows, 66) * 3
    patterns = torch.ones(4, 66)
    patterns[1] = -1.0
    patterns[2, 1::2] = -1.0
    patterns[3, ::2] = -1.0
    x[: min(rows, 4)] = patterns[: min(rows, 4)]
    x[-1] = 0.0  # a row of zeros: scale 1
    return x


def _skip_unless_runs(kernel: str, level: str) -> None:
    """Skip a kernel that does not run on this host under ``level``, saying why."""
    if level != cpu.level() and cpu.rank(level) > cpu.rank(cpu.level()):
        pytest.skip(f"this CPU is below {level}")
    if kernel == "native" and quantized.native_int8() is None:
        pytest.skip(f"aiayn's int8 kernel under {level}: {native_int8_unavailable()}")
    if kernel.startswith("onednn") and not onednn_available():
        pytest.skip("this PyTorch has no oneDNN int8 kernel")
    if (
        kernel.split(",")[0] in LIBRARY_KERNELS
        and kernel.split(",")[0] not in exact_library_kernels()
    ):
        pytest.skip(f"{kernel} is not exact in this process, so it never runs (tested below)")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows", ROWS)
def test_every_cpu_kernel_and_the_reference_agree(
    kernel: str, rows: int, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CPU kernel, under every CPU class cap (aiayn's in its AVX-512 VNNI and AVX2
    builds, oneDNN with the rows quantised by aiayn's kernel or by PyTorch, _int_mm, the
    reference's operations) sums the same exact integers and scales them in one order: the
    reference's bits, on inputs that saturate 16-bit pair sums too."""
    with cpu.capped(level):
        _skip_unless_runs(kernel, level)
        if kernel.endswith("PyTorch"):
            monkeypatch.setattr(quantized, "native_quantize_rows", lambda: None)
        layer, x = _saturating_layer(), _inputs(rows)
        want = int8_linear_reference(x, layer.weight, layer.scales, layer.bias)
        name = kernel.split(",")[0]
        kernel_of = layer.kernel()
        if name == "reference":
            got = int8_linear_reference(x, kernel_of.weight, kernel_of.scales, kernel_of.bias)
        else:
            got = getattr(kernel_of, name)(x)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", ROWS)
def test_the_kernel_chosen_on_every_cpu_class_gives_the_reference_bits(
    level: str, rows: int
) -> None:
    """What a layer runs, under each CPU class cap and with each side of the thresholds forced,
    is never a kernel that is not exact here, and gives the reference's bits."""
    layer, x = _saturating_layer(), _inputs(rows)
    want = int8_linear_reference(x, layer.weight, layer.scales, layer.bias)
    residual = torch.randn(rows, 50)
    exact = exact_library_kernels()
    with cpu.capped(level):
        for native, onednn in ((1024, 1 << 20), (0, 1 << 20), (0, 0), (1 << 20, 0)):
            with performance_settings(int8_native_max_rows=native, int8_onednn_max_rows=onednn):
                chosen = quantized.Int8Kernel.choice(x)
                assert chosen not in LIBRARY_KERNELS or chosen in exact, chosen
                torch.testing.assert_close(layer(x), want, atol=0, rtol=0)
                got = layer.kernel()(x, residual)  # the residual added after the bias
                torch.testing.assert_close(got, want + residual, atol=0, rtol=0)


@pytest.mark.parametrize("native_rows", [0, 2, 1 << 20])
@pytest.mark.parametrize("onednn_rows", [0, 2, 1 << 20])
def test_the_settings_choose_the_kernel_and_change_no_bit(
    native_rows: int, onednn_rows: int
) -> None:
    torch.manual_seed(4)
    layer = QuantizedLinear.of(nn.Linear(40, 24))
    x = torch.randn(5, 40)
    want = int8_linear_reference(x, layer.weight, layer.scales, layer.bias)
    residual = torch.randn(5, 24)
    with performance_settings(int8_native_max_rows=native_rows, int8_onednn_max_rows=onednn_rows):
        for rows in (1, 2, 5):
            torch.testing.assert_close(layer(x[:rows]), want[:rows], atol=0, rtol=0)
            kernel = layer.kernel()  # the residual connection, added after the bias
            got = kernel(x[:rows], residual[:rows])
            torch.testing.assert_close(got, want[:rows] + residual[:rows], atol=0, rtol=0)


def test_a_row_does_not_depend_on_the_others() -> None:
    """Activations are quantised per row: a row's output is the same alone or in a batch."""
    torch.manual_seed(2)
    layer = QuantizedLinear.of(nn.Linear(32, 16))
    x = torch.randn(5, 32)
    x[3] *= 100  # one large row does not coarsen the others' steps
    batch = layer(x)
    for i in range(5):
        torch.testing.assert_close(layer(x[i : i + 1]), batch[i : i + 1], atol=0, rtol=0)


def test_a_block_of_rows_is_that_block_of_the_output() -> None:
    torch.manual_seed(3)
    layer = QuantizedLinear.of(nn.Linear(16, 24))
    x = torch.randn(4, 16)
    full = layer(x)
    for block in (slice(0, 8), slice(8, 24)):
        torch.testing.assert_close(layer(x, block), full[:, block], atol=0, rtol=0)


def test_kernels_follow_the_buffers_loaded_in_place_and_copies() -> None:
    torch.manual_seed(4)
    a, b = QuantizedLinear.of(nn.Linear(8, 4)), QuantizedLinear.of(nn.Linear(8, 4))
    x = torch.randn(3, 8)
    before = a(x)
    a.load_state_dict(b.state_dict())
    torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
    assert not torch.equal(a(x), before)
    torch.testing.assert_close(copy.deepcopy(a)(x), b(x), atol=0, rtol=0)
    assert set(a.state_dict()) == {"weight", "scales", "bias"}
    assert a.state_dict()["weight"].dtype == torch.int8


def test_the_swap_replaces_exactly_the_linear_layers_not_kept() -> None:
    class Packed(nn.Linear):
        """A subclass: may compute anything, never swapped."""

    shared = nn.Linear(4, 4)
    model = nn.ModuleDict(
        {"a": nn.Linear(4, 4), "keep": nn.Linear(4, 4), "sub": Packed(4, 4), "s1": shared}
    )
    model["s2"] = shared
    quantize_linears(model, keep=lambda name: name == "keep")
    assert isinstance(model["a"], QuantizedLinear) and type(model["keep"]) is nn.Linear
    assert type(model["sub"]) is Packed
    assert model["s1"] is model["s2"] and isinstance(model["s1"], QuantizedLinear)
    assert is_quantized(model) and not is_quantized(nn.Sequential(nn.Linear(2, 2)))


def test_the_structure_alone_has_zero_weights_of_the_same_shapes() -> None:
    model = nn.Sequential(nn.Linear(6, 5, bias=False))
    quantize_linears(model, values=False)
    layer = model[0]
    assert isinstance(layer, QuantizedLinear) and layer.bias is None
    assert layer.weight.shape == (5, 6) and not layer.weight.any()
