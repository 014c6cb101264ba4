"""Beam search in two named styles: GNMT's (the default, §6.1: beam 4, α = 0.6, max length =
input + 50) and Hugging Face ``generate``'s, token for token.

The length penalty, the formula libraries disagree on, named here per style:

    "gnmt" (Wu et al. 2016, eq. 14):  lp(Y) = ((5 + |Y|) / (5 + 1))^α
    "hf"   (HF ``generate``):         lp(Y) = |Y|^α            score(Y) = log P(Y | X) / lp(Y)

where |Y| counts the generated tokens *including* the final EOS (fairseq counts it too; a "hf"
hypothesis cut at the length limit counts its last token instead). α = 0 is plain log-probability.

Batched over sentences × beams (rows ``b·K + k``); a sentence leaves the batch as soon as it is
done, so the others run on a smaller batch. The device scores the candidates and keeps the 2K
best per sentence; the host, from one copy of those, ends hypotheses, picks the K survivors and
keeps their token histories. :class:`SteppedBeamSearch` runs this one step at a time, and takes
in sentences that start later (each counting its own steps), for a server;
:func:`beam_search` runs it to the end. Each style fixes, in one class (:class:`_Gnmt`,
:class:`_HuggingFace`), what happens at the length limit and when a sentence is done:

* "gnmt": ``max_len`` counts output tokens without EOS; at the limit EOS is forced (keeping its
  log-prob). A sentence is done only when no live beam can still beat its n-th best finished
  one: live beams only lose log-probability, so their best possible score is ``best live
  log-prob / lp(max length)`` (an exact bound, since log-probabilities are ≤ 0 and lp grows with
  length). This is tensor2tensor's rule (the paper's decoder, ``_is_finished``), not fairseq's
  "done once K hypotheses have finished": the first K to finish are the shortest, and with α > 0
  a longer live beam may still score higher, so stopping there returns outputs too short for the
  α asked for (measured in docs/quality.md). The K best finished hypotheses are kept.
* "hf": ``max_len`` is HF's ``max_new_tokens`` (generated tokens, EOS included); at the limit the
  K best candidates all end as they are (no EOS appended). Only the K best finished hypotheses are
  kept; ``early_stopping`` decides when a sentence with K of them is done (:class:`_HuggingFace`).

HF ``generate(num_beams=K, max_new_tokens=M, min_new_tokens=m, length_penalty=α,
early_stopping=e, num_return_sequences=n, forced_eos_token_id=eos_id or None, do_sample=False)``
of an encoder–decoder is ``beam_search(length_penalty="hf", beam_size=K, max_len=M, min_len=m,
alpha=α, early_stopping=e, n_best=n, forced_eos=True or False, bos_id=decoder_start_token_id)``
over a step running that model; HF's ``min_length`` L counts the decoder start: min_len = L − 1.

Shape legend:  B sentences   b sentences still searching   K beam size   V vocabulary   t step
               M candidates per sentence (K·V)   C chunks of L candidates   n candidates kept
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding.step import DecoderState, StepFunction, join_states, release_state
from aiayn.settings import performance


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^α with |Y| including EOS (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def hf_length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = |Y|^α with |Y| the generated tokens including EOS (HF ``generate``, whose
    ``length_penalty`` is α)."""
    return float(length) ** alpha


@dataclass(frozen=True)
class Hypothesis:
    """A finished output sequence.

    Attributes:
        tokens: output ids without BOS and EOS (a "hf" hypothesis ended at the length limit
            without EOS keeps its last token).
        log_prob: log P(Y | X), EOS included when there is one.
        score: ``log_prob / lp(|Y|)`` in the style's length penalty: what the beam ranks by.
    """

    tokens: list[int]
    log_prob: float
    score: float


@torch.inference_mode()  # no autograd bookkeeping (version counters, views) per op
def beam_search(
    step: StepFunction,
    state: DecoderState,
    *,
    batch_size: int,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    max_len: Tensor | int,
    min_len: int = 0,
    alpha: float = 0.6,
    n_best: int = 1,
    length_penalty: str = "gnmt",
    early_stopping: bool | str = True,
    forced_eos: bool = False,
    device: torch.device | str = "cpu",
) -> list[list[Hypothesis]]:
    """Beam search over ``step``; returns, per sentence, its ``n_best`` hypotheses, best first.

    Runs :class:`SteppedBeamSearch` over the batch to the end (the one implementation).

    Args:
        step, state: the step function and the initial state for ``batch_size`` sentences.
        beam_size: K (1 = greedy search).
        max_len: per-sentence (B,) or global length limit. "gnmt": output tokens, EOS excluded
            (EOS is forced after them); "hf": HF's ``max_new_tokens`` (≥ 1), EOS included.
        min_len: EOS is not allowed before this many output tokens (HF's ``min_new_tokens``).
        alpha: α of the length penalty (0.6 in §6.1; HF's float ``length_penalty``).
        n_best: how many hypotheses to return per sentence (≤ K; HF's ``num_return_sequences``).
        length_penalty: the style, "gnmt" (default) or "hf": its penalty, its length limit and
            its stopping rule, as the module docstring says.
        early_stopping: "hf" only: HF's ``early_stopping``, True, False or "never".
        forced_eos: "hf" only: HF's ``forced_eos_token_id`` set to ``eos_id``: the token chosen
            at the last allowed step is EOS, with log-prob 0.
    """
    limits = torch.as_tensor(max_len, device=device).expand(batch_size).tolist()
    search = SteppedBeamSearch(
        step,
        state,
        range(batch_size),
        limits,
        beam_size=beam_size,
        bos_id=bos_id,
        eos_id=eos_id,
        min_len=min_len,
        alpha=alpha,
        n_best=n_best,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        forced_eos=forced_eos,
        device=device,
    )
    found: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    while not search.done:
        for key, hyps in search.advance():  # in sentence order
            found[cast(int, key)] = hyps
    return found


@dataclass
class _Sentence:
    """One sentence being searched: its caller's key, its length limit and the step at which
    it ends (:meth:`_Rules.last_step`), t (the steps it has run: it may have joined later than
    others) and its kept finished hypotheses (:meth:`_Rules.keep`'s: best first)."""

    key: Hashable
    limit: int
    last: int
    t: int = 0
    finished: list[Hypothesis] = field(default_factory=list)


class SteppedBeamSearch:
    """Beam search over ``step`` one :meth:`advance` at a time, over sentences that join
    (:meth:`merge`) and leave (done, or :meth:`remove`) between steps: what a server needs to
    decode the sentences of requests arriving at different times in one batch
    (``aiayn serve``, :mod:`aiayn.serving.decode`).

    Each sentence counts its own steps and has its own length limit; all follow the same rules
    (the arguments of :func:`beam_search`, which is this search run to the end). A step is one
    call of ``step`` over every sentence's K beams (rows ``b·K + k``), one top-k over all
    sentences' candidates (b, K·V), one copy of the (b, 2K) best (scores and indices) to the
    host, and one ``index_select`` of the surviving beams' rows. Every sentence gets what
    :func:`beam_search` gives it alone, whatever joins or leaves around it, as far as the step
    is batch-invariant (the choice is per sentence; tests hold them equal).

    Args:
        step, state: the step function and the initial state of ``len(keys)`` sentences (one
            row each: the search repeats it K times).
        keys: one key per sentence (how :meth:`advance` names the sentences done).
        limits: per sentence, its ``max_len`` (as :func:`beam_search`'s).
    """

    def __init__(
        self,
        step: StepFunction,
        state: DecoderState,
        keys: Sequence[Hashable],
        limits: Sequence[int],
        *,
        beam_size: int,
        bos_id: int,
        eos_id: int,
        min_len: int = 0,
        alpha: float = 0.6,
        n_best: int = 1,
        length_penalty: str = "gnmt",
        early_stopping: bool | str = True,
        forced_eos: bool = False,
        device: torch.device | str = "cpu",
    ):
        self.rules = _rules(
            length_penalty, beam_size, n_best, alpha, eos_id, min_len, early_stopping, forced_eos
        )
        if len(limits) != len(keys):
            raise ValueError(f"need one limit per sentence: {len(limits)} for {len(keys)}")
        k = self.k = beam_size
        last = [self.rules.last_step(int(m)) for m in limits]
        self.sentences = [_Sentence(*x) for x in zip(keys, map(int, limits), last, strict=True)]
        self.step, self.device = step, device
        self.stepped = False  # whether a step has run (the state is past its first step)
        with torch.inference_mode():
            self.state = state.repeat_interleave(k)  # row b·K + k: beam k of sentence b
            first = _first_beams(len(keys), k, bos_id, device)
        self.scores, self.tokens = first  # (B, K), (B·K, 1)
        self.paths: list[tuple[int, ...]] = [()] * (len(keys) * k)  # per row, its tokens so far

    @property
    def done(self) -> bool:
        """Whether every sentence has left."""
        return not self.sentences

    @property
    def rows(self) -> int:
        """The rows the next step runs: K per sentence still searching."""
        return len(self.sentences) * self.k

    def most_steps(self) -> int:
        """The most steps a sentence still searching may run (0 when none is)."""
        return max((s.last - s.t + 1 for s in self.sentences), default=0)

    @torch.inference_mode()
    def advance(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One step: (key, n-best list, best first) of each sentence done at it, in the order
        of the batch; those leave it."""
        if not self.sentences:
            return []
        log_probs, state = self.step(self.tokens, self.state)  # (b·K, V)
        return self.end(log_probs, state)

    @torch.inference_mode()
    def end(
        self, log_probs: Tensor, state: DecoderState
    ) -> list[tuple[Hashable, list[Hypothesis]]]:
        """After a step made of ``tokens`` and ``state`` (by :meth:`advance`, or by a caller
        stepping several searches in one model call), its (b·K, V) log-probs and next state:
        :meth:`advance`'s result."""
        self.stepped = True
        sentences, rules = self.sentences, self.rules
        steps = [s.t for s in sentences]  # (b,) each sentence's own t
        at_limit = [s.t >= s.last for s in sentences]  # (b,) on the host
        top, vocab = _top(log_probs, self.scores, rules.constrain, steps, at_limit)
        chosen = _select(sentences, top, _Row(self.k, vocab, at_limit), self.paths, rules)
        kept = set(chosen.kept)
        done = [s for r, s in enumerate(sentences) if r not in kept]
        self.sentences = [sentences[r] for r in chosen.kept]
        if self.sentences:
            self._keep(chosen, state)
        else:
            self.state = state
            release_state(state)
        return [(s.key, s.finished[: rules.n_best]) for s in done]

    def _keep(self, chosen: _Chosen, state: DecoderState) -> None:
        """The surviving beams of the sentences still searching go on: their token histories,
        log-probs and newest tokens, and their parents' rows of the step's ``state``."""
        parents, survivors = chosen.parents, chosen.survivors
        for sentence in self.sentences:
            sentence.t += 1
        pairs = zip(parents, survivors, strict=True)
        self.paths = [self.paths[row] + (token,) for row, (_, token) in pairs]
        self.scores, self.tokens = _next_beams(survivors, self.k, self.device)  # (b', K), (b'·K, 1)
        self.state = state.index_select(torch.tensor(parents, device=self.device))  # (b'·K,) rows

    @torch.inference_mode()
    def remove(self, keys: Sequence[Hashable]) -> list[Hashable]:
        """Take the sentences ``keys`` out of the batch (no longer wanted); returns the keys of
        those that were in it."""
        wanted = set(keys)
        keep = [r for r, s in enumerate(self.sentences) if s.key not in wanted]
        gone = [s.key for s in self.sentences if s.key in wanted]
        if not gone:
            return []
        rows = [r * self.k + i for r in keep for i in range(self.k)]  # (b'·K,) their beams
        self.sentences = [self.sentences[r] for r in keep]
        self.paths = [self.paths[row] for row in rows]
        if keep:
            index = torch.tensor(rows, device=self.device)
            self.state = self.state.index_select(index)  # (b'·K,) rows
            self.scores = self.scores[torch.tensor(keep, device=self.device)]  # (b', K)
            self.tokens = self.tokens.index_select(0, index)  # (b'·K, 1)
        else:
            release_state(self.state)
        return gone

    @torch.inference_mode()
    def merge(self, other: SteppedBeamSearch) -> None:
        """Take in the sentences of ``other`` (same rules and step function; at any step of
        either; states that join: :func:`~aiayn.decoding.step.join_states`): from now on they
        run in this batch, each at its own step."""
        if other.rules != self.rules:
            raise ValueError("only searches with the same rules merge")
        if not self.sentences:  # nothing runs here: the other's batch as it is
            self.state, self.scores, self.tokens = other.state, other.scores, other.tokens
            self.paths, self.stepped = other.paths, other.stepped
        elif other.sentences:
            self.state = join_states([self.state, other.state])
            self.scores = torch.cat([self.scores, other.scores])  # (b + b', K)
            self.tokens = torch.cat([self.tokens, other.tokens])  # (b·K + b'·K, 1)
            self.paths = self.paths + other.paths
            self.stepped = self.stepped or other.stepped
        self.sentences += other.sentences
        other.sentences, other.paths = [], []


def _first_beams(
    batch_size: int, k: int, bos_id: int, device: torch.device | str
) -> tuple[Tensor, Tensor]:
    """(log P of each beam (B, K), the first tokens (B·K, 1)): one live beam per sentence to
    start (the others would duplicate it), each fed BOS."""
    scores = torch.full((batch_size, k), -math.inf, device=device)  # (B, K)
    scores[:, 0] = 0.0
    tokens = torch.full((batch_size * k, 1), bos_id, dtype=torch.long, device=device)  # (B·K, 1)
    return scores, tokens


def _top(
    log_probs: Tensor,
    scores: Tensor,
    constrain: Callable[[Tensor, list[int], list[bool]], Tensor],
    steps: list[int],
    at_limit: list[bool],
) -> tuple[tuple[Tensor, Tensor], int]:
    """Each sentence's 2K best candidates (scores, indices into K·V), both (b, 2K), and V: the
    step's log-probs (b·K, V) under the style's constraints (each sentence at its step t, in
    ``steps``), added to the beams' scores (b, K)."""
    b, k = scores.shape
    vocab = log_probs.size(-1)
    log_probs = constrain(log_probs.view(b, k, vocab).float(), steps, at_limit)  # (b, K, V)
    candidates = (scores[:, :, None] + log_probs).view(b, k * vocab)  # (b, K·V)
    return top_candidates(candidates, min(2 * k, k * vocab)), vocab


def _next_beams(
    survivors: list[tuple[float, int]], k: int, device: torch.device | str
) -> tuple[Tensor, Tensor]:
    """The survivors' log-probs (b', K) and newest tokens (b'·K, 1), back on the device (the
    float32 values' round trip through the host is exact)."""
    scores = torch.tensor([lp for lp, _ in survivors], dtype=torch.float32, device=device)
    tokens = torch.tensor([token for _, token in survivors], device=device)[:, None]
    return scores.view(-1, k), tokens


class _Row(NamedTuple):
    """What :func:`_select` needs of the step: K, V and which sentences are at their length
    limit."""

    k: int
    vocab: int
    at_limit: list[bool]


@dataclass
class _Chosen:
    """One step's outcome: the sentences still searching (their places in the batch), the rows
    of their surviving beams' parents (b'·K,), and the survivors' (log-prob, newest token)."""

    kept: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    survivors: list[tuple[float, int]] = field(default_factory=list)


def _select(
    sentences: list[_Sentence],
    top: tuple[Tensor, Tensor],
    row: _Row,
    paths: list[tuple[int, ...]],
    rules: _Rules,
) -> _Chosen:
    """On the host, from one copy of each sentence's 2K best candidates ``top`` (scores,
    indices): end hypotheses (added to the sentence's ``finished``), and keep the K survivors
    of each sentence still searching."""
    chosen = _Chosen()
    top_scores, top_index = top
    for r, (s, row_scores, row_index) in enumerate(
        zip(sentences, top_scores.tolist(), top_index.tolist(), strict=True)
    ):
        outcome = _advance(
            row_scores, row_index, r * row.k, row.vocab, paths, rules, row.at_limit[r]
        )
        if outcome.finished:  # s.finished is keep's: sorted, at most K
            s.finished = rules.keep(s.finished + outcome.finished)
        live = [lp for lp, _ in outcome.survivors]
        if not rules.done(s.finished, live, s.t, s.limit, row.at_limit[r]):
            chosen.kept.append(r)
            chosen.parents.extend(outcome.parents)
            chosen.survivors.extend(outcome.survivors)
    return chosen


@dataclass
class _Outcome:
    """One sentence's outcome of a step: hypotheses ended here, and the K beams living on
    (their parents' rows, log-probabilities and newest tokens), best first."""

    finished: list[Hypothesis]
    parents: list[int]
    survivors: list[tuple[float, int]]


def _advance(
    top_scores: list[float],
    top_index: list[int],
    first_row: int,
    vocab: int,
    paths: list[tuple[int, ...]],
    rules: _Rules,
    at_limit: bool,
) -> _Outcome:
    """One sentence's 2K best candidates (log-probs, indices into K·V, best first) -> its step.

    Candidates that the style ends (EOS; "hf": any at the limit) become finished hypotheses when
    among the K best; the K best others live on (there are K of them away from the limit: each
    beam has one EOS candidate).
    """
    outcome = _Outcome([], [], [])
    for rank, (lp, index) in enumerate(zip(top_scores, top_index, strict=True)):
        beam, token = divmod(index, vocab)
        if rules.ends(token, at_limit):
            if rank < rules.k and math.isfinite(lp):
                outcome.finished.append(rules.hypothesis(paths[first_row + beam], token, lp))
        elif len(outcome.survivors) < rules.k:
            outcome.parents.append(first_row + beam)
            outcome.survivors.append((lp, token))
    return outcome


def top_candidates(candidates: Tensor, n: int, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """The n largest values of each row of ``candidates`` (b, M), largest first, and their
    indices: ``torch.topk``'s values exactly, found in fewer passes over long rows.

    CPU ``topk`` copies every element of a row into its selection buffer (the cost is in
    docs/performance.md). Here only a vectorised maximum reads every element: the row is cut
    into chunks of ``chunk`` elements (default
    :attr:`~aiayn.settings.PerformanceSettings.topk_chunk`), and the n elements sought lie in
    the n chunks with the largest maxima (an element among the n largest is at least the n-th
    largest value, and so is its chunk's maximum; fewer than n chunks can have a larger one).
    ``topk`` then runs over those n · chunk elements only. Among equal values the indices
    returned may differ from ``topk``'s, whose order between ties is unspecified too. Rows of
    fewer than :attr:`~aiayn.settings.PerformanceSettings.chunked_topk_min_candidates`
    candidates, and other devices (not measured), take one ``topk``.
    """
    b, m = candidates.shape
    settings = performance()
    chunk = settings.topk_chunk if chunk is None else chunk
    chunks = -(-m // chunk)
    if candidates.device.type != "cpu" or m < settings.chunked_topk_min_candidates or chunks <= n:
        return candidates.topk(n, dim=1)  # short rows (topk is faster there), or not CPU
    full = m // chunk  # whole chunks; the rest, if any, is one chunk padded with −inf
    blocks = candidates[:, : full * chunk].view(b, full, chunk)  # (b, C'·L) -> (b, C', L)
    maxima = blocks.amax(dim=2)  # (b, C')
    tail = None
    if full < chunks:  # only the last chunk is padded, not a copy of the whole row
        tail = F.pad(candidates[:, full * chunk :], (0, chunks * chunk - m), value=-math.inf)
        maxima = torch.cat([maxima, tail.amax(dim=1, keepdim=True)], dim=1)  # (b, C)
    best_chunks = maxima.topk(n, dim=1).indices  # (b, n) chunk ids
    within = best_chunks.clamp(max=full - 1)[:, :, None].expand(b, n, chunk)  # (b, n, L)
    picked = blocks.gather(1, within)  # (b, n, L)
    if tail is not None:
        is_tail = (best_chunks == full)[:, :, None]  # (b, n, 1)
        picked = torch.where(is_tail, tail[:, None, :], picked)  # (b, n, L)
    values, where = picked.view(b, n * chunk).topk(n, dim=1)  # (b, n·L) -> (b, n)
    index = best_chunks.gather(1, where // chunk) * chunk + where % chunk  # (b, n) into M
    return values, index


def _rules(
    style: str,
    k: int,
    n_best: int,
    alpha: float,
    eos_id: int,
    min_len: int,
    early_stopping: bool | str,
    forced_eos: bool,
) -> _Rules:
    """The rules of ``style`` ("gnmt" or "hf"), after checking the arguments against it."""
    if k < 1 or not 1 <= n_best <= k:
        raise ValueError(f"need beam_size >= 1 and 1 <= n_best <= beam_size, got {k}, {n_best}")
    if style == "gnmt":
        if early_stopping is not True or forced_eos:
            raise ValueError("early_stopping and forced_eos are options of length_penalty='hf'")
        return _Gnmt(k, n_best, alpha, eos_id, min_len)
    if style == "hf":
        if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
            raise ValueError(f"early_stopping must be True, False or 'never': {early_stopping!r}")
        return _HuggingFace(k, n_best, alpha, eos_id, min_len, early_stopping, forced_eos)
    raise ValueError(f"unknown length_penalty {style!r}: 'gnmt' or 'hf'")


@dataclass(frozen=True)
class _Rules(ABC):
    """What a style decides; the search loop asks these methods and never tests the style.

    ``t`` is the step: t output tokens are decoded before it, and a hypothesis ended at it has
    |Y| = t + 1 generated tokens (EOS, or at the "hf" limit the last token, included).
    """

    k: int
    n_best: int
    alpha: float
    eos_id: int
    min_len: int

    @abstractmethod
    def penalty(self, length: int) -> float:
        """lp(|Y|), the divisor of log P(Y | X)."""

    @abstractmethod
    def last_step(self, limit: int) -> int:
        """The step at which a sentence of length limit ``limit`` (its max_len) ends."""

    @abstractmethod
    def constrain(self, log_probs: Tensor, steps: list[int], at_limit: list[bool]) -> Tensor:
        """Edits (b, K, V) ``log_probs`` in place (the step's output belongs to the search):
        min_len and the length limit; ``steps`` (b,) is each sentence's step t, ``at_limit``
        (b,) says which sentences take their last step."""

    @abstractmethod
    def ends(self, token: int, at_limit: bool) -> bool:
        """Whether a candidate ending in ``token`` is a finished hypothesis, not a live beam."""

    def keep(self, hyps: list[Hypothesis]) -> list[Hypothesis]:
        """The finished hypotheses a sentence keeps, of those it has: the K best (both
        styles)."""
        return sorted(hyps, key=lambda h: -h.score)[: self.k]

    def done(
        self, hyps: list[Hypothesis], live: list[float], t: int, limit: int, at_limit: bool
    ) -> bool:
        """Whether a sentence stops after step ``t``, given the kept ``hyps`` and the K live
        beams' log-probabilities: at its length limit, with no live beam of finite
        log-probability left, or once the style's rule (:meth:`settled`) says so."""
        if at_limit or not any(math.isfinite(x) for x in live):
            return True
        return self.settled(hyps, live, t, limit)

    @abstractmethod
    def settled(self, hyps: list[Hypothesis], live: list[float], t: int, limit: int) -> bool:
        """Whether a sentence with live beams of finite ``live`` log-probabilities, before its
        length limit, stops after step ``t`` with the kept ``hyps``."""

    def hypothesis(self, path: tuple[int, ...], token: int, log_prob: float) -> Hypothesis:
        """``path`` (t tokens) ended by ``token``: EOS is dropped, any other token kept."""
        tokens = list(path) if token == self.eos_id else [*path, token]
        return Hypothesis(tokens, log_prob, log_prob / self.penalty(len(path) + 1))


@dataclass(frozen=True)
class _Gnmt(_Rules):
    """GNMT's penalty (eq. 14); ``max_len`` output tokens, then EOS is forced; a sentence is
    done when the exact bound says no live beam can beat its n-th best (module docstring:
    tensor2tensor's rule). The K best finished hypotheses are kept."""

    def penalty(self, length: int) -> float:
        return gnmt_length_penalty(length, self.alpha)

    def last_step(self, limit: int) -> int:
        return limit

    def constrain(self, log_probs: Tensor, steps: list[int], at_limit: list[bool]) -> Tensor:
        early = [t < self.min_len for t in steps]
        return _constrain(log_probs, self.eos_id, early=early, at_limit=at_limit)

    def ends(self, token: int, at_limit: bool) -> bool:
        return token == self.eos_id

    def settled(self, hyps: list[Hypothesis], live: list[float], t: int, limit: int) -> bool:
        if len(hyps) < self.n_best:
            return False
        nth_best = hyps[self.n_best - 1].score  # hyps are keep's: best first
        return max(live) / self.penalty(limit + 1) <= nth_best


@dataclass(frozen=True)
class _HuggingFace(_Rules):
    """HF ``generate``'s beam search (``_beam_search`` and its helpers).

    Length limit: ``max_len`` is ``max_new_tokens``; the step choosing the last allowed token is
    the last, and its K best candidates all end there (``MaxLengthCriteria``), EOS or not, scored
    with |Y| = max_len. Only the K best finished hypotheses are kept (``_update_finished_beams``).
    Done (``_check_early_stop_heuristic``, ``_beam_search_has_unfinished_sequences``): at the
    limit, or once K are finished and, by ``early_stopping``,

    * True: always;
    * False: unless the best live log-prob / (t + 1)^α, at the live beams' current length,
      beats the worst kept score (a heuristic: longer beams may still beat it when α > 0);
    * "never": as False, but with the length limit for t + 1 when α > 0 (an exact bound).

    Not reproduced: HF's empty beams hold log-prob −1e9, not −inf, so where a sentence has fewer
    than K finite candidates at the limit (max_new_tokens = 1 with forced EOS) HF also returns
    its placeholder sequences, scored about −1e9; here the sentence has fewer hypotheses.
    """

    early_stopping: bool | str
    forced_eos: bool

    def penalty(self, length: int) -> float:
        return hf_length_penalty(length, self.alpha)

    def last_step(self, limit: int) -> int:
        if limit < 1:
            raise ValueError(f"length_penalty='hf' needs max_len (max_new_tokens) >= 1: {limit}")
        return limit - 1

    def constrain(self, log_probs: Tensor, steps: list[int], at_limit: list[bool]) -> Tensor:
        """HF's processors in HF's order: ``MinNewTokensLengthLogitsProcessor`` (EOS −inf while
        t < min_len), then ``ForcedEOSTokenLogitsProcessor`` at the limit (all −inf, EOS 0)."""
        _ban_eos(log_probs, self.eos_id, [t < self.min_len for t in steps])
        if self.forced_eos and any(at_limit):
            rows = torch.tensor(at_limit, device=log_probs.device)  # (b,)
            log_probs[rows] = -math.inf
            log_probs[rows, :, self.eos_id] = 0.0
        return log_probs

    def ends(self, token: int, at_limit: bool) -> bool:
        return at_limit or token == self.eos_id

    def settled(self, hyps: list[Hypothesis], live: list[float], t: int, limit: int) -> bool:
        if len(hyps) < self.k:
            return False
        if self.early_stopping is True:
            return True
        exact = self.early_stopping == "never" and self.alpha > 0
        return max(live) / self.penalty(limit if exact else t + 1) <= hyps[-1].score


def _ban_eos(log_probs: Tensor, eos_id: int, early: list[bool]) -> None:
    """EOS to −inf in the (b, K, V) ``log_probs`` of the sentences ``early`` (b,) names (those
    before min_len), in place."""
    if not any(early):
        return
    eos = log_probs.select(2, eos_id)  # (b, K) column of EOS
    if all(early):
        eos.fill_(-math.inf)
    else:
        eos.masked_fill_(torch.tensor(early, device=log_probs.device)[:, None], -math.inf)


def _constrain(
    log_probs: Tensor, eos_id: int, *, early: list[bool], at_limit: list[bool]
) -> Tensor:
    """GNMT style: forbid EOS to the sentences ``early`` (b,) names (before min_len); force EOS
    for sentences at their length limit.

    Edits (b, K, V) ``log_probs`` in place: the step's output belongs to the search. A forced
    EOS keeps its log-probability, floored at the dtype's most negative finite value.
    """
    _ban_eos(log_probs, eos_id, early)
    if any(at_limit):
        only_eos = torch.tensor(at_limit, device=log_probs.device)  # (b,)
        floor = torch.finfo(log_probs.dtype).min
        eos_column = log_probs[only_eos][..., eos_id].clamp(min=floor)  # (b', K)
        log_probs[only_eos] = -math.inf
        log_probs[only_eos, :, eos_id] = eos_column
    return log_probs
