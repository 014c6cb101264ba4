"""Transformer: documented shapes, tying, incremental decoding, and properties (hypothesis):
causality, padding invariance, permutation equivariance without positions, no NaN on padding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aiayn.config import TransformerConfig, preset
from aiayn.models import Transformer
from aiayn.models.params import count_parameters, expected_parameter_count

PAD = 0
TINY = preset("tiny", vocab_size=50, dropout=0.0, d_model=32, d_ff=64, num_heads=4)


def _model(config: TransformerConfig, **changes: object) -> Transformer:
    torch.manual_seed(0)
    return Transformer(config.replace(**changes) if changes else config).eval()


def _tokens(draw: st.DrawFn, n: int, vocab: int) -> list[int]:
    return draw(st.lists(st.integers(1, vocab - 1), min_size=n, max_size=n))


def test_shapes_and_log_probs(tiny_config: TransformerConfig) -> None:
    model = _model(tiny_config)
    src, tgt = torch.randint(1, 50, (3, 7)), torch.randint(1, 50, (3, 5))
    logp = model(src, tgt)
    assert logp.shape == (3, 5, 50)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(3, 5))
    enc = model.encode(src, need_weights=True)
    assert enc.memory.shape == (3, 7, 32)
    assert enc.self_weights is not None and len(enc.self_weights) == 2
    assert enc.self_weights[0].shape == (3, 4, 7, 7)
    dec = model.decode(tgt, enc.memory, model.source_mask(src), need_weights=True)
    assert dec.hidden.shape == (3, 5, 32)
    assert dec.cross_weights is not None and dec.cross_weights[0].shape == (3, 4, 5, 7)
    assert dec.self_weights is not None and dec.self_weights[0].shape == (3, 4, 5, 5)
    assert torch.all(dec.self_weights[0].triu(1) == 0)  # nothing above the diagonal


def test_shared_and_tied_embeddings(tiny_config: TransformerConfig) -> None:
    model = _model(tiny_config)
    assert model.encoder.embedder.embedding is model.decoder.embedder.embedding
    assert model.output_proj.weight is model.decoder.embedder.embedding.weight
    untied = _model(tiny_config, share_embeddings=False, tie_output=False)
    assert untied.encoder.embedder.embedding is not untied.decoder.embedder.embedding
    assert untied.output_proj.weight is not untied.decoder.embedder.embedding.weight


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_equals_full_forward(
    tiny_config: TransformerConfig, norm_first: bool
) -> None:
    model = _model(tiny_config, norm_first=norm_first)
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, PAD, PAD]])
    tgt = torch.randint(3, 50, (2, 6))
    full = model(src, tgt)  # (B, T, V)
    src_mask = model.source_mask(src)
    memory = model.encode(src).memory
    cache = None
    for t in range(6):
        out = model.decode(
            tgt[:, t : t + 1], memory if t == 0 else None, src_mask, cache=cache, offset=t
        )
        cache = out.cache
        torch.testing.assert_close(
            model.log_probs(out.hidden)[:, 0], full[:, t], atol=1e-5, rtol=1e-5
        )


@given(data=st.data())
def test_causality(data: st.DataObject) -> None:
    """Changing target tokens after position t leaves outputs at positions ≤ t unchanged."""
    model = _model(TINY)
    t_len = data.draw(st.integers(2, 8))
    t = data.draw(st.integers(0, t_len - 2))
    src = torch.tensor([_tokens(data.draw, 5, 50)])
    tgt = torch.tensor([_tokens(data.draw, t_len, 50)])
    changed = tgt.clone()
    changed[0, t + 1 :] = torch.tensor(_tokens(data.draw, t_len - t - 1, 50))
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-5, rtol=1e-5)


@given(data=st.data())
def test_padding_invariance(data: st.DataObject) -> None:
    """Adding padding to a batch leaves the outputs at real positions unchanged."""
    model = _model(TINY)
    s_len, t_len = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7))
    extra_s, extra_t = data.draw(st.integers(1, 5)), data.draw(st.integers(0, 5))
    src = torch.tensor([_tokens(data.draw, s_len, 50)])
    tgt = torch.tensor([_tokens(data.draw, t_len, 50)])
    src_padded = torch.cat([src, torch.full((1, extra_s), PAD)], dim=1)
    tgt_padded = torch.cat([tgt, torch.full((1, extra_t), PAD)], dim=1)
    with torch.no_grad():
        plain = model(src, tgt)
        padded = model(src_padded, tgt_padded)[:, :t_len]
        mem_plain = model.encode(src).memory
        mem_padded = model.encode(src_padded).memory[:, :s_len]
    torch.testing.assert_close(plain, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mem_plain, mem_padded, atol=1e-5, rtol=1e-5)


@given(perm_seed=st.integers(0, 10_000), length=st.integers(2, 9))
def test_encoder_without_positions_is_permutation_equivariant(perm_seed: int, length: int) -> None:
    model = _model(TINY, positional="none")
    gen = torch.Generator().manual_seed(perm_seed)
    src = torch.randint(1, 50, (2, length), generator=gen)
    perm = torch.randperm(length, generator=gen)
    with torch.no_grad():
        memory = model.encode(src).memory
        memory_perm = model.encode(src[:, perm]).memory
    torch.testing.assert_close(memory_perm, memory[:, perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@given(rows=st.integers(1, 3))
def test_all_padding_rows_give_no_nan(dtype: torch.dtype, rows: int) -> None:
    model = _model(TINY).to(dtype)
    src = torch.randint(1, 50, (rows + 1, 6))
    src[1:] = PAD  # whole sentences of padding
    tgt = torch.randint(1, 50, (rows + 1, 4))
    tgt[1:] = PAD
    with torch.no_grad():
        logp = model(src, tgt)
        memory = model.encode(src).memory
    assert torch.isfinite(logp).all() and torch.isfinite(memory).all()


MARIAN_OPTIONS = {
    "activation": "silu",
    "positional": "sinusoidal-halves",
    "output_bias": True,
    "share_embeddings": False,
    "tgt_vocab_size": 40,
}


@pytest.mark.parametrize("tie_output", [True, False])
def test_marian_options_incremental_decoding_equals_full_forward(tie_output: bool) -> None:
    """SiLU, sinusoids in halves, an output bias, separate vocabularies, and a decoder whose
    start token is the pad id (Marian's): the decoding paths agree."""
    model = _model(TINY, **MARIAN_OPTIONS, tie_output=tie_output)
    assert model.output_proj.bias is not None and not model.output_proj.bias.any()  # zero init
    with torch.no_grad():
        model.output_proj.bias.normal_()
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, PAD, PAD]])
    tgt = torch.randint(3, 40, (2, 6))
    tgt[:, 0] = PAD  # the start token has the pad id
    full = model(src, tgt)  # (B, T, V)
    assert full.shape == (2, 6, 40)
    src_mask, memory, cache = model.source_mask(src), model.encode(src).memory, None
    for t in range(6):
        out = model.decode(
            tgt[:, t : t + 1], memory if t == 0 else None, src_mask, cache=cache, offset=t
        )
        cache = out.cache
        torch.testing.assert_close(
            model.log_probs(out.hidden)[:, 0], full[:, t], atol=1e-5, rtol=1e-5
        )
    hidden = model.decode(tgt, memory, src_mask).hidden
    logits = hidden @ model.output_proj.weight.T + model.output_proj.bias
    torch.testing.assert_close(full, torch.log_softmax(logits, -1), atol=1e-5, rtol=1e-5)


def test_start_token_is_never_masked_as_padding() -> None:
    model = _model(TINY)
    tgt = torch.tensor([[PAD, 5, 6, PAD], [7, 8, PAD, PAD]])
    mask = model.target_mask(tgt)  # (B, 1, T, T)
    assert mask.shape == (2, 1, 4, 4)
    assert mask[..., 0].all()  # position 0, the start token, is a real key for every query
    assert not mask[0, 0, 3, 3] and not mask[1, 0, 3, 2]  # later padding stays masked
    assert mask[0, 0, 2, :3].all() and not mask[0, 0, 2, 3]  # causal


@pytest.mark.parametrize("tie_output", [True, False])
def test_output_bias_is_counted(tie_output: bool) -> None:
    for output_bias in (False, True):
        config = TINY.replace(output_bias=output_bias, tie_output=tie_output)
        model = _model(config)
        assert (model.output_proj.bias is not None) == output_bias
        assert count_parameters(model) == expected_parameter_count(config)
