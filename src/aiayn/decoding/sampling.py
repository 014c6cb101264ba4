"""Sampling for generation: temperature, top-k and nucleus (top-p), seedable.

    p_T(k) ∝ exp(logit_k / T);  top-k keeps the k most probable tokens;  top-p keeps the smallest
    set of most probable tokens whose probability reaches p (Holtzman et al. 2020) — always at
    least the most probable one.

Shape legend:  B batch   V vocabulary
"""

from __future__ import annotations

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
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Draw one output per row from the (filtered, tempered) model distribution.

    Pass a seeded ``torch.Generator`` for reproducible samples.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    limit = torch.as_tensor(max_len, device=device).expand(batch_size)  # (B,)
    tokens = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)  # (B, 1)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    outputs = []
    for t in range(int(limit.max()) + 1):
        log_probs, state = step(tokens, state)  # (B, V)
        logits = log_probs.float() / temperature
        if t < min_len:
            logits[:, eos_id] = -torch.inf
        logits = filter_logits(logits, top_k=top_k, top_p=top_p)
        drawn = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]  # (B,)
        drawn = torch.where(finished | (t >= limit), eos_id, drawn)
        outputs.append(drawn)
        finished |= drawn == eos_id
        if bool(finished.all()):
            break
        tokens = drawn[:, None]
    rows = torch.stack(outputs, dim=1).tolist()
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]
