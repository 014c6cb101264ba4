"""The flattened inference step against the model's own modules and its full forward pass.

(The searches run on it too: see test_search.py.)
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from aiayn.config import preset
from aiayn.decoding import (
    InferenceState,
    InferenceStep,
    beam_search,
    encoder_decoder_step,
    greedy_search,
    inference_step,
)
from aiayn.decoding.translate import DecodeOptions, translate_ids
from aiayn.inference import pack_for_inference, packing_available
from aiayn.inference.encoder import EncoderInference
from aiayn.layers import CrossAttentionBlock
from aiayn.models import Transformer

PAD, BOS, EOS = 0, 1, 2
V = 30
REAL = [v for v in range(V) if v not in (PAD, BOS)]  # PAD and BOS are banned outputs

VARIANTS = {
    "paper: post-norm, ReLU, sinusoids": {},
    "pre-norm, GELU, learned positions": {
        "norm_first": True,
        "activation": "gelu",
        "positional": "learned",
    },
    "no positions, untied output, separate vocabularies": {
        "positional": "none",
        "share_embeddings": False,
        "tie_output": False,
        "tgt_vocab_size": V,
    },
}
KERNELS = ["PyTorch", "packed", "packed, oneDNN throughout"]


def _model(kernels: str = "PyTorch", seed: int = 0, **overrides: object) -> Transformer:
    torch.manual_seed(seed)
    config = preset("tiny", vocab_size=V, d_model=32, d_ff=64, num_heads=4, dropout=0.0)
    model = Transformer(config.replace(**overrides)).eval()
    if kernels == "PyTorch":
        return model
    if not packing_available():
        pytest.skip("this PyTorch build has no oneDNN linear kernels")
    return pack_for_inference(model, dense_small=kernels == "packed")


def _sources(rows: int) -> torch.Tensor:
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD], [11, 12, 13, EOS, PAD]])
    return src[:rows]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("rows", [3, 1], ids=["padded", "unpadded"])
def test_step_logits_equal_the_full_forward_pass(variant: str, kernels: str, rows: int) -> None:
    model, src = _model(kernels, **VARIANTS[variant]), _sources(rows)
    tgt = torch.randint(3, V, (rows, 9))
    tgt[:, 0] = BOS
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
    step, state = inference_step(model, src, capacity=2)  # the cache grows twice on the way
    assert isinstance(state, InferenceState)
    assert state.sources.lengths.tolist() == [5, 3, 4][:rows]  # each source's real tokens
    for t in range(9):
        log_probs, state = step(tgt[:, t : t + 1], state)
        torch.testing.assert_close(log_probs[:, REAL], full[:, t, REAL], atol=1e-5, rtol=1e-5)
        assert torch.all(log_probs[:, [PAD, BOS]] == -torch.inf)


@pytest.mark.parametrize("kernels", KERNELS)
@torch.no_grad()
def test_beam_reorders_match_the_module_step(kernels: str) -> None:
    """Beams of three sentences reordered within sentences, across sentences, sentences leaving,
    and rows of different sentences mixed in one group: the same log-probabilities as the
    module step at every step."""
    model, src = _model(kernels), _sources(3)
    reorders = [
        [1, 0, 3, 3, 5, 4],
        [0, 1, 2, 3, 4, 5],
        [4, 5, 0, 1, 2, 3],
        [2, 3, 4, 5],  # the first sentence leaves
        [1, 2, 0, 3],  # a group mixes sentences: one source row per decoder row from here
        [3, 0],
    ]
    steps = [encoder_decoder_step(model, src), inference_step(model, src, capacity=1)]
    states = [state.repeat_interleave(2) for _, state in steps]
    tokens = torch.randint(3, V, (6, 1))
    for rows in reorders:
        out = []
        for i, (step, _) in enumerate(steps):
            log_probs, states[i] = step(tokens, states[i])
            out.append(log_probs)
        torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-5)
        index = torch.tensor(rows)
        states = [state.index_select(index) for state in states]
        tokens = torch.randint(3, V, (len(rows), 1))


@torch.no_grad()
def test_a_selection_copies_only_the_beams_continued_twice() -> None:
    """Beam search's selection keeps each picked row's slot; a row picked a second time gets a
    free slot with a copy of its columns; the slots nobody picks are freed."""
    model = _model()
    step, state = inference_step(model, _sources(3), capacity=4)
    state = state.repeat_interleave(2)  # 6 rows: 2 beams per sentence
    for _ in range(2):
        _, state = step(torch.randint(3, V, (6, 1)), state)
    assert isinstance(state, InferenceState)
    pool, rows = state.slots.pool, state.slots.rows.clone()
    before = pool.buffer.clone()
    free = pool.free
    index = torch.tensor([5, 4, 1, 1])  # sentences 2 and 0, beams reordered, row 1 twice
    picked = state.index_select(index)
    assert isinstance(picked, InferenceState)
    got = picked.slots.rows.tolist()
    assert got[:3] == rows[[5, 4, 1]].tolist() and got[3] not in got[:3]
    assert pool.free == free + 3 - 1  # rows 0, 2, 3 freed, one slot taken for the copy
    assert torch.equal(pool.buffer[:, :, got[3], :, :2], before[:, :, int(rows[1]), :, :2])
    assert picked.sources.rows.tolist() == state.sources.rows[index].tolist()
    assert state.sources.pool.free == 1  # sentence 1's source slot is freed


@torch.no_grad()
def test_rows_that_join_later_and_rows_that_leave_step_as_alone() -> None:
    """A sentence started two steps later joins the running rows (one pool, its own positions);
    then the first rows leave: every row's log-probs are the ones it gets alone."""
    model = _model()
    step = InferenceStep(model)
    pools = step.pools(2, 2, 2, 2)  # both grow on the way
    first = step.initial_state(_sources(2), pools=pools)
    tokens = torch.randint(3, V, (6, 3, 1))
    alone: list[torch.Tensor] = []
    _, late_alone = inference_step(model, _sources(3)[2:])
    for t in range(4):
        out, late_alone = step(tokens[t, 2:], late_alone)
        alone.append(out)
    for t in range(2):
        _, first = step(tokens[t, :2], first)
    late = step.initial_state(_sources(3)[2:], pools=pools)
    assert isinstance(first, InferenceState) and isinstance(late, InferenceState)
    both: object = InferenceState.concat([first, late])
    for t in range(2):
        out, both = step(torch.cat([tokens[2 + t, :2], tokens[t, 2:]]), both)  # type: ignore[arg-type]
        torch.testing.assert_close(out[2:], alone[t], atol=1e-5, rtol=1e-5)
    assert isinstance(both, InferenceState) and both.slots.lengths.tolist() == [4, 4, 2]
    left: object = both.index_select(torch.tensor([2]))
    for t in range(2, 4):
        out, left = step(tokens[t, 2:], left)  # type: ignore[arg-type]
        torch.testing.assert_close(out, alone[t], atol=1e-5, rtol=1e-5)


def test_positions_past_the_precomputed_table_are_computed() -> None:
    """max_len 4 precomputes 4 positions; sinusoids go on as the modules compute them."""
    model, src = _model(max_len=4), _sources(2)
    tgt = torch.randint(3, V, (2, 7))
    tgt[:, 0] = BOS
    with torch.no_grad():
        full = model(src, tgt)
    step, state = inference_step(model, src)
    for t in range(7):
        log_probs, state = step(tgt[:, t : t + 1], state)
        torch.testing.assert_close(log_probs[:, REAL], full[:, t, REAL], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_source_is_encoded_on_its_real_tokens_unless_a_hook_needs_the_module() -> None:
    """The encoder runs on the real tokens only (its output at the padding is zero, where the
    module's is not) and gives the module's states at every real token; with a forward hook on
    an encoder layer the module encodes, and the hook runs."""
    model, src = _model(), _sources(3)
    real = src != PAD  # (B, S)
    reference = model.encoder(src, real[:, None, None, :]).memory  # (B, S, D)
    step = InferenceStep(model)
    assert isinstance(step.encoder, EncoderInference)
    cross = model.decoder.layers[0].cross_attn

    def source_keys(state: object) -> torch.Tensor:
        assert isinstance(state, InferenceState)
        rows = state.sources
        return rows.pool.buffer[0, 0, rows.rows, :, :5].transpose(1, 2)  # (B, S, H, d_k)

    keys = source_keys(step.initial_state(src))
    module_keys = cross.project_key_value(reference).key.transpose(1, 2)  # (B, S, H, d_k)
    torch.testing.assert_close(keys[real], module_keys[real], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(keys[~real], module_keys[~real])  # padding: W^K's bias vs states
    seen: list[tuple[int, ...]] = []
    hook = model.encoder.layers[0].register_forward_hook(
        lambda m, i, o: seen.append(o.output.shape)
    )
    step = InferenceStep(model)
    assert step.encoder is None
    keys = source_keys(step.initial_state(src))
    torch.testing.assert_close(keys, module_keys)
    assert seen == [(3, 5, 32)]
    hook.remove()


def test_bad_uses_are_refused() -> None:
    model, src = _model(), _sources(1)
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        inference_step(model, src, capacity=0)
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        inference_step(model.train(), src)


class _MyLayer(CrossAttentionBlock):
    """A subclass: may compute anything."""


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_falls_back_to_the_module_step_for_a_part_it_does_not_compute(
    beam: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A decoder layer of a subclass: translate_ids decodes with the module step (the
    hypotheses a search over encoder_decoder_step gives), instead of failing, and says so once
    at debug level."""
    model = _model()
    base = model.decoder.layers[0]
    parts = (base.self_attn, base.cross_attn, base.feed_forward, torch.nn.LayerNorm)
    model.decoder.layers[0] = _MyLayer(*parts, norm_first=False, dropout=0.0).eval()
    tokenizer = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    sources = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]]
    options = DecodeOptions(beam_size=beam, n_best=beam, extra_len=3)  # packed where possible
    with caplog.at_level(logging.DEBUG, logger="aiayn.decoding.fast_step"):
        got = translate_ids(model, sources, tokenizer, options)  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records if r.name == "aiayn.decoding.fast_step"]
    assert len(said) == 1 and "CrossAttentionBlock, got _MyLayer" in said[0], said
    assert [r.levelno for r in caplog.records if r.name == "aiayn.decoding.fast_step"] == [
        logging.DEBUG
    ]
    with torch.no_grad():
        for ids, hyps in zip(sources, got, strict=True):
            step, state = encoder_decoder_step(model, torch.tensor([[*ids, EOS]]))
            kw = {"bos_id": BOS, "eos_id": EOS, "max_len": len(ids) + 3, "batch_size": 1}
            if beam == 1:
                assert [h.tokens for h in hyps] == greedy_search(step, state, **kw)  # type: ignore[arg-type]
                continue
            best = beam_search(step, state, beam_size=beam, n_best=beam, **kw)[0]  # type: ignore[arg-type]
            assert [h.tokens for h in hyps] == [h.tokens for h in best]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in best], abs=1e-5)


def test_the_step_carries_no_graph_outside_no_grad() -> None:
    """Built once (InferenceStep) and stepped with gradients enabled: no output requires grad
    although the model's parameters do."""
    model, src = _model(), _sources(2)
    assert all(p.requires_grad for p in model.parameters())
    step = InferenceStep(model)
    log_probs, state = step(torch.full((2, 1), BOS), step.initial_state(src))
    assert isinstance(state, InferenceState)
    assert not log_probs.requires_grad
    assert not state.sources.pool.buffer.requires_grad


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_decodes_with_it_as_the_module_step_would(
    beam: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """translate_ids (length batches, per-sentence limits, the inference step) gives each
    sentence the hypotheses a search over the module step gives it alone."""
    model = _model()
    tokenizer = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    sources = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]]
    options = DecodeOptions(beam_size=beam, n_best=beam, extra_len=3, pack=False)
    steps = 0
    inference_call = InferenceStep.__call__

    def counted(self: InferenceStep, *args: object) -> object:
        nonlocal steps
        steps += 1
        return inference_call(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(InferenceStep, "__call__", counted)
    got = translate_ids(model, sources, tokenizer, options)  # type: ignore[arg-type]
    assert steps > 0  # translate decoded with the inference step
    monkeypatch.undo()
    for ids, hyps in zip(sources, got, strict=True):
        step, state = encoder_decoder_step(model, torch.tensor([[*ids, EOS]]))
        limit = len(ids) + 3
        if beam == 1:
            want = greedy_search(step, state, bos_id=BOS, eos_id=EOS, max_len=limit, batch_size=1)
            assert [h.tokens for h in hyps] == want
            continue
        kw = {"bos_id": BOS, "eos_id": EOS, "max_len": limit, "n_best": beam}
        best = beam_search(step, state, batch_size=1, beam_size=beam, **kw)[0]  # type: ignore[arg-type]
        assert [h.tokens for h in hyps] == [h.tokens for h in best]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in best], abs=1e-5)
