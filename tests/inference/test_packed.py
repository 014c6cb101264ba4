"""oneDNN-packed inference copies: same outputs as the model they copy, which stays unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import aiayn.inference.kernels as kernels_module
import aiayn.inference.packed as packed_module
from aiayn.config import preset
from aiayn.decoding import beam_search, encoder_decoder_step, greedy_search
from aiayn.inference import PackedLinear, pack_for_inference, packing_available
from aiayn.inference.kernels import POST_OPS
from aiayn.inference.packed import step_weight_bytes
from aiayn.kernels.linear import native_fp32, native_fp32_unavailable
from aiayn.layers import ACTIVATIONS
from aiayn.models import Transformer
from aiayn.settings import performance_settings

pytestmark = pytest.mark.skipif(not packing_available(), reason="PyTorch built without oneDNN")
PAD, BOS, EOS = 0, 1, 2


def _model() -> Transformer:
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=40, d_model=32, d_ff=64, num_heads=4, dropout=0.0)
    return Transformer(config).eval()


def test_packed_linear_matches_f_linear_whole_and_by_row_blocks() -> None:
    layer = nn.Linear(16, 48)
    packed = PackedLinear(layer, (slice(0, 16), slice(16, 48)))
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), layer(x), atol=1e-5, rtol=1e-5)
        want = nn.functional.linear(x, layer.weight[16:], layer.bias[16:])
        torch.testing.assert_close(packed(x, slice(16, 48)), want, atol=1e-5, rtol=1e-5)
        with pytest.raises(KeyError, match="not packed"):
            packed(x, slice(0, 8))
    with pytest.raises(RuntimeError, match="inference"):
        packed(x.requires_grad_())


def test_packed_copy_gives_the_same_log_probs_and_leaves_the_model_alone() -> None:
    model = _model()
    packed = pack_for_inference(model)
    assert packed is not model
    assert all(type(m) is not PackedLinear for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())  # only the copy is frozen
    assert not any(p.requires_grad for p in packed.parameters())
    kinds = [type(m) for m in packed.modules()]
    assert nn.Linear not in kinds and PackedLinear in kinds
    src = torch.tensor([[5, 6, 7, EOS], [8, 9, EOS, PAD]])
    tgt = torch.tensor([[BOS, 11, 12], [BOS, 13, 14]])
    with torch.no_grad():
        torch.testing.assert_close(packed(src, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_packed_copy_decodes_the_same_tokens(beam: int) -> None:
    model = _model()
    src = torch.randint(3, 40, (4, 7))
    src[:, -1] = EOS

    def decode(m: Transformer) -> list:
        step, state = encoder_decoder_step(m, src)
        if beam == 1:
            return greedy_search(step, state, bos_id=BOS, eos_id=EOS, max_len=10, batch_size=4)
        hyps = beam_search(
            step, state, batch_size=4, beam_size=beam, bos_id=BOS, eos_id=EOS, max_len=10
        )
        return [[h.tokens for h in sentence] for sentence in hyps]

    # no torch.no_grad: the packed copy's parameters do not require grad, so its encoder runs
    assert decode(pack_for_inference(model)) == decode(model)


def test_packing_does_not_apply_off_cpu_fp32() -> None:
    model = _model().to(torch.bfloat16)
    assert pack_for_inference(model) is model


def test_one_row_inputs_of_small_layers_match_too() -> None:
    layer = nn.Linear(16, 48)  # small: the product goes through F.linear
    packed = PackedLinear(layer, (slice(16, 48),))
    x = torch.randn(1, 1, 16)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), layer(x), atol=1e-6, rtol=1e-6)
        want = nn.functional.linear(x, layer.weight[16:], layer.bias[16:])
        torch.testing.assert_close(packed(x, slice(16, 48)), want, atol=1e-6, rtol=1e-6)


def test_packed_attention_layers_project_every_block_they_use() -> None:
    from aiayn.attention import CrossAttention, MultiHeadAttention, SelfAttention, causal_mask

    torch.manual_seed(0)
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    value = torch.randn(2, 5, 32)
    cases = [
        (SelfAttention(32, 4), (x, causal_mask(3))),
        (CrossAttention(32, 4), (x, memory)),
        (MultiHeadAttention(32, 4), (x, memory, value)),  # key is not value: K and V apart
    ]
    for layer, args in cases:
        layer.eval()
        with torch.no_grad():
            want = layer(*args).output
            got = pack_for_inference(layer)(*args).output
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_small_product_rule_follows_the_step_weights_against_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model()
    c = model.config
    # decoder: 12·D² weights per layer (self 4D², cross 4D², FFN 2·D·d_ff = 4D² for d_ff = 2D), the
    # output projection, tied to the embedding and counted once; the encoder is not counted
    want = 4 * (c.num_decoder_layers * 12 * c.d_model**2 + c.target_vocab_size * c.d_model)
    assert c.d_ff == 2 * c.d_model and step_weight_bytes(model) == want

    def dense_layers(m: nn.Module) -> int:
        return sum(isinstance(x, PackedLinear) and x.has_dense for x in m.modules())

    monkeypatch.setattr(packed_module, "last_level_cache_bytes", lambda: 2 * want)  # half
    assert dense_layers(pack_for_inference(model)) > 0
    monkeypatch.setattr(packed_module, "last_level_cache_bytes", lambda: 2 * want - 1)  # more
    streamed = pack_for_inference(model)
    assert dense_layers(streamed) == 0
    assert dense_layers(pack_for_inference(model, dense_small=True)) > 0

    src = torch.randint(3, 40, (1, 7))  # one sentence, greedy: one-row products throughout
    src[:, -1] = EOS

    def decode(m: Transformer) -> list:
        step, state = encoder_decoder_step(m, src)
        return greedy_search(step, state, bos_id=BOS, eos_id=EOS, max_len=10, batch_size=1)

    with torch.no_grad():
        assert decode(streamed) == decode(model)


def test_small_products_take_pytorchs_kernel_up_to_2_to_the_18(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def counting_linear(x: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        calls.append(x.size(0))
        return nn.functional.linear(x, *args)

    monkeypatch.setattr(kernels_module, "F", SimpleNamespace(linear=counting_linear))
    layer = nn.Linear(64, 64)
    with performance_settings(fp32_native_max_rows=0):  # no fp32 kernel of aiayn's first
        dense, packed = PackedLinear(layer), PackedLinear(layer, dense_small=False)
    with torch.no_grad():
        for rows in (1, 64, 65):  # 64 · 64 · 64 = 2^18 multiply–adds: the last dense product
            x = torch.randn(rows, 64)
            torch.testing.assert_close(dense(x), layer(x), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(packed(x), layer(x), atol=1e-5, rtol=1e-5)
    assert calls == [1, 64]
    assert not PackedLinear(nn.Linear(512, 513)).has_dense  # over 2^18 at any row count


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9])
def test_aiayns_fp32_kernel_takes_a_few_rows_with_every_epilogue(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to ``fp32_native_max_rows`` rows (4 here) run on aiayn's fp32 kernel, more on
    oneDNN's: both give F.linear's values (summation order only) for the whole weight and a
    block of its rows, with every activation and with the residual addition."""
    if native_fp32() is None:
        pytest.skip(f"aiayn's fp32 kernel: {native_fp32_unavailable()}")
    calls: list[int] = []
    real = kernels_module.NativeFp32.__call__

    def counting(
        self: kernels_module.NativeFp32, x: torch.Tensor, *rest: torch.Tensor
    ) -> torch.Tensor:
        calls.append(x.size(0))
        return real(self, x, *rest)

    monkeypatch.setattr(kernels_module.NativeFp32, "__call__", counting)
    layer = nn.Linear(40, 72)
    with performance_settings(fp32_native_max_rows=4):
        packed = PackedLinear(layer, (slice(0, 24),), dense_small=False)
        x, residual = torch.randn(rows, 40), torch.randn(rows, 72)
        with torch.no_grad():
            for block in (None, slice(0, 24)):
                part = slice(None) if block is None else block
                kernel = packed.kernel(block)
                want = nn.functional.linear(x, layer.weight[part], layer.bias[part])
                close = {"atol": 1e-5, "rtol": 1e-5}
                torch.testing.assert_close(kernel(x), want, **close)
                for name in POST_OPS:
                    torch.testing.assert_close(
                        kernel.activated(x, name), ACTIVATIONS[name](want), **close
                    )
                got = kernel.add(x, residual[:, part])
                torch.testing.assert_close(got, want + residual[:, part], **close)
            three = packed(x[None])  # (1, N, D_in): leading dimensions flattened
            torch.testing.assert_close(three[0], layer(x), atol=1e-5, rtol=1e-5)
    assert len(calls) == (2 * (2 + len(POST_OPS)) + 1 if rows <= 4 else 0)


def test_without_aiayns_fp32_kernel_no_copy_of_the_weight_is_kept() -> None:
    with performance_settings(fp32_native_max_rows=0):
        assert PackedLinear(nn.Linear(8, 8)).kernel().native is None
