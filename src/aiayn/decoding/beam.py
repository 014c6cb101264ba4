"""Beam search with the GNMT length penalty (§6.1: beam 4, α = 0.6, max length = input + 50).

Length penalty (Wu et al. 2016, "GNMT"), the formula libraries disagree on, named here:

    lp(Y) = ((5 + |Y|) / (5 + 1))^α,     score(Y) = log P(Y | X) / lp(Y)

where |Y| counts the output tokens *including* the final EOS (fairseq counts it too; Hugging
Face divides by length^α instead). α = 0 is plain log-probability.

Batched over sentences × beams (rows ``b·K + k``); a sentence leaves the batch as soon as it is
done, so the others run on a smaller batch. A sentence is done when it has K finished hypotheses
(as in fairseq), or when no live beam can still beat its n-th best finished one: live beams only
lose log-probability, so their best possible score is ``best live log-prob / lp(max length)``
(an exact bound, since log-probabilities are ≤ 0 and lp grows with length).

Shape legend:  B sentences   b sentences still searching   K beam size   V vocabulary   t step
               M candidates per sentence (K·V)   C chunks of L candidates   n candidates kept
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding.step import DecoderState, StepFunction


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^α with |Y| including EOS (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


@dataclass(frozen=True)
class Hypothesis:
    """A finished output sequence.

    Attributes:
        tokens: output ids without BOS and EOS.
        log_prob: log P(Y | X), EOS included.
        score: ``log_prob / lp(len(tokens) + 1)``, what the beam ranks by.
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
    device: torch.device | str = "cpu",
) -> list[list[Hypothesis]]:
    """Beam search over ``step``; returns, per sentence, its ``n_best`` hypotheses, best first.

    The device scores the candidates and keeps the 2K best per sentence; the host, from one copy
    of those, ends hypotheses at EOS, picks the K survivors and keeps their token histories.

    Args:
        step, state: the step function and the initial state for ``batch_size`` sentences.
        beam_size: K (1 = greedy search).
        max_len: per-sentence (B,) or global maximum of output tokens, EOS excluded.
        min_len: EOS is not allowed before this many output tokens.
        alpha: α of the length penalty (0.6 in §6.1).
        n_best: how many hypotheses to return per sentence (≤ K).
    """
    if beam_size < 1 or not 1 <= n_best <= beam_size:
        raise ValueError(
            f"need beam_size >= 1 and 1 <= n_best <= beam_size, got {beam_size}, {n_best}"
        )
    k = beam_size
    limits = torch.as_tensor(max_len, device=device).expand(batch_size).tolist()
    state = state.repeat_interleave(k)  # row b·K + k: beam k of sentence b
    scores = torch.full((batch_size, k), -math.inf, device=device)  # (B, K) log P of each beam
    scores[:, 0] = 0.0  # one live beam to start: the others would duplicate it
    tokens = torch.full((batch_size * k, 1), bos_id, dtype=torch.long, device=device)  # (B·K, 1)
    paths: list[tuple[int, ...]] = [()] * (batch_size * k)  # per row, its output tokens so far
    active = list(range(batch_size))  # sentence id of each row block
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    for t in range(int(max(limits)) + 1):
        log_probs, state = step(tokens, state)  # (b·K, V)
        vocab = log_probs.size(-1)
        log_probs = log_probs.view(len(active), k, vocab).float()  # (b, K, V)
        at_limit = [t >= limits[s] for s in active]  # (b,) on the host
        log_probs = _constrain(log_probs, eos_id, allow_eos=t >= min_len, at_limit=at_limit)
        candidates = (scores[:, :, None] + log_probs).view(len(active), k * vocab)  # (b, K·V)
        top_scores, top_index = top_candidates(candidates, min(2 * k, k * vocab))  # (b, 2K)
        parents: list[int] = []  # rows of the surviving beams' parents, (b'·K,)
        survivors: list[tuple[float, int]] = []  # their log-probs and newest tokens
        kept = []  # sentences still searching
        for r, (s, row_scores, row_index) in enumerate(
            zip(active, top_scores.tolist(), top_index.tolist(), strict=True)
        ):
            outcome = _advance(row_scores, row_index, r * k, k, vocab, eos_id, paths, alpha)
            finished[s].extend(outcome.finished)
            live = [lp for lp, _ in outcome.survivors]
            if not _done(finished[s], live, k, n_best, alpha, limits[s], at_limit[r]):
                kept.append(s)
                parents.extend(outcome.parents)
                survivors.extend(outcome.survivors)
        if not kept:
            break
        active = kept
        paths = [paths[row] + (token,) for row, (_, token) in zip(parents, survivors, strict=True)]
        live_scores = [lp for lp, _ in survivors]  # float32 values: the round trip is exact
        scores = torch.tensor(live_scores, dtype=torch.float32, device=device).view(-1, k)
        tokens = torch.tensor([token for _, token in survivors], device=device)[:, None]
        state = state.index_select(torch.tensor(parents, device=device))  # (b'·K,) rows
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]


@dataclass
class _Outcome:
    """One sentence's outcome of a step: hypotheses ended at EOS, and the K beams living on
    (their parents' rows, log-probabilities and newest tokens), best first."""

    finished: list[Hypothesis]
    parents: list[int]
    survivors: list[tuple[float, int]]


def _advance(
    top_scores: list[float],
    top_index: list[int],
    first_row: int,
    k: int,
    vocab: int,
    eos_id: int,
    paths: list[tuple[int, ...]],
    alpha: float,
) -> _Outcome:
    """One sentence's 2K best candidates (log-probs, indices into K·V, best first) -> its step.

    EOS among the K best ends a hypothesis; the K best non-EOS candidates live on (there are K
    of them: each beam has one EOS candidate).
    """
    outcome = _Outcome([], [], [])
    for rank, (lp, index) in enumerate(zip(top_scores, top_index, strict=True)):
        beam, token = divmod(index, vocab)
        if token == eos_id:
            if rank < k and math.isfinite(lp):
                tokens = list(paths[first_row + beam])
                score = lp / gnmt_length_penalty(len(tokens) + 1, alpha)
                outcome.finished.append(Hypothesis(tokens, lp, score))
        elif len(outcome.survivors) < k:
            outcome.parents.append(first_row + beam)
            outcome.survivors.append((lp, token))
    return outcome


def top_candidates(candidates: Tensor, n: int, chunk: int = 128) -> tuple[Tensor, Tensor]:
    """The n largest values of each row of ``candidates`` (b, M), largest first, and their
    indices: ``torch.topk``'s values exactly, found in fewer passes over long rows.

    CPU ``topk`` copies every element of a row into its selection buffer (the cost is in
    docs/benchmarks.md). Here only a vectorised maximum reads every
    element: the row is cut into chunks of ``chunk`` elements, and the n elements sought lie in
    the n chunks with the largest maxima (an element among the n largest is at least the n-th
    largest value, and so is its chunk's maximum; fewer than n chunks can have a larger one).
    ``topk`` then runs over those n · chunk elements only. Among equal values the indices
    returned may differ from ``topk``'s, whose order between ties is unspecified too. Other
    devices (not measured) take one ``topk``.
    """
    b, m = candidates.shape
    chunks = -(-m // chunk)
    if candidates.device.type != "cpu" or m < 1 << 14 or chunks <= n:
        return candidates.topk(n, dim=1)  # short rows (topk is faster there), or not CPU
    padded = F.pad(candidates, (0, chunks * chunk - m), value=-math.inf)  # (b, C·L)
    blocks = padded.view(b, chunks, chunk)  # (b, C·L) -> (b, C, L)
    best_chunks = blocks.amax(dim=2).topk(n, dim=1).indices  # (b, n) chunk ids
    picked = blocks.gather(1, best_chunks[:, :, None].expand(b, n, chunk))  # (b, n, L)
    values, where = picked.view(b, n * chunk).topk(n, dim=1)  # (b, n·L) -> (b, n)
    index = best_chunks.gather(1, where // chunk) * chunk + where % chunk  # (b, n) into M
    return values, index


def _constrain(log_probs: Tensor, eos_id: int, *, allow_eos: bool, at_limit: list[bool]) -> Tensor:
    """Forbid EOS before min_len; force EOS for sentences at their length limit.

    Edits (b, K, V) ``log_probs`` in place: the step's output belongs to the search. A forced
    EOS keeps its log-probability, floored at the dtype's most negative finite value.
    """
    if not allow_eos:
        log_probs.select(2, eos_id).fill_(-math.inf)
    if any(at_limit):
        only_eos = torch.tensor(at_limit, device=log_probs.device)  # (b,)
        floor = torch.finfo(log_probs.dtype).min
        eos_column = log_probs[only_eos][..., eos_id].clamp(min=floor)  # (b', K)
        log_probs[only_eos] = -math.inf
        log_probs[only_eos, :, eos_id] = eos_column
    return log_probs


def _done(
    hyps: list[Hypothesis],
    live: list[float],
    k: int,
    n_best: int,
    alpha: float,
    limit: int,
    at_limit: bool,
) -> bool:
    """Whether a sentence can stop, given its K live log-probabilities: see the module
    docstring."""
    if at_limit or len(hyps) >= k or not any(math.isfinite(x) for x in live):
        return True
    if len(hyps) < n_best:
        return False
    nth_best = sorted((h.score for h in hyps), reverse=True)[n_best - 1]
    best_possible = max(live) / gnmt_length_penalty(limit + 1, alpha)
    return best_possible <= nth_best
