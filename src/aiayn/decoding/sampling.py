"""Sampling for generation: temperature, top-k and nucleus (top-p), seedable.

    p_T(k) ∝ exp(logit_k / T);  top-k keeps the k most probable tokens;  top-p keeps the smallest
    set of most probable tokens whose probability reaches p (Holtzman et al. 2020) — always at
    least the most probable one.

Shape legend:  B batch   V vocabulary
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.decoding.step import DecoderState, StepFunction


def filter_logits(
    logits: Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Set logits outside the top-k / top-p support to −inf. (B, V) -> (B, V)."""
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the better tokens
        drop_sorted = mass_before >= top_p  # the first token always stays (mass_before = 0)
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, -torch.inf)
    return logits


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
    tokens = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)  # (B, 1)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    outputs = []
    last = int(limit.max())
    for t in range(last + 1):
        if t == last:  # every row ends here (at its limit or before): EOS, no step run
            outputs.append(torch.full_like(finished, eos_id, dtype=torch.long))
            break
        log_probs, state = step(tokens, state)  # (B, V)
        logits = log_probs.float() / temperature
        if t < min_len:
            logits[:, eos_id] = -torch.inf
        logits = filter_logits(logits, top_k=top_k, top_p=top_p)
        drawn = _draw(logits.softmax(dim=-1), generator)  # (B,)
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
