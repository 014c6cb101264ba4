"""Greedy, beam search and sampling against hand-checkable and exhaustive references.

Every search test runs on both step functions: the model's modules
(:func:`encoder_decoder_step`) and the flattened inference step (:func:`inference_step`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from aiayn.config import preset
from aiayn.decoding import (
    InferenceState,
    StepFunction,
    beam,
    beam_search,
    encoder_decoder_step,
    filter_logits,
    gnmt_length_penalty,
    greedy_search,
    inference_step,
    sample,
)
from aiayn.decoding.beam import SteppedBeamSearch, top_candidates
from aiayn.decoding.step import DecoderState, banned_log_probs
from aiayn.models import Transformer
from aiayn.settings import performance_settings

PAD, BOS, EOS = 0, 1, 2
MakeStep = Callable[[Transformer, torch.Tensor], tuple[StepFunction, DecoderState]]


@pytest.fixture(
    params=[encoder_decoder_step, inference_step], ids=["module step", "inference step"]
)
def make_step(request: pytest.FixtureRequest) -> MakeStep:
    """Either step function: each search test runs on both."""
    return request.param  # type: ignore[no-any-return]


def _model(vocab: int = 20, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = preset("tiny", vocab_size=vocab, d_model=32, d_ff=64, num_heads=4, dropout=0.0)
    model = Transformer(config).eval()
    with torch.no_grad():  # sharper distributions than the initialisation gives
        model.output_proj.weight.mul_(4.0)
    return model


def _sources() -> torch.Tensor:
    return torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD], [11, 12, 13, EOS, PAD]])


def _beam(model: Transformer, src: torch.Tensor, k: int, make_step: MakeStep, **kw: object) -> list:
    step, state = make_step(model, src)
    return beam_search(
        step,
        state,
        batch_size=src.size(0),
        beam_size=k,
        bos_id=BOS,
        eos_id=EOS,
        **{"max_len": 12, **kw},
    )  # type: ignore[arg-type]


def _log_prob(model: Transformer, src: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens + EOS | src) from one teacher-forced forward pass."""
    tgt_in = torch.tensor([[BOS, *tokens]])
    gold = torch.tensor([[*tokens, EOS]])
    with torch.no_grad():
        log_probs = model(src, tgt_in)  # (1, T, V)
    return float(log_probs.gather(2, gold[:, :, None]).sum())


def test_banned_log_probs_hand_values() -> None:
    """Four equal logits, token 3 banned: the model's own −ln 4 for the rest, or renormalised
    over the three allowed tokens −ln 3; nothing banned: a plain log-softmax."""
    ban = torch.tensor([3])
    own = banned_log_probs(torch.zeros(1, 4), ban, renormalize=False)
    again = banned_log_probs(torch.zeros(1, 4), ban, renormalize=True)
    assert own[0, :3].tolist() == pytest.approx([-math.log(4)] * 3) and own[0, 3] == -math.inf
    assert again[0, :3].tolist() == pytest.approx([-math.log(3)] * 3) and again[0, 3] == -math.inf
    plain = banned_log_probs(torch.tensor([[0.0, math.log(3.0)]]), None, renormalize=True)
    assert plain[0].tolist() == pytest.approx([math.log(0.25), math.log(0.75)])


def test_length_penalty_hand_values() -> None:
    assert gnmt_length_penalty(1, 0.6) == 1.0  # ((5 + 1) / 6)^α
    assert gnmt_length_penalty(5, 0.6) == pytest.approx((10 / 6) ** 0.6)
    assert gnmt_length_penalty(7, 0.0) == 1.0


@pytest.mark.parametrize(("rows", "length", "n"), [(1, 32000, 8), (5, 20001, 6), (3, 16384, 2)])
def test_top_candidates_equal_topk(rows: int, length: int, n: int) -> None:
    """Long rows take the chunked path (lengths with and without a partial last chunk); values
    equal torch.topk's, and each index points at its value, with ties and −inf in the rows."""
    torch.manual_seed(rows)
    candidates = torch.randn(rows, length).round(decimals=2)  # many ties
    candidates[:, : length // 3] = -math.inf  # banned tokens, dead beams
    candidates[0, -1] = 10.0  # the best in the last chunk (a partial one at 20,001)
    values, index = top_candidates(candidates, n)
    want, _ = candidates.topk(n, dim=1)
    assert torch.equal(values, want)
    assert torch.equal(candidates.gather(1, index), values)
    assert all(len(set(row)) == n for row in index.tolist())  # n distinct elements
    assert index[0, 0] == length - 1


def test_beam_search_chunked_top_candidates_change_nothing(
    make_step: MakeStep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vocabulary large enough for the chunked path (K·V ≥ 2^14) gives the hypotheses that a
    plain topk gives."""
    model, src = _model(vocab=4500), torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    chunked = _beam(model, src, 4, make_step, n_best=4, max_len=8)
    monkeypatch.setattr(beam, "top_candidates", lambda x, n: x.topk(n, dim=1))
    assert _beam(model, src, 4, make_step, n_best=4, max_len=8) == chunked


def test_beam_size_one_equals_greedy(make_step: MakeStep) -> None:
    model, src = _model(), _sources()
    step, state = make_step(model, src)
    greedy = greedy_search(step, state, bos_id=BOS, eos_id=EOS, max_len=12, batch_size=3)
    beam = [h[0].tokens for h in _beam(model, src, 1, make_step)]
    assert beam == greedy
    assert any(len(g) > 0 for g in greedy)


@pytest.mark.parametrize("k", [1, 4])
def test_output_does_not_depend_on_batch_or_padding(k: int, make_step: MakeStep) -> None:
    model, src = _model(), _sources()
    together = _beam(model, src, k, make_step, n_best=k)
    for i in range(3):
        alone = src[i : i + 1, : int((src[i] != PAD).sum())]  # no padding at all
        single = _beam(model, alone, k, make_step, n_best=k)[0]
        assert [h.tokens for h in single] == [h.tokens for h in together[i]]
        for a, b in zip(single, together[i], strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-5)


def test_nbest_scores_are_length_normalised_log_probs(make_step: MakeStep) -> None:
    model, src = _model(), _sources()[:1]
    hyps = _beam(model, src, 5, make_step, n_best=5, alpha=0.6)[0]
    assert len(hyps) == 5
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    for h in hyps:
        log_prob = _log_prob(model, src, h.tokens)
        assert h.log_prob == pytest.approx(log_prob, abs=1e-4)
        assert h.score == pytest.approx(
            log_prob / gnmt_length_penalty(len(h.tokens) + 1, 0.6), abs=1e-4
        )


@pytest.mark.parametrize(("seed", "alpha"), [(3, 0.0), (3, 0.6), (4, 2.0)])
def test_wide_beam_finds_the_exact_best_sequence(
    seed: int, alpha: float, make_step: MakeStep
) -> None:
    """Outputs of at most 3 tokens from {3, 4} (then EOS): all 15 sequences can be scored."""
    vocab, max_len = 5, 3
    model = _model(vocab=vocab, seed=seed)
    src = torch.tensor([[3, 4, 3, EOS]])
    best_score, best_tokens = -math.inf, None
    for n in range(max_len + 1):
        for tokens in itertools.product(range(3, vocab), repeat=n):  # not PAD, BOS or EOS
            score = _log_prob(model, src, list(tokens)) / gnmt_length_penalty(n + 1, alpha)
            if score > best_score:
                best_score, best_tokens = score, list(tokens)
    found = _beam(model, src, vocab**max_len, make_step, max_len=max_len, alpha=alpha)[0][0]
    assert found.tokens == best_tokens
    greedy = _beam(model, src, 1, make_step, max_len=max_len, alpha=alpha)[0][0]
    assert greedy.tokens != best_tokens  # a search problem where greedy fails
    assert found.score == pytest.approx(best_score, abs=1e-4)


def test_min_len_and_max_len_are_respected(make_step: MakeStep) -> None:
    model, src = _model(), _sources()
    for hyps in _beam(model, src, 3, make_step, max_len=4, min_len=4):
        assert len(hyps[0].tokens) == 4
    step, state = make_step(model, src)
    out = greedy_search(step, state, bos_id=BOS, eos_id=EOS, max_len=6, min_len=6, batch_size=3)
    assert [len(o) for o in out] == [6, 6, 6]


class _Replay:
    """A step function replaying scripted choices: at step t, row b's most probable token is
    ``choices[t][b]`` (ties with it at every larger id, so that the first must win), EOS the
    second best; it counts the steps it ran. Its state is never looked at."""

    def __init__(self, choices: list[list[int]], vocab: int) -> None:
        self.choices, self.vocab, self.steps = choices, vocab, 0

    def __call__(
        self, tokens: torch.Tensor, state: DecoderState
    ) -> tuple[torch.Tensor, DecoderState]:
        best = torch.tensor(self.choices[self.steps])  # (B,)
        ids = torch.arange(self.vocab)  # (V,)
        log_probs = torch.where(ids >= best[:, None], -1.0, -9.0)  # (B, V): ties from best on
        log_probs[:, EOS] = torch.where(best == EOS, -1.0, -5.0)  # EOS second unless chosen
        self.steps += 1
        return log_probs, state


@pytest.mark.parametrize("least", [1 << 40, 0], ids=["torch.argmax", "chunked argmax"])
def test_greedy_search_by_hand(least: int) -> None:
    """Scripted choices: rows 0 and 1 say EOS at step 1, row 2 runs into its limit of 3 tokens,
    where the search stops without a fourth step; min_len=1 bans EOS at step 0, so the first id
    tied with it after it wins; ties go to the first id."""

    def greedy(choices: list[list[int]], **kw: object) -> tuple[list[list[int]], int]:
        replay = _Replay(choices, vocab=700)  # longer than a chunk of the chunked argmax
        with performance_settings(chunked_argmax_min_vocab=least):
            out = greedy_search(replay, None, bos_id=BOS, eos_id=EOS, batch_size=3, **kw)  # type: ignore[arg-type]
        return out, replay.steps

    limits = torch.tensor([9, 9, 3])
    choices = [[4, 3, 5], [2, 2, 3], [3, 3, 5], [4, 4, 4]]
    assert greedy(choices, max_len=limits) == ([[4], [3], [5, 3, 5]], 3)
    choices = [[2, 2, 2], [4, 2, 2], [2, 5, 5]]  # EOS chosen at step 0, where it is banned
    assert greedy(choices, max_len=5, min_len=1) == ([[3, 4], [3], [3]], 3)
    assert greedy([[5, 5, 5]] * 4, max_len=4) == ([[5] * 4] * 3, 4)  # no fifth step


@pytest.mark.parametrize("rows", [3, 1], ids=["padded", "unpadded: no source mask applied"])
def test_cached_step_logits_equal_full_forward(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model, src = _model(), _sources()[:rows]
    tgt = torch.randint(3, 20, (rows, 7))
    tgt[:, 0] = BOS
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
    masks: list[torch.Tensor | None] = []  # the source mask each step decodes with
    decode = model.decode

    def spy(*args: object, **kwargs: object) -> object:
        masks.append(args[2])  # type: ignore[arg-type]
        return decode(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(model, "decode", spy)
    step, state = encoder_decoder_step(model, src)
    for t in range(7):
        log_probs, state = step(tgt[:, t : t + 1], state)
        real = [v for v in range(20) if v not in (PAD, BOS)]  # PAD and BOS are banned
        torch.testing.assert_close(log_probs[:, real], full[:, t, real], atol=1e-5, rtol=1e-5)
        assert torch.all(log_probs[:, [PAD, BOS]] == -torch.inf)
    assert len(masks) == 7
    assert all((m is None) == (rows == 1) for m in masks)  # padding: the mask; none: no mask


def test_filter_logits_support() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0, -1.0]])
    kept = filter_logits(logits, top_k=2).isfinite()[0].tolist()
    assert kept == [False, True, True, False, False]
    probs = logits.softmax(-1)[0]  # ≈ (0.086, 0.636, 0.234, 0.032, 0.012)
    # top-p 0.7: 0.636 < 0.7, so the second token is needed; then 0.870 ≥ 0.7
    assert filter_logits(logits, top_p=0.7).isfinite()[0].tolist() == kept
    assert filter_logits(logits, top_p=0.5).isfinite()[0].tolist() == [False, True] + [False] * 3
    assert float(probs[1]) > 0.5
    assert filter_logits(logits, top_p=1.0).isfinite().all()


def test_sampling_is_seeded_and_stays_in_the_support(make_step: MakeStep) -> None:
    model, src = _model(), _sources()

    def draw(seed: int, **kw: object) -> list[list[int]]:
        step, state = make_step(model, src)
        gen = torch.Generator().manual_seed(seed)
        return sample(
            step, state, batch_size=3, bos_id=BOS, eos_id=EOS, max_len=10, generator=gen, **kw
        )  # type: ignore[arg-type]

    assert draw(1) == draw(1)
    assert draw(1, temperature=5.0) != draw(2, temperature=5.0)
    # top_k=1 is greedy, whatever the temperature
    step, state = make_step(model, src)
    greedy = greedy_search(step, state, bos_id=BOS, eos_id=EOS, max_len=10, batch_size=3)
    assert draw(7, top_k=1, temperature=3.0) == greedy


def test_sampled_first_tokens_follow_the_filtered_distribution(make_step: MakeStep) -> None:
    model, src = _model(), _sources()[:1].repeat(4000, 1)
    step, state = make_step(model, src)
    with torch.no_grad():
        first, _ = step(torch.full((1, 1), BOS), state.index_select(torch.tensor([0])))
    allowed = set(first[0].topk(3).indices.tolist())
    step, state = make_step(model, src)
    out = sample(
        step,
        state,
        batch_size=4000,
        bos_id=BOS,
        eos_id=EOS,
        max_len=1,
        top_k=3,
        generator=torch.Generator().manual_seed(0),
    )
    firsts = [o[0] if o else EOS for o in out]
    assert set(firsts) <= allowed and len(set(firsts)) == 3
    # frequencies match the renormalised top-3 probabilities
    probs = first[0].softmax(-1)[sorted(allowed)]
    probs = probs / probs.sum()
    freq = torch.tensor([firsts.count(t) / 4000 for t in sorted(allowed)])
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)


def test_per_sentence_length_limits(make_step: MakeStep) -> None:
    """A (B,) max_len (what translate passes): sentences reach their own limits at different
    steps, each forced to EOS there, with the result it gets decoded alone under that limit."""
    model, src = _model(), _sources()
    limits = [2, 5, 9]
    together = _beam(model, src, 3, make_step, n_best=3, max_len=torch.tensor(limits), min_len=9)
    for i, limit in enumerate(limits):
        assert all(len(h.tokens) == limit for h in together[i])  # min_len 9 > limit: forced
        alone = src[i : i + 1, : int((src[i] != PAD).sum())]
        single = _beam(model, alone, 3, make_step, n_best=3, max_len=limit, min_len=9)[0]
        assert [h.tokens for h in single] == [h.tokens for h in together[i]]
        for a, b in zip(single, together[i], strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.parametrize(
    "index",
    [
        [1, 0, 3, 3, 5, 4],  # beams reordered within their sentences: the source is untouched
        [1, 0, 5, 5, 2, 3],  # whole sentences reordered: the source rows follow
        [2, 3],  # sentences 0 and 2 leave: the source rows are selected
        [0, 2, 1, 3, 4, 5],  # a group mixes sentences: the source is copied per row
    ],
)
@torch.no_grad()  # as searches run: the caches write into preallocated buffers
def test_beam_state_shares_the_source_and_reorders_like_copies(
    index: list[int], make_step: MakeStep
) -> None:
    model, src = _model(), _sources()
    tokens = torch.randint(3, 20, (6, 3))
    tokens[:, 0] = BOS
    step, grouped = make_step(model, src)
    grouped = grouped.repeat_interleave(2)  # rows b·2 + k
    _, copied = make_step(model, src.repeat_interleave(2, dim=0))
    for t in range(2):
        _, grouped = step(tokens[:, t : t + 1], grouped)
        _, copied = step(tokens[:, t : t + 1], copied)
    rows = torch.tensor(index)
    source_side = getattr(grouped, "src_mask", None)
    grouped, copied = grouped.index_select(rows), copied.index_select(rows)
    if isinstance(grouped, InferenceState):  # the beams of a sentence share its source slot
        assert len(set(grouped.sources.rows.tolist())) == len(set((rows // 2).tolist()))
    elif index == [1, 0, 3, 3, 5, 4]:
        assert grouped.src_mask is source_side  # nothing was copied
    want, _ = step(tokens[rows, 2:3], copied)
    got, grouped = step(tokens[rows, 2:3], grouped)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if not isinstance(grouped, InferenceState):
        assert grouped.group == (1 if index[:2] == [0, 2] else 2)


@dataclass(frozen=True)
class _Prefixes:
    """A scripted model's state: each row's output tokens so far, (B, L)."""

    rows: torch.Tensor

    def index_select(self, index: torch.Tensor) -> _Prefixes:
        return _Prefixes(self.rows.index_select(0, index))

    def repeat_interleave(self, repeats: int) -> _Prefixes:
        return _Prefixes(self.rows.repeat_interleave(repeats, dim=0))


def _scripted_step(tokens: torch.Tensor, state: _Prefixes) -> tuple[torch.Tensor, _Prefixes]:
    """Vocabulary PAD, BOS, EOS, 3, 4. After nothing: EOS 0.4, 3 0.35, 4 0.25; after 4: EOS 0.9;
    after 3, 3 goes on with 0.98 until 10 tokens, then EOS with 0.98."""
    rows = torch.cat([state.rows, tokens], dim=1)  # (B, L + 1), BOS first
    probs = []
    for row in rows[:, 1:].tolist():
        if not row:
            probs.append([0, 0, 0.4, 0.35, 0.25])
        elif row[0] == 4:
            probs.append([0, 0, 0.9, 0.05, 0.05])
        else:
            probs.append([0, 0, 0.01, 0.98, 0.01] if len(row) < 10 else [0, 0, 0.98, 0.01, 0.01])
    return torch.tensor(probs).log(), _Prefixes(rows)  # (B, V)


def test_gnmt_beam_does_not_stop_at_k_finished_when_a_live_beam_can_still_win() -> None:
    """With K = 2, "" and "4" finish within two steps, but with α = 1 the live beam 3 3 … (ten
    tokens, log P = log 0.35 + 10 log 0.98) scores −1.252 / lp(11) = −0.47 against "" 's −0.92:
    stopping once K hypotheses finished (fairseq's rule) would return "", too short; the exact
    bound (tensor2tensor's) keeps searching and finds the best sequence."""
    found = beam_search(
        _scripted_step,
        _Prefixes(torch.empty(1, 0, dtype=torch.long)),
        batch_size=1,
        beam_size=2,
        bos_id=BOS,
        eos_id=EOS,
        max_len=12,
        alpha=1.0,
        n_best=2,
    )[0]  # type: ignore[arg-type]
    assert found[0].tokens == [3] * 10
    want = (math.log(0.35) + 10 * math.log(0.98)) / gnmt_length_penalty(11, 1.0)
    assert found[0].score == pytest.approx(want, abs=1e-5)
    assert found[1].tokens == []  # the K best finished are kept, best first
    assert found[1].score == pytest.approx(math.log(0.4), abs=1e-5)


@pytest.mark.parametrize("style", ["gnmt", "hf"])
def test_stepped_beam_search_reports_each_sentence_the_step_it_is_done(
    make_step: MakeStep, style: str
) -> None:
    """``SteppedBeamSearch.advance`` returns each sentence once, with what ``beam_search``
    returns for it, at the step it leaves: with limits 2, 5, 9 (EOS forced at them), after steps
    3, 6 and 10 at the latest."""
    model, src = _model(), _sources()
    step, state = make_step(model, src)
    kw = {"beam_size": 3, "bos_id": BOS, "eos_id": EOS, "n_best": 2, "length_penalty": style}
    kw |= {"early_stopping": False} if style == "hf" else {}
    returned = beam_search(step, state, batch_size=3, max_len=torch.tensor([2, 5, 9]), **kw)
    step, state = make_step(model, src)
    search = SteppedBeamSearch(step, state, range(3), [2, 5, 9], **kw)  # type: ignore[arg-type]
    steps, reported = 0, {}
    while not search.done:
        done = search.advance()
        steps += 1
        for sentence, found in done:
            assert sentence not in reported
            reported[sentence] = (steps, found)
    assert {s: found for s, (_, found) in reported.items()} == dict(enumerate(returned))
    last = {"gnmt": [3, 6, 10], "hf": [2, 5, 9]}[style]  # "hf": the limit counts EOS
    assert all(reported[s][0] <= last[s] for s in range(3))
    assert reported[0][0] < steps  # the first answered before the search ends
