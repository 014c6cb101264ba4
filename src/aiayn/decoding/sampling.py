"""Sampling for generation: temperature, top-k and nucleus (top-p), seedable.

    p_T(k) ∝ exp(logit_k / T);  top-k keeps the k most probable tokens;  top-p keeps the smallest
    set of most probable tokens whose probability reaches p (Holtzman et al. 2020) — always at
    least the most probable one.

Values that underflow mean the top token (:func:`sample_tokens`): where a row's tempered,
filtered logits are no distribution in float32 — a temperature so small that ``log_prob / T``
overflows (or that rounds to 0 in float32: 1e-300, 5e-324), a top-p that rounds to 0 (an empty
nucleus) — the row takes greedy search's choice, its most probable allowed token (the lowest id
among equals, as ``argmax``), never a NaN draw. Every other row is drawn exactly as before.

Shape legend:  B batch   V vocabulary
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.decoding.argmax import first_argmax
from aiayn.decoding.step import DecoderState, StepFunction


def filter_logits(
    logits: Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Set logits outside the top-k / top-p support to −inf. (B, V) -> (B, V).

    The most probable token always stays: a ``top_p`` that rounds to 0 in the logits' dtype
    (an empty nucleus, e.g. 1e-300 in float32) keeps only the row's top token (the first of
    equals, as ``argmax``)."""
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if float(torch.tensor(top_p, dtype=logits.dtype)) == 0.0:  # no nucleus: the top token
            return _only(logits, first_argmax(logits))
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the better tokens
        drop_sorted = mass_before >= top_p  # the first token always stays (mass_before = 0)
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, -torch.inf)
    return logits


def _only(logits: Tensor, top: Tensor) -> Tensor:
    """``logits`` (B, V) with every token but ``top`` (B,) of each row at −inf."""
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, top[:, None], True)
    return logits.masked_fill(~keep, -torch.inf)


def sample_tokens(
    log_probs: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> Tensor:
    """One token per row of (B, V) log-probabilities (banned tokens at −inf): a draw from
    softmax(filtered(log_probs / T)), with one generator or one per row. (B, V) -> (B,).

    A row where that distribution does not exist in float32 takes its top token instead (the
    first most probable allowed token: greedy search's choice): T so small that a finite
    ``log_prob / T`` overflows, or T rounding to 0 in float32 (0/0 is NaN), or no finite logit
    left (an empty nucleus). Its generator still draws (from the one-hot distribution), so the
    other rows' draws stay those of before; every other row's token is exactly as before.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    log_probs = log_probs.float()
    logits = filter_logits(log_probs / temperature, top_k=top_k, top_p=top_p)  # (B, V)
    probs = logits.softmax(dim=-1)  # (B, V)
    degenerate = _degenerate(log_probs, logits, temperature)  # (B,)
    if not bool(degenerate.any()):
        return _draw(probs, generator)
    top = first_argmax(log_probs)  # (B,) greedy's choice
    one_hot = torch.nn.functional.one_hot(top, probs.size(-1)).to(probs.dtype)  # (B, V)
    probs = torch.where(degenerate[:, None], one_hot, probs)
    return torch.where(degenerate, top, _draw(probs, generator))


def _degenerate(log_probs: Tensor, logits: Tensor, temperature: float) -> Tensor:
    """(B,) the rows whose tempered, filtered ``logits`` are no distribution: no finite
    maximum (all −inf, a NaN, a +inf), or a finite log-probability whose ``/ temperature``
    overflowed (only T < 1 can: |x / T| ≤ |x| otherwise)."""
    bad = ~logits.amax(dim=-1).isfinite()  # (B, V) -> (B,)
    if temperature < 1:
        lowest = log_probs.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).amin(dim=-1)  # (B,)
        bad |= (lowest / temperature).isinf()  # the row's most negative finite one overflowed
    return bad


@torch.inference_mode()  # no autograd bookkeeping (version counters, views) per op
def sample(
    step: StepFunction,
    state: DecoderState,
    *,
    batch_size: int,
    bos_id: int,
    eos_id: int,
    max_len: Tensor | int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_len: int = 0,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Draw one output per row from the (filtered, tempered) model distribution.

    Pass a seeded ``torch.Generator`` for reproducible samples, or one generator per row: each
    row then draws from its own, so its sample does not depend on the other rows of the batch.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if isinstance(generator, Sequence) and len(generator) != batch_size:
        raise ValueError(f"need one generator per row: {len(generator)} for {batch_size}")
    limit = torch.as_tensor(max_len, device=device).expand(batch_size)  # (B,)
    eos = torch.tensor([eos_id], device=device)
    tokens = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)  # (B, 1)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    outputs = []
    last = int(limit.max())
    for t in range(last + 1):
        if t == last:  # every row ends here (at its limit or before): EOS, no step run
            outputs.append(torch.full_like(finished, eos_id, dtype=torch.long))
            break
        log_probs, state = step(tokens, state)  # (B, V)
        if t < min_len:
            log_probs = log_probs.float().index_fill(-1, eos, -torch.inf)  # a copy: no EOS yet
        drawn = sample_tokens(
            log_probs, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )  # (B,)
        drawn = torch.where(finished | (t >= limit), eos_id, drawn)
        outputs.append(drawn)
        finished |= drawn == eos_id
        if bool(finished.all()):
            break
        tokens = drawn[:, None]
    rows = torch.stack(outputs, dim=1).tolist()
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]


def _draw(probs: Tensor, generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor:
    """One token per row of (B, V) ``probs``: (B,) ids, with one generator or one per row."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B, 1) -> (B,)
    rows = [torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generator, strict=True)]
    return torch.cat(rows)  # B × (1,) -> (B,)
