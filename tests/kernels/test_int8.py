"""aiayn.kernels.int8: the choice among the int8 kernels by hand, the saturation probe's
operands, and the probe itself against a kernel known to saturate (oneDNN capped to AVX2, in a
process of its own) and against this process's libraries."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from aiayn.kernels.int8 import (
    LIBRARY_KERNELS,
    choose_int8,
    exact_library_kernels,
    exact_sums,
    onednn_available,
    probe_operands,
)
from aiayn.settings import PerformanceSettings

BOTH = frozenset(LIBRARY_KERNELS)
NONE: frozenset[str] = frozenset()


def test_the_choice_by_hand() -> None:
    s = PerformanceSettings(int8_native_max_rows=8, int8_onednn_max_rows=100)
    assert choose_int8(8, True, BOTH, s) == "native"
    assert choose_int8(9, True, BOTH, s) == "onednn"
    assert choose_int8(101, True, BOTH, s) == "int_mm"
    assert choose_int8(101, True, frozenset({"onednn"}), s) == "onednn"  # the only exact one
    assert choose_int8(9, True, frozenset({"int_mm"}), s) == "int_mm"
    assert choose_int8(9, True, NONE, s) == "native"  # no library is exact: aiayn's kernel
    assert choose_int8(1, False, NONE, s) == "reference"  # nothing else runs here
    assert choose_int8(1, False, BOTH, s) == "onednn"


def test_the_probe_saturates_16_bit_pair_sums() -> None:
    """Its operands hold pairs whose u8 × s8 sum, as oneDNN's AVX2 path forms it from x_q + 128,
    exceeds int16: (127 + 128) · 127 · 2 = 64770."""
    x, w = probe_operands()
    assert x.dtype == w.dtype == torch.int8 and int(x.abs().max()) == int(w.abs().max()) == 127
    assert int(x.min()) >= -127 and int(w.min()) >= -127  # the scheme never uses -128
    pair = (x[0, :2].long() + 128) * w[3, :2].long()  # all +127 against all +127
    assert int(pair.sum()) == 64770 > 32767
    assert int(exact_sums(x, w)[0, 3]) == 127 * 127 * 64
    assert int(exact_sums(x, w)[1, 3]) == -127 * 127 * 64


def test_every_library_kernel_this_process_chooses_is_exact_on_random_sums() -> None:
    from aiayn.kernels.int8 import _library_sums

    torch.manual_seed(0)
    x = torch.randint(-127, 128, (40, 300), dtype=torch.int8)
    w = torch.randint(-127, 128, (70, 300), dtype=torch.int8)
    for kernel in exact_library_kernels():
        assert torch.equal(_library_sums(kernel, x, w), exact_sums(x, w)), kernel


@pytest.mark.skipif(os.name != "posix", reason="a POSIX environment")
def test_onednn_capped_to_avx2_saturates_and_is_never_chosen() -> None:
    """On a CPU with VNNI, oneDNN capped to AVX2 multiplies with vpmaddubsw, as on an AVX2
    CPU: the probe finds it inexact, and a layer's output keeps the reference's bits."""
    if not onednn_available():
        pytest.skip("this PyTorch has no oneDNN int8 kernel")
    code = (
        "import torch\n"
        "from aiayn.kernels.int8 import exact_library_kernels, _library_sums, probe_operands,"
        " exact_sums\n"
        "from aiayn.layers.quantized import QuantizedLinear, int8_linear_reference\n"
        "x, w = probe_operands()\n"
        "print('onednn', torch.equal(_library_sums('onednn', x, w), exact_sums(x, w)))\n"
        "print('exact', sorted(exact_library_kernels()))\n"
        "layer = QuantizedLinear.of(torch.nn.Linear(64, 32))\n"
        "layer.weight.copy_(w)\n"
        "xs = x.float() * 3\n"
        "want = int8_linear_reference(xs, layer.weight, layer.scales, layer.bias)\n"
        "for rows in (1, 32):\n"
        "    with __import__('aiayn.settings').settings.performance_settings("
        "int8_native_max_rows=0):\n"
        "        print(rows, torch.equal(layer(xs[:rows]), want[:rows]))\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "onednn False", out  # the cap reproduces the saturation
    assert out[1] == "exact []"
    assert out[2:4] == ["1 True", "32 True"]
