"""Sampling's next-token choice (:func:`aiayn.decoding.sampling.sample_tokens`): on ordinary
values exactly the draws of before (held equal to a copy of the previous code, seed for seed);
where the values underflow (a temperature whose ``log_prob / T`` overflows float32, or rounds to
0 in it; a top-p that rounds to 0) the top token, as greedy search chooses it, never a NaN draw."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aiayn.decoding import filter_logits, greedy_search, sample, sample_tokens
from aiayn.decoding.lm import decoder_only_step
from aiayn.decoding.stepwise import Sampling, SteppedSearch
from aiayn.models.gpt2 import GPT2
from data_builders import noisy_gpt2

TINY = (1e-38, 1e-300, 5e-324)
"""Temperatures and top-p values that underflow: 1e-38 overflows ``log_prob / T`` for
log-probabilities below about −3.4; 1e-300 and 5e-324 round to 0 in float32."""


def _previous_filter(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """``filter_logits`` as it was before underflowing values were handled (the reference)."""
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -torch.inf)
    return logits


def _previous_tokens(
    log_probs: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
    generator: torch.Generator | list[torch.Generator],
) -> torch.Tensor:  # fmt: skip
    """The previous sampling step: tempered, filtered, softmax, one multinomial draw per row."""
    logits = _previous_filter(log_probs.float() / temperature, top_k, top_p)
    probs = logits.softmax(dim=-1)
    if isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
    rows = zip(probs, generator, strict=True)
    return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in rows])


def _log_probs(rows: int, vocab: int, seed: int, banned: tuple[int, ...] = (0, 3)) -> torch.Tensor:
    """Ordinary log-probabilities: a log-softmax of spread logits, ``banned`` at −inf."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[:, list(banned)] = -torch.inf
    return logits.log_softmax(dim=-1)


ORDINARY = [
    (1.0, None, None), (0.7, None, None), (2.5, None, None), (0.05, None, None),
    (1.0, 5, None), (0.8, None, 0.9), (1.3, None, 0.3), (0.6, 10, 0.95), (1.0, None, 1e-6),
    (1e-3, None, None), (100.0, 3, 0.5),
]  # fmt: skip


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), ORDINARY)
@pytest.mark.parametrize("per_row", [False, True])
def test_ordinary_values_draw_exactly_as_before(
    temperature: float, top_k: int | None, top_p: float | None, per_row: bool
) -> None:
    for seed in range(5):
        log_probs = _log_probs(6, 200, seed)
        logits = log_probs / temperature
        assert torch.equal(filter_logits(logits, top_k=top_k, top_p=top_p),
                           _previous_filter(logits, top_k, top_p))  # fmt: skip

        def gens(seed: int = seed) -> torch.Generator | list[torch.Generator]:
            if per_row:
                return [torch.Generator().manual_seed(seed * 10 + i) for i in range(6)]
            return torch.Generator().manual_seed(seed)

        for _ in range(3):  # a few steps of the same generators
            a, b = gens(), gens()
            got = sample_tokens(log_probs, temperature=temperature, top_k=top_k, top_p=top_p,
                                generator=a)  # fmt: skip
            assert torch.equal(got, _previous_tokens(log_probs, temperature, top_k, top_p, b))


def _row(*probs: float) -> torch.Tensor:
    return torch.tensor([[math.log(p) if p > 0 else -math.inf for p in probs]])


@pytest.mark.parametrize("tiny", TINY)
def test_a_temperature_that_underflows_takes_the_top_token(tiny: float) -> None:
    cases = [  # each row holds a log-probability below -3.41 (log 0.02): / 1e-38 overflows
        (_row(0.02, 0.5, 0.48), 1),
        (_row(0.49, 0.02, 0.49), 0),  # equal maxima: the lowest id, as argmax
        (_row(0.02, 0.49, 0.49), 1),
        (_row(0.0, 0.02, 0.98), 2),  # a banned token (−inf) stays banned
        (torch.tensor([[-50.0, -50.0, -100.0]]), 0),  # every one overflows
    ]
    for log_probs, top in cases:
        for seed in range(20):
            g = torch.Generator().manual_seed(seed)
            assert sample_tokens(log_probs, temperature=tiny, generator=g).tolist() == [top]


def test_a_tiny_temperature_that_does_not_overflow_samples_among_equal_maxima() -> None:
    """T = 1e-38 over log-probabilities above -3.4: every ``log_prob / T`` is finite, the
    distribution exists, and it is T → 0's limit: the top token, or either of two equal ones."""
    assert {int(sample_tokens(_row(0.2, 0.5, 0.3), temperature=1e-38)) for _ in range(20)} == {1}
    drawn = {
        int(sample_tokens(_row(0.4, 0.2, 0.4), temperature=1e-38,
                          generator=torch.Generator().manual_seed(seed)))
        for seed in range(40)
    }  # fmt: skip
    assert drawn == {0, 2}


@pytest.mark.parametrize("tiny", [1e-46, 1e-300, 5e-324])
def test_a_top_p_that_rounds_to_0_keeps_the_top_token(tiny: float) -> None:
    """An empty nucleus (p is 0 in float32): the top token, the lowest id of equals."""
    log_probs = torch.cat([_row(0.2, 0.5, 0.3), _row(0.4, 0.2, 0.4), _row(0.1, 0.1, 0.8)])
    log_probs = torch.cat([log_probs, torch.zeros(1, 3)])  # three equal maxima
    kept = filter_logits(log_probs, top_p=tiny).isfinite().tolist()
    expected = [[False, True, False], [True, False, False], [False, False, True]]
    assert kept == [*expected, [True, False, False]]
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        got = sample_tokens(log_probs, temperature=1.0, top_p=tiny, generator=g)
        assert got.tolist() == [1, 0, 2, 0]


def test_a_tiny_top_p_keeps_one_token() -> None:
    """p = 1e-38 (not 0 in float32): the nucleus is the most probable token alone."""
    log_probs = torch.cat([_row(0.2, 0.5, 0.3), _row(0.1, 0.1, 0.8)])
    assert filter_logits(log_probs, top_p=1e-38).isfinite().sum(dim=-1).tolist() == [1, 1]
    got = sample_tokens(log_probs, top_p=1e-38, generator=torch.Generator().manual_seed(0))
    assert got.tolist() == [1, 2]


def test_an_underflowing_row_leaves_the_others_draws_as_they_were() -> None:
    """With one generator per row, the ordinary rows draw what they draw alone; the row whose
    tempered values overflow takes its top token."""
    log_probs = torch.cat([_log_probs(1, 50, 1), torch.tensor([[-900.0] * 49 + [-1.0]]),
                           _log_probs(1, 50, 2)])  # fmt: skip
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    # T = 1e-36: row 1's -900 / T overflows float32; rows 0 and 2 stay finite (|x| < 340)
    got = sample_tokens(log_probs, temperature=1e-36, generator=gens).tolist()
    assert got[1] == 49
    for i in (0, 2):
        alone = _previous_tokens(log_probs[i : i + 1], 1e-36, None, None,
                                 [torch.Generator().manual_seed(i)])  # fmt: skip
        assert got[i] == int(alone[0])


def test_a_row_holding_nan_takes_argmax_choice_not_a_nan_draw() -> None:
    log_probs = torch.tensor([[-1.0, math.nan, -2.0], [-3.0, -0.5, -1.0]])
    got = sample_tokens(log_probs, temperature=0.5, generator=torch.Generator().manual_seed(0))
    assert got[0] == int(torch.argmax(log_probs[0]))  # greedy search would choose the same


def test_the_temperature_must_be_positive() -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sample_tokens(_row(0.5, 0.5), temperature=0.0)


@given(
    temperature=st.floats(min_value=5e-324, max_value=100.0, allow_subnormal=True),
    top_p=st.none() | st.floats(min_value=5e-324, max_value=1.0, allow_subnormal=True),
    top_k=st.none() | st.integers(1, 40),
    seed=st.integers(0, 2**31),
)
def test_any_values_draw_an_allowed_token(
    temperature: float, top_p: float | None, top_k: int | None, seed: int
) -> None:
    """Whatever the values: a token per row, never a banned one (no NaN draw, no error)."""
    log_probs = _log_probs(4, 40, seed % 1000)
    g = torch.Generator().manual_seed(seed)
    got = sample_tokens(log_probs, temperature=temperature, top_k=top_k, top_p=top_p, generator=g)
    assert got.shape == (4,)
    assert bool(log_probs.gather(1, got[:, None]).isfinite().all())


@pytest.fixture(scope="module")
def model() -> GPT2:
    m = noisy_gpt2()
    assert isinstance(m, GPT2)
    return m


PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]


@pytest.mark.parametrize(("temperature", "top_p"), [(t, None) for t in TINY] + [(1.0, 1e-300)])
def test_sampling_that_underflows_is_greedy_search(
    model: GPT2, temperature: float, top_p: float | None
) -> None:
    """``sample`` and the server's stepped search give greedy search's outputs."""
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=8)
    greedy = greedy_search(step, state, bos_id=1, eos_id=2, max_len=8, batch_size=4, min_len=2)
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=8)
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    sampled = sample(step, state, batch_size=4, bos_id=1, eos_id=2, max_len=8, min_len=2,
                     temperature=temperature, top_p=top_p, generator=gens)  # fmt: skip
    assert sampled == greedy
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=8)
    sampling = Sampling(temperature, None, top_p)
    search = SteppedSearch(step, state, range(4), [8] * 4, bos_id=1, eos_id=2, min_len=2,
                           sampling=sampling, generators=gens)  # fmt: skip
    out: dict[object, list[int]] = {}
    while not search.done:
        out.update({row.key: row.tokens for row in search.advance()})
    assert [out[i] for i in range(4)] == greedy
