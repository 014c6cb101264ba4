"""The stepwise search gives, row for row, greedy search's and sampling's outputs (with one
generator per row), while rows leave the batch as they end."""

from __future__ import annotations

import pytest
import torch

from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.lm import decoder_only_step
from aiayn.decoding.sampling import sample
from aiayn.decoding.stepwise import Sampling, SteppedSearch
from aiayn.models.gpt2 import GPT2
from data_builders import noisy_gpt2

PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
LIMITS = [6, 2, 9, 0]


@pytest.fixture(scope="module")
def model() -> GPT2:
    m = noisy_gpt2()
    assert isinstance(m, GPT2)
    return m


def _run(search: SteppedSearch) -> dict[int, list[int]]:
    out, rounds = {}, 0
    while not search.done:
        for row in search.advance():
            out[row.key] = row.tokens
        rounds += 1
        assert rounds < 100
    return out


def _greedy(model: GPT2, eos: int, min_len: int) -> list[list[int]]:
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=max(LIMITS))
    return greedy_search(step, state, bos_id=1, eos_id=eos, max_len=torch.tensor(LIMITS),
                         batch_size=4, min_len=min_len)  # fmt: skip


@pytest.mark.parametrize("min_len", [0, 1])
def test_greedy_rows_equal_greedy_search(model: GPT2, min_len: int) -> None:
    eos = _greedy(model, 2, 0)[0][1]  # a token the model picks: some rows end by it
    expected = _greedy(model, eos, min_len)
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=max(LIMITS))
    got = _run(SteppedSearch(step, state, range(4), LIMITS, bos_id=1, eos_id=eos, min_len=min_len))
    assert [got[i] for i in range(4)] == expected
    assert got[3] == []  # limit 0: no token
    assert any(len(t) < m for t, m in zip(expected, LIMITS, strict=True))  # some ended by EOS


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, None), (0.7, 0.9)])
def test_sampled_rows_equal_sample_with_a_generator_per_row(
    model: GPT2, temperature: float, top_p: float | None
) -> None:
    def gens() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(100 + i) for i in range(4)]

    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=max(LIMITS))
    expected = sample(step, state, batch_size=4, bos_id=1, eos_id=2,
                      max_len=torch.tensor(LIMITS), temperature=temperature, top_p=top_p,
                      generator=gens())  # fmt: skip
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=max(LIMITS))
    search = SteppedSearch(step, state, range(4), LIMITS, bos_id=1, eos_id=2,
                           sampling=Sampling(temperature, None, top_p),
                           generators=gens())  # fmt: skip
    got = _run(search)
    assert [got[i] for i in range(4)] == expected


def test_a_removed_row_leaves_the_others_unchanged(model: GPT2) -> None:
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=9)
    alone = _run(SteppedSearch(step, state, range(4), [9] * 4, bos_id=1, eos_id=2))
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=9)
    search = SteppedSearch(step, state, range(4), [9] * 4, bos_id=1, eos_id=2)
    search.advance()
    gone = search.remove([2])
    assert [r.key for r in gone] == [2] and len(search.rows) == 3
    rest = _run(search)
    assert {k: rest[k] for k in (0, 1, 3)} == {k: alone[k] for k in (0, 1, 3)}


def test_running_rows_tokens_so_far_are_prefixes_of_their_outputs(model: GPT2) -> None:
    """``current_tokens`` gives each running row its tokens so far, one more each step: a
    prefix of what the row ends with; rows that ended are not touched."""
    step, state = decoder_only_step(model, PROMPTS, max_new_tokens=9)
    search = SteppedSearch(step, state, range(4), [9, 4, 9, 6], bos_id=1, eos_id=2)
    seen: dict[int, list[list[int]]] = {k: [] for k in range(4)}
    final: dict[int, list[int]] = {}
    while not search.done:
        for row in search.advance():
            final[row.key] = row.tokens  # type: ignore[index]
        search.current_tokens()
        for row in search.rows:
            seen[row.key].append(list(row.tokens))  # type: ignore[index]
    for key, steps in seen.items():
        assert [len(t) for t in steps] == list(range(1, len(steps) + 1))
        assert all(final[key][: len(t)] == t for t in steps)
    assert sum(map(len, seen.values())) >= 4 and len(final) == 4


def _alone(model: GPT2, prompt: list[int], limit: int, eos: int, sampled: bool) -> list[int]:
    step, state = decoder_only_step(model, [prompt], max_new_tokens=limit)
    ends = {"bos_id": 1, "eos_id": eos, "max_len": limit, "batch_size": 1}
    if sampled:
        gen = torch.Generator().manual_seed(7 + len(prompt))
        return sample(step, state, **ends, temperature=0.8, generator=[gen])[0]
    return greedy_search(step, state, **ends)[0]


@pytest.mark.parametrize("sampled", [False, True])
def test_rows_that_join_later_get_what_they_get_alone(model: GPT2, sampled: bool) -> None:
    """Search A starts, runs 3 steps; B starts, runs 1; B joins A (one slot pool, each row
    keeping its positions); rows leave as they end, freeing their slots: every row's output is
    the one it gets alone."""
    from aiayn.decoding.lm import LMState, LMStep

    eos = _greedy(model, 2, 0)[0][1]
    limits = [7, 3, 9, 5]
    pool = LMStep(model).pool(1, 2)  # grows on the way

    def search(rows: range) -> SteppedSearch:
        prompts = [PROMPTS[i] for i in rows]
        step, state = decoder_only_step(model, prompts, max_new_tokens=max(limits), pool=pool)
        gens = [torch.Generator().manual_seed(7 + len(PROMPTS[i])) for i in rows]
        return SteppedSearch(step, state, list(rows), [limits[i] for i in rows], bos_id=1,
                             eos_id=eos, sampling=Sampling(0.8) if sampled else None,
                             generators=gens if sampled else None)  # fmt: skip

    a, b = search(range(2, 4)), search(range(0, 2))
    out = {}
    for _ in range(3):
        out.update({r.key: r.tokens for r in a.advance()})
    out.update({r.key: r.tokens for r in b.advance()})
    assert isinstance(a.state, LMState) and isinstance(b.state, LMState)
    assert a.state.length > b.state.length and a.rows
    a.merge(b)
    assert b.done and len(a.rows) + len(out) == 4
    while not a.done:
        out.update({r.key: r.tokens for r in a.advance()})
    assert pool.free == pool.slots  # every slot freed
    expected = {i: _alone(model, PROMPTS[i], limits[i], eos, sampled) for i in range(4)}
    assert out == expected
