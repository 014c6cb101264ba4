"""The performance settings: overridden for a block and restored, and every threshold choosing
between kernels that compute the same thing (either side of it gives the same result)."""

from __future__ import annotations

import pytest
import torch

from aiayn.attention import scaled_dot_product_attention
from aiayn.decoding.beam import top_candidates
from aiayn.inference import PackedLinear, packing_available
from aiayn.settings import PerformanceSettings, performance, performance_settings


def test_an_override_holds_inside_its_block_only() -> None:
    default = performance()
    assert default == PerformanceSettings()
    with performance_settings(topk_chunk=7) as inside:
        assert performance() is inside and inside.topk_chunk == 7
        assert inside.small_product_max_macs == default.small_product_max_macs
    assert performance() is default
    with pytest.raises(TypeError, match="no_such_field"), performance_settings(no_such_field=1):
        pass
    assert performance() is default


@torch.no_grad()
def test_attention_is_the_same_on_either_side_of_its_cut_offs() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(32, 4, 4, 64), torch.randn(32, 4, 24, 64), torch.randn(32, 4, 24, 64)
    mask = torch.rand(32, 1, 1, 24) > 0.2
    explicit = {"explicit_attention_min_rows": 0, "explicit_attention_min_folded_rows": 0}
    fused = {"explicit_attention_max_queries": 0}
    off = {"native_attention_max_queries": 0}  # aiayn's kernel: test_attention_kernel.py
    with performance_settings(**explicit, **off):
        want, _ = scaled_dot_product_attention(q, k, v, mask)
    with performance_settings(**fused, **off):
        got, _ = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for min_macs in (0, 1 << 62):  # its heads on every thread, on one
        with performance_settings(native_attention_min_parallel_macs=min_macs):
            got, _ = scaled_dot_product_attention(q, k, v, mask)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_beam_candidates_are_the_same_chunked_or_not() -> None:
    torch.manual_seed(0)
    candidates = torch.randn(3, 4 * 5000)  # 3 sentences, beam 4, vocabulary 5,000
    with performance_settings(chunked_topk_min_candidates=1):
        chunked = top_candidates(candidates, 8)
    with performance_settings(chunked_topk_min_candidates=1 << 30):
        whole = top_candidates(candidates, 8)
    assert torch.equal(chunked[0], whole[0]) and torch.equal(chunked[1], whole[1])


@pytest.mark.skipif(not packing_available(), reason="PyTorch built without oneDNN")
@torch.no_grad()
def test_linear_layers_are_the_same_on_either_kernel() -> None:
    layer = torch.nn.Linear(64, 48)
    x = torch.randn(3, 64)
    with performance_settings(small_product_max_macs=0):
        packed = PackedLinear(layer)
        assert not packed.has_dense
        want = packed(x)
    with performance_settings(small_product_max_macs=1 << 30):
        dense = PackedLinear(layer)
        assert dense.has_dense
        got = dense(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_every_setting_is_read_from_the_environment_and_bad_values_refused() -> None:
    from aiayn.errors import ConfigError
    from aiayn.settings import PerformanceSettings, from_environment

    got = from_environment(
        {"AIAYN_INT8_NATIVE_MAX_ROWS": "64", "AIAYN_KERNEL_BUILD_TIMEOUT_S": "9.5"}
    )
    assert got == PerformanceSettings(int8_native_max_rows=64, kernel_build_timeout_s=9.5)
    assert from_environment({"AIAYN_UNRELATED": "x"}) == PerformanceSettings()
    for text, why in (("1.5", "not an integer"), ("-1", "at least 0"), ("nan", "not an integer")):
        with pytest.raises(ConfigError, match=f"AIAYN_INT8_NATIVE_MAX_ROWS={text!r}: .*{why}"):
            from_environment({"AIAYN_INT8_NATIVE_MAX_ROWS": text})
    with pytest.raises(ConfigError, match="finite"):
        from_environment({"AIAYN_KERNEL_BUILD_TIMEOUT_S": "inf"})
