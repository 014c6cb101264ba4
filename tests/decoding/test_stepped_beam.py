"""The stepped beam search gives every sentence exactly what ``beam_search`` gives it alone,
for every value of every rule, while other sentences join it at later steps (some of them
after steps of their own) and leave it (done, or removed); one model call per step."""

from __future__ import annotations

import inspect
import itertools
import math
import zlib
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from aiayn.config import preset
from aiayn.decoding import InferenceStep, beam_search
from aiayn.decoding.beam import Hypothesis, SteppedBeamSearch, _rules
from aiayn.decoding.step import DecoderState
from aiayn.models import Transformer

PAD, BOS, EOS = 0, 1, 2
V = 12
LIMITS = [4, 7, 1, 5, 9, 3, 6]  # per sentence (≥ 1: "hf" needs it)


@dataclass(frozen=True)
class _Prefixes:
    """A scripted model's state: per row, its sentence id and the tokens fed to it so far."""

    rows: tuple[tuple[int, ...], ...]

    def index_select(self, index: torch.Tensor) -> _Prefixes:
        return _Prefixes(tuple(self.rows[i] for i in index.tolist()))

    def repeat_interleave(self, repeats: int) -> _Prefixes:
        return _Prefixes(tuple(row for row in self.rows for _ in range(repeats)))

    @staticmethod
    def concat(states: list[_Prefixes]) -> _Prefixes:
        return _Prefixes(tuple(row for state in states for row in state.rows))


def _row_log_probs(row: tuple[int, ...]) -> torch.Tensor:
    """(V,) log-probabilities drawn from the row's own history alone (so a row's values are the
    same bits in any batch): PAD and BOS never, EOS likelier as the output grows."""
    g = torch.Generator().manual_seed(zlib.crc32(repr(row).encode()))
    logits = torch.randn(V, generator=g) * 2.0
    logits[EOS] += 0.5 * (len(row) - 3)
    logits[[PAD, BOS]] = -math.inf
    return torch.log_softmax(logits, dim=0)


class _Step:
    """The scripted step; it records the rows of each call."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, Any]:
        assert isinstance(state, _Prefixes)
        rows = tuple((*r, t) for r, t in zip(state.rows, tokens[:, 0].tolist(), strict=True))
        self.calls.append(len(rows))
        return torch.stack([_row_log_probs(r) for r in rows]), _Prefixes(rows)  # (B, V)


def _rule_sets(style: str, k: int) -> Iterator[dict[str, Any]]:
    """Every combination of the other rules' values for ``style`` and K."""
    stops: list[bool | str] = [True] if style == "gnmt" else [True, False, "never"]
    forced = [False] if style == "gnmt" else [False, True]
    values = (sorted({1, k}), (0.0, 0.6, 1.5), (0, 2), stops, forced)
    for n_best, alpha, min_len, stop, eos in itertools.product(*values):
        yield {"beam_size": k, "n_best": n_best, "alpha": alpha, "min_len": min_len,
               "length_penalty": style, "early_stopping": stop, "forced_eos": eos}  # fmt: skip


def test_every_rule_is_enumerated() -> None:
    """The rules the tests below enumerate are all of the search's keyword arguments but the
    ids and the device."""
    given = set(inspect.signature(SteppedBeamSearch).parameters)
    enumerated = set(next(_rule_sets("hf", 2)))
    assert given - enumerated == {"step", "state", "keys", "limits", "bos_id", "eos_id", "device"}


def _search(step: _Step, ids: list[int], rules: dict[str, Any]) -> SteppedBeamSearch:
    state = _Prefixes(tuple((i,) for i in ids))
    limits = [LIMITS[i] for i in ids]
    return SteppedBeamSearch(step, state, ids, limits, bos_id=BOS, eos_id=EOS, **rules)


def _advance(search: SteppedBeamSearch, step: _Step, out: dict[Hashable, Any]) -> None:
    """One step: one model call over every row the search runs."""
    rows, calls = search.rows, len(step.calls)
    out.update(search.advance())
    assert step.calls[calls:] == ([rows] if rows else [])


def _stepped(rules: dict[str, Any]) -> tuple[dict[Hashable, Any], set[Hashable]]:
    """Sentences 0, 1 start; 2 joins before the first step, 3 after one, and 4–6 (which ran
    a step of their own) after three; 1 and 5 are removed on the way. The sentences' n-best
    lists, and the keys removed while still searching."""
    step, out, removed = _Step(), {}, set()
    search = _search(step, [0, 1], rules)
    search.merge(_search(step, [2], rules))  # joins at step 0
    _advance(search, step, out)
    search.merge(_search(step, [3], rules))  # joins at step 1
    _advance(search, step, out)
    removed |= set(search.remove([1]))
    _advance(search, step, out)
    later = _search(step, [4, 5, 6], rules)
    _advance(later, step, out)
    search.merge(later)  # joins at step 3, itself at step 1
    assert later.done and not later.sentences
    _advance(search, step, out)
    removed |= set(search.remove([5]))
    while not search.done:
        _advance(search, step, out)
    return out, removed


def _alone(i: int, rules: dict[str, Any]) -> list[Hypothesis]:
    found = beam_search(_Step(), _Prefixes(((i,),)), batch_size=1, bos_id=BOS, eos_id=EOS,
                        max_len=LIMITS[i], **rules)  # fmt: skip
    return found[0]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("style", ["gnmt", "hf"])
def test_every_sentence_gets_what_beam_search_gives_it_alone(style: str, k: int) -> None:
    """For every combination of the rules: the same hypotheses (tokens, log-probs and scores
    bit for bit) as the sentence's own beam search, whatever joined or left around it."""
    removed_live = 0
    for rules in _rule_sets(style, k):
        got, removed = _stepped(rules)
        assert set(got) == set(range(len(LIMITS))) - removed, rules
        assert not removed & set(got)
        for i, hyps in got.items():
            assert hyps == _alone(i, rules), (i, rules)  # type: ignore[arg-type]
            assert 1 <= len(hyps) <= rules["n_best"]
        removed_live += len(removed)
    assert removed_live > 0  # removal was tested on searching sentences


def test_a_sentence_counts_its_own_steps_for_min_len() -> None:
    """Sentence 1 joins two steps after sentence 0 with min_len = 2: at the step where 0 may
    end, 1 may not; the scripted step makes EOS the best token everywhere, so each ends at its
    own step 2 (two tokens)."""

    def eos_first(tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        log_probs = torch.full((tokens.size(0), 5), -3.0)
        log_probs[:, EOS], log_probs[:, [PAD, BOS]] = -0.1, -math.inf
        return log_probs, state

    def search(key: int) -> SteppedBeamSearch:
        return SteppedBeamSearch(eos_first, _Prefixes(((key,),)), [key], [9], beam_size=2,
                                 bos_id=BOS, eos_id=EOS, min_len=2)  # fmt: skip

    first = search(0)
    assert first.advance() == [] and first.advance() == []
    first.merge(search(1))
    assert [key for key, _ in first.advance()] == [0]
    assert first.advance() == [] and first.most_steps() == 9 - 2 + 1
    ((key, hyps),) = first.advance()
    assert key == 1 and len(hyps[0].tokens) == 2


def test_per_sentence_constraints_by_hand() -> None:
    """Three sentences at steps 0, 2 and 1 with min_len 2, the third at its limit: EOS is
    banned for the first; the second is untouched; the third may only end (GNMT: EOS keeps its
    log-prob, here −inf floored to the most negative float; HF's forced EOS: log-prob 0)."""
    gnmt = _rules("gnmt", 2, 1, 0.6, EOS, 2, True, False)
    out = gnmt.constrain(torch.zeros(3, 2, 4), [0, 2, 1], [False, False, True])  # (b, K, V)
    floor = torch.finfo(torch.float32).min
    assert out[0, :, EOS].tolist() == [-math.inf] * 2 and out[0, :, 3].tolist() == [0.0] * 2
    assert out[1].eq(0).all()
    assert out[2, :, EOS].tolist() == [floor] * 2 and out[2, :, 3].tolist() == [-math.inf] * 2
    hf = _rules("hf", 2, 1, 0.6, EOS, 2, True, True)
    out = hf.constrain(torch.zeros(3, 2, 4), [0, 2, 1], [False, False, True])
    assert out[0, :, EOS].tolist() == [-math.inf] * 2 and out[1].eq(0).all()
    assert out[2, :, EOS].tolist() == [0.0] * 2 and out[2, :, 3].tolist() == [-math.inf] * 2


def test_searches_with_other_rules_do_not_merge() -> None:
    rules = next(_rule_sets("hf", 2))
    a, b = _search(_Step(), [0], rules), _search(_Step(), [1], {**rules, "alpha": 0.6})
    with pytest.raises(ValueError, match="same rules"):
        a.merge(b)


SOURCES = [[5, 6, 7, 8, EOS], [9, 10, EOS], [11, 12, 13, EOS], [14, EOS], [6, 9, 4, 3, 7, EOS]]


def _model() -> Transformer:
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=20, d_model=32, d_ff=64, num_heads=4, dropout=0.0)
    model = Transformer(config).eval()
    with torch.no_grad():  # sharper distributions than the initialisation gives
        model.output_proj.weight.mul_(4.0)
    return model


def _batch(ids: list[int]) -> torch.Tensor:
    src = torch.full((len(ids), max(len(SOURCES[i]) for i in ids)), PAD)  # (B, S)
    for r, i in enumerate(ids):
        src[r, : len(SOURCES[i])] = torch.tensor(SOURCES[i])
    return src


HF_RULES = {"beam_size": 2, "n_best": 1, "alpha": 1.0, "length_penalty": "hf",
            "early_stopping": False, "forced_eos": True, "min_len": 2}  # fmt: skip


@pytest.mark.parametrize(
    "rules", [{"beam_size": 3, "n_best": 3, "alpha": 0.6}, HF_RULES], ids=["gnmt", "hf"]
)
def test_merged_inference_states_give_each_sentence_its_search_alone(
    rules: dict[str, Any],
) -> None:
    """The flattened step's states (joined over one pair of slot pools, freed as they leave):
    sentences joining at steps 0, 1 and 3, one removed; each sentence's hypotheses are its own
    beam search's (the same tokens; scores up to float rounding: a batch's matmuls may sum in
    another order)."""
    model, limits = _model(), [6, 9, 3, 8, 7]
    step = InferenceStep(model)
    pools = step.pools(2, 4, 1, 4)

    def search(ids: list[int]) -> SteppedBeamSearch:
        state = step.initial_state(_batch(ids), capacity=4, pools=pools)
        return SteppedBeamSearch(step, state, ids, [limits[i] for i in ids], bos_id=BOS,
                                 eos_id=EOS, **rules)  # fmt: skip

    running, out = search([0]), {}
    joining = {0: [1], 1: [2], 3: [3, 4]}
    for t in itertools.count():
        if t in joining:
            running.merge(search(joining[t]))
        if t == 2:
            assert running.remove([1]) == [1]
        out.update(running.advance())
        if running.done:
            break
    assert set(out) == {0, 2, 3, 4}
    assert pools[0].free == pools[0].slots and pools[1].free == pools[1].slots  # all freed
    for i, hyps in out.items():
        alone = beam_search(step, step.initial_state(_batch([i])), batch_size=1, bos_id=BOS,
                            eos_id=EOS, max_len=limits[i], **rules)[0]  # fmt: skip
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        for a, b in zip(hyps, alone, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-5)
