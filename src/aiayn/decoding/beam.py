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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
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
    history = torch.zeros(batch_size * k, 0, dtype=torch.long, device=device)  # (B·K, t)
    active = list(range(batch_size))  # sentence id of each row block
    first_row = torch.arange(batch_size, device=device)[:, None] * k  # (b, 1) row of beam 0
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    for t in range(int(max(limits)) + 1):
        log_probs, state = step(tokens, state)  # (b·K, V)
        vocab = log_probs.size(-1)
        log_probs = log_probs.view(len(active), k, vocab).float()  # (b, K, V)
        at_limit = [t >= limits[s] for s in active]  # (b,) on the host
        log_probs = _constrain(log_probs, eos_id, allow_eos=t >= min_len, at_limit=at_limit)
        candidates = (scores[:, :, None] + log_probs).view(len(active), k * vocab)  # (b, K·V)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)  # (b, 2K)
        is_eos = top_index % vocab == eos_id  # (b, 2K)
        # the K best non-EOS candidates live on (there are K: each beam has one EOS candidate)
        chosen = is_eos.argsort(dim=1, stable=True)[:, :k]  # (b, K) non-EOS first, best first
        scores = top_scores.gather(1, chosen)  # (b, K)
        survivor = top_index.gather(1, chosen)  # (b, K) index into K·V
        rows = (first_row + survivor // vocab).view(-1)  # (b·K,) the parent beams' rows
        # EOS among the K best candidates ends a hypothesis: decided on the host
        host_scores, host_index = top_scores[:, :k].tolist(), top_index[:, :k].tolist()
        for r, s in enumerate(active):
            for lp, index in zip(host_scores[r], host_index[r], strict=True):
                if index % vocab == eos_id and math.isfinite(lp):
                    seq = history[r * k + index // vocab].tolist()
                    score = lp / gnmt_length_penalty(len(seq) + 1, alpha)
                    finished[s].append(Hypothesis(seq, lp, score))
        history = torch.cat([history[rows], (survivor % vocab).view(-1, 1)], dim=1)  # (b·K, t+1)
        live = scores.tolist()  # (b, K) on the host
        keep = [
            not _done(finished[s], live[r], k, n_best, alpha, limits[s], at_limit[r])
            for r, s in enumerate(active)
        ]
        if not any(keep):
            break
        if not all(keep):  # some sentences are done: drop their rows
            kept = torch.tensor(keep, device=device)  # (b,)
            keep_rows = kept.repeat_interleave(k)  # (b·K,)
            rows, history, scores = rows[keep_rows], history[keep_rows], scores[kept]
            active = [s for s, kept in zip(active, keep, strict=True) if kept]
            first_row = first_row[: len(active)]
        state = state.index_select(rows)
        tokens = history[:, -1:]  # (b'·K, 1)
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]


def _constrain(log_probs: Tensor, eos_id: int, *, allow_eos: bool, at_limit: list[bool]) -> Tensor:
    """Forbid EOS before min_len; force EOS for sentences at their length limit.

    Edits (b, K, V) ``log_probs`` in place: the step's output belongs to the search. A forced
    EOS keeps its log-probability, floored at the dtype's most negative finite value.
    """
    if not allow_eos:
        log_probs[..., eos_id] = -math.inf
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
