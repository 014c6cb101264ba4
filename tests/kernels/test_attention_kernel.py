"""aiayn's own attention kernel (aiayn.kernels.attention) against the explicit reference of
eq. (1): every mask, bias and scale option, every query length it takes, key lengths and head
sizes of every remainder, strided keys and values, the parallel branch; which calls
scaled_dot_product_attention sends to it and which it keeps on the other paths. Each of these
runs for every build the CPU has (``attend`` on AVX-512, ``attend_avx2`` on AVX2 and FMA), the
CPU class capped to the build's (aiayn.kernels.cpu.capped); which build a class picks is tested
too. Held to run where it can: on a CPU with AVX2 and FMA and a C++ compiler, it must build."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from aiayn.attention import CAUSAL, scaled_dot_product_attention
from aiayn.attention import scaled_dot_product as sdp
from aiayn.kernels import cpu
from aiayn.kernels.attention import (
    VARIANTS,
    native_attend,
    native_attention,
    native_attention_unavailable,
    variant_name,
)
from aiayn.kernels.build import SWITCH
from aiayn.settings import performance, performance_settings
from data_builders import cpu_has

SERIAL = 1 << 62  # a min_parallel_macs that no call reaches: heads on the calling thread
MAX_T = performance().native_attention_max_queries
MASKS = ("none", "keys (B,1,1,S)", "queries (1,1,T,S)", "full (B,H,T,S)", "rows fully blocked")
BIASES = ("none", "heads (1,H,T,S)", "full (B,H,T,S)")
BUILDS = tuple(VARIANTS)  # the CPU classes of the kernel's builds: "avx512", "avx2"


@pytest.fixture(params=BUILDS)
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test runs with the CPU class capped to a build's (all of it: calls through
    scaled_dot_product_attention included); skipped where the CPU, or a cap already in force
    (AIAYN_CPU_CAP), is below that class."""
    needed = request.param
    if cpu.rank(cpu.detected()) < cpu.rank(needed):
        pytest.skip(f"this CPU ({cpu.detected()}) lacks the {needed} build's instructions")
    with cpu.capped(needed) as in_force:
        if cpu.rank(in_force) < cpu.rank(needed):
            pytest.skip(f"the CPU class is capped to {in_force} ({cpu.CAP})")
        yield needed


def _attend(level: str | None = None) -> Any:
    """The kernel's operation for the class in force, which is ``level``'s build where given."""
    attend = native_attend()
    if attend is None:
        pytest.skip(f"aiayn's attention kernel: {native_attention_unavailable()}")
    if level is not None:
        assert attend is getattr(torch.ops.aiayn_attention, VARIANTS[level]).default
    return attend


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, **kw: Any) -> Any:
    """The explicit path (weights requested: never aiayn's kernel), fully blocked rows mended."""
    out, _ = scaled_dot_product_attention(q, k, v, mask, need_weights=True, **kw)
    return out


def _atol(
    q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, scale: float | None
) -> float:
    """1e-6, grown with the largest score s: summation order changes a score's fp32 rounding,
    which moves its weight by about 1e-7·|s| relatively, on both paths (scale 1 at d_k 64 with
    a bias gives |s| ≈ 40; both paths then differ from fp64 by up to about 1e-5)."""
    scores = (q @ k.transpose(-2, -1)) * (scale or 1 / math.sqrt(q.size(-1)))  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    return 1e-6 * max(1.0, float(scores.abs().max()) / 2)


def _mask(kind: str, b: int, h: int, t: int, s: int) -> torch.Tensor | None:
    """A random boolean mask of ``kind`` (True = may attend), most rows with an allowed key."""
    shapes = {"keys (B,1,1,S)": (b, 1, 1, s), "queries (1,1,T,S)": (1, 1, t, s)}
    if kind == "none":
        return None
    mask = torch.rand(shapes.get(kind, (b, h, t, s))) > 0.3
    if kind == "rows fully blocked":
        mask[0, :, 0] = False  # batch row 0, every head: its first query sees nothing
        mask[-1, -1] = False  # the last head of the last row: no query sees anything
    return mask


def _bias(kind: str, b: int, h: int, t: int, s: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    return torch.randn((1, h, t, s) if kind == "heads (1,H,T,S)" else (b, h, t, s)) * 2


def _double(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.double()


def _distance(x: torch.Tensor, exact: torch.Tensor) -> float:
    return float((x.double() - exact).abs().max()) if x.numel() else 0.0


def _cases() -> Iterator[tuple[int, int, int, int, float | None]]:
    """(T, S, d_k, d_v, scale): query lengths 1 to 8 and the longest ones taken, by keys of 1,
    2, 17 and 64 (one vector, remainders of 8 keys and of 16 lanes), each with one of the nine
    pairs of a head size (8, 64, and a d_v other than d_k) and a scale (None, 1, 0.3), in turn."""
    sizes = [(8, 8), (64, 64), (64, 24)]
    pairs = [(d, d_v, scale) for d, d_v in sizes for scale in (None, 1.0, 0.3)]
    lengths = sorted({*range(1, min(8, MAX_T) + 1), MAX_T - 1, MAX_T} - {0})
    grid = [(t, s) for t in lengths for s in (1, 2, 17, 64)]
    for i, (t, s) in enumerate(grid):
        d, d_v, scale = pairs[i % len(pairs)]
        yield t, s, d, d_v, scale


@pytest.mark.parametrize("bias_kind", BIASES)
@pytest.mark.parametrize("mask_kind", MASKS)
@torch.no_grad()
def test_every_option_equals_the_reference(mask_kind: str, bias_kind: str, level: str) -> None:
    attend = _attend(level)
    torch.manual_seed(MASKS.index(mask_kind) * 3 + BIASES.index(bias_kind))
    b, h = 2, 3
    errors = []  # (kernel, reference) distance to the same computation in fp64
    for t, s, d, d_v, scale in _cases():
        q, k, v = torch.randn(b, h, t, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d_v)
        mask, bias = _mask(mask_kind, b, h, t, s), _bias(bias_kind, b, h, t, s)
        got = attend(q, k, v, mask, bias, scale, SERIAL)
        want = _reference(q, k, v, mask, bias=bias, scale=scale)
        assert got.shape == (b, h, t, d_v) and torch.isfinite(got).all()
        atol = _atol(q, k, bias, scale)
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-5, msg=f"{(t, s, d, d_v, scale)}")
        exact = _reference(
            q.double(), k.double(), v.double(), mask, bias=_double(bias), scale=scale
        )
        errors.append((_distance(got, exact), _distance(want, exact)))
        if mask is not None:  # a row without keys is exactly zero
            blocked = ~mask.expand(b, h, t, s).any(-1)  # (B, H, T)
            assert torch.all(got[blocked] == 0)
    native, reference = (max(e) for e in zip(*errors, strict=True))
    # as close to the fp64 result as the reference is, within its own summation-order error:
    # under ATEN_CPU_CAPABILITY=avx2 the reference's error fell to 4.0e-6 while the AVX2 build's
    # was 5.7e-6 on one case ("rows fully blocked", full bias)
    assert native <= 2 * reference + 1e-6


@torch.no_grad()
def test_one_query_over_two_keys_by_hand(level: str) -> None:
    attend = _attend(level)
    q = torch.tensor([[[[6.0, 0.0, 0.0, 0.0]]]])  # scores [3, 2] once divided by √d_k = 2
    k = torch.tensor([[[[1.0, 0, 0, 0], [2 / 3, 0, 0, 0]]]])
    v = torch.tensor([[[[1.0, 0, 0, 0], [0.0, 1, 0, 0]]]])
    e = math.exp(1.0)
    want = torch.tensor([[[[e / (e + 1), 1 / (e + 1), 0.0, 0.0]]]])
    torch.testing.assert_close(attend(q, k, v, None, None, None, SERIAL), want)
    blocked = torch.tensor([False, True])  # only the second key: its value exactly
    torch.testing.assert_close(attend(q, k, v, blocked, None, None, SERIAL), v[:, :, 1:])
    bias = torch.tensor([0.0, 1.0])  # scores [3, 3]: the mean of the two values
    torch.testing.assert_close(attend(q, k, v, None, bias, None, SERIAL), v.mean(2, keepdim=True))


@torch.no_grad()
def test_strided_views_as_decoding_passes_them(level: str) -> None:
    """Keys and values narrowed out of a (2, B, H, C, d_k) cache, the query a view of a fused
    projection, cross-attention's transposed (b, H, G, d_k) queries, and keys whose last
    dimension is not contiguous (copied by the kernel)."""
    attend = _attend(level)
    torch.manual_seed(1)
    b, h, d, capacity = 3, 4, 16, 40
    cache = torch.randn(2, b, h, capacity, d)  # (2, B, H, C, d_k)
    for length in (1, 9, 40):
        keys, values = cache.narrow(3, 0, length).unbind(0)  # 2 × (B, H, L, d_k), stride C·d_k
        qkv = torch.randn(b, 3 * h * d)
        query = qkv[:, : h * d].view(b, h, 1, d)  # (B, H, 1, d_k), rows 3·H·d_k apart
        mask = torch.rand(b, 1, 1, length) > 0.2
        got = attend(query, keys, values, mask, None, None, SERIAL)
        torch.testing.assert_close(got, _reference(query, keys, values, mask), atol=1e-6, rtol=1e-5)
    beams = torch.randn(b, 4, h, d).transpose(1, 2)  # (b, G, H, d_k) -> (b, H, G, d_k)
    keys_t = torch.randn(b, h, d, 17).transpose(-2, -1)  # (B, H, S, d_k), last stride 17
    values = torch.randn(b, h, 17, d)
    got = attend(beams, keys_t, values, None, None, 0.3, SERIAL)
    want = _reference(beams, keys_t, values, None, scale=0.3)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_the_parallel_branch_computes_each_head_as_the_serial_one(level: str) -> None:
    attend = _attend(level)
    torch.manual_seed(2)
    b, h, t, s, d = 32, 8, 2, 40, 64  # 256 heads
    q, k, v = torch.randn(b, h, t, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    mask, bias = _mask("rows fully blocked", b, h, t, s), _bias("heads (1,H,T,S)", b, h, t, s)
    serial = attend(q, k, v, mask, bias, None, SERIAL)
    shared = attend(q, k, v, mask, bias, None, 0)  # every head its own work unit
    assert torch.equal(serial, shared)
    torch.testing.assert_close(serial, _reference(q, k, v, mask, bias=bias), atol=1e-6, rtol=1e-5)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, level: str) -> list[int]:
    """Counts the calls scaled_dot_product_attention makes to aiayn's kernel (the build of
    ``level``, whose class is in force for the test)."""
    attend, counted = _attend(level), []

    def spy(*args: Any) -> Any:
        counted.append(1)
        return attend(*args)

    monkeypatch.setattr(sdp, "native_attend", lambda: spy)
    return counted


def test_decoding_calls_take_the_kernel_and_equal_the_reference(calls: list[int]) -> None:
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    mask = torch.tensor([[True] * 6, [False] * 6]).view(2, 1, 1, 6)  # row 1 sees nothing
    bias = torch.randn(1, 4, 1, 6)
    with torch.no_grad():
        for m, b in ((None, None), (mask, None), (mask, bias), (CAUSAL, bias)):
            got, weights = scaled_dot_product_attention(q, k, v, m, bias=b)
            want = _reference(q, k, v, m, bias=b)
            assert weights is None and torch.isfinite(got).all()
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert len(calls) == 4
    beams = torch.randn(2, 4, 3, 8)  # three queries over more keys: a sentence's beams
    grad_free, _ = scaled_dot_product_attention(beams, k, v, mask)  # grad mode on, none needed
    assert len(calls) == 5
    torch.testing.assert_close(grad_free, _reference(beams, k, v, mask), atol=1e-6, rtol=1e-5)


def test_other_options_keep_the_other_paths(calls: list[int]) -> None:
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    long_q, long_k = torch.randn(2, 4, MAX_T + 1, 8), torch.randn(2, 4, MAX_T + 8, 8)
    with torch.no_grad():
        scaled_dot_product_attention(q, k, v, need_weights=True)
        scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        scaled_dot_product_attention(long_q, long_k, long_k)  # more queries than it takes
        scaled_dot_product_attention(q, q, q)  # T = S: a whole sequence
        shared, _ = scaled_dot_product_attention(q, k[0], v[0])  # (H, S, d): broadcast by @
        scaled_dot_product_attention(q.double(), k.double(), v.double())
        scaled_dot_product_attention(q, k, v, CAUSAL)  # T > 1: built or the causal kernel
        scaled_dot_product_attention(q, k, v, bias=torch.randn(1, 4, 3, 6).double())
        with performance_settings(native_attention_max_queries=0):
            off, _ = scaled_dot_product_attention(q, k, v)
        with pytest.raises(TypeError, match="boolean"):
            scaled_dot_product_attention(q, k, v, torch.ones(1, 1, 3, 6))
    assert calls == []
    q.requires_grad_(True)
    out, _ = scaled_dot_product_attention(q, k, v)  # a gradient is needed: not the kernel
    out.sum().backward()
    assert calls == [] and q.grad is not None
    torch.testing.assert_close(off, _reference(q.detach(), k, v, None), atol=1e-6, rtol=1e-5)
    want = _reference(q.detach(), k[0], v[0], None)
    torch.testing.assert_close(shared, want, atol=1e-6, rtol=1e-5)


def test_it_builds_where_the_cpu_and_a_compiler_allow() -> None:
    has_avx2 = cpu_has("avx2") and cpu_has("fma")
    if not has_avx2 or shutil.which("c++") is None or os.environ.get(SWITCH) == "0":
        pytest.skip(f"no AVX2 and FMA, no C++ compiler, or {SWITCH}=0 here")
    if not cpu.at_least("avx2"):
        pytest.skip(f"the CPU class is capped to {cpu.level()} ({cpu.CAP})")
    assert native_attention() is not None, native_attention_unavailable()
    assert native_attend() is not None
    assert variant_name() == ("attend" if cpu.at_least("avx512") else "attend_avx2")


def test_the_cpu_class_picks_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Capped to avx2, the AVX2 build runs; capped to generic, none does, and attention takes
    the other paths with the reference's result."""
    with cpu.capped("avx2") as in_force:
        if in_force != "avx2":
            pytest.skip(f"this CPU's class is {in_force}, below avx2")
        attend = _attend()  # built here, or skipped
        assert attend is torch.ops.aiayn_attention.attend_avx2.default
        assert variant_name() == "attend_avx2" and native_attention() is not None
    asked: list[Any] = []  # what scaled_dot_product_attention got from native_attend

    def spy() -> Any:
        asked.append(native_attend())
        return asked[-1]

    monkeypatch.setattr(sdp, "native_attend", spy)
    torch.manual_seed(5)
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    mask = torch.tensor([[True] * 6, [False] * 6]).view(2, 1, 1, 6)  # row 1 sees nothing
    with cpu.capped("generic"), torch.no_grad():
        assert native_attend() is None and variant_name() is None
        assert native_attention() is None and "generic" in str(native_attention_unavailable())
        got, _ = scaled_dot_product_attention(q, k, v, mask)
    assert asked == [None]  # it asked, and ran the other paths
    torch.testing.assert_close(got, _reference(q, k, v, mask), atol=1e-6, rtol=1e-5)
    assert torch.all(got[1] == 0)


def test_turned_off_by_the_switch_attention_runs_as_before() -> None:
    """With AIAYN_NATIVE=0 nothing is built and attention takes the other paths."""
    script = (
        "import torch\n"
        "from aiayn.attention import scaled_dot_product_attention as sdpa\n"
        "from aiayn.kernels.attention import native_attention, native_attention_unavailable\n"
        "torch.manual_seed(0)\n"
        "q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)\n"
        "with torch.no_grad():\n"
        "    got, _ = sdpa(q, k, v)\n"
        "    want, _ = sdpa(q, k, v, need_weights=True)\n"
        "assert native_attention() is None\n"
        "torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)\n"
        "print(native_attention_unavailable())\n"
    )
    src = str(Path(sdp.__file__).resolve().parents[2])
    env = {**os.environ, SWITCH: "0", "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"{SWITCH}=0" in done.stdout
