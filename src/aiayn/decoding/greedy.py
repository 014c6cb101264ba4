"""Greedy search: the most probable next token at every step, until EOS.

Shape legend:  B batch   V vocabulary   t tokens decoded so far
"""

from __future__ import annotations

import torch

from aiayn.decoding.argmax import first_argmax
from aiayn.decoding.step import DecoderState, StepFunction


@torch.inference_mode()  # no autograd bookkeeping (version counters, views) per op
def greedy_search(
    step: StepFunction,
    state: DecoderState,
    *,
    bos_id: int,
    eos_id: int,
    max_len: torch.Tensor | int,
    batch_size: int,
    min_len: int = 0,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Greedy decoding over ``step``.

    Args:
        step, state: e.g. from :func:`~aiayn.decoding.step.encoder_decoder_step`.
        max_len: per-sentence (B,) or global maximum number of output tokens (EOS excluded).
        batch_size: B.
        min_len: EOS is not allowed before this many output tokens.

    Returns:
        B token lists, without BOS/EOS.
    """
    limit = torch.as_tensor(max_len, device=device).expand(batch_size)  # (B,)
    tokens = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)  # (B, 1)
    outputs = []
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)  # (B,)
    all_eos = torch.full((batch_size,), eos_id, dtype=torch.long, device=device)  # (B,)
    ends = set(limit.tolist())  # the steps at which some sentence reaches its limit
    last = max(ends)
    several = batch_size > 1  # one sentence is never finished while it runs: nothing to mask
    for t in range(last + 1):  # every sentence has ended by step `last` (at its limit or before)
        if t in ends:  # these sentences are at their length limit: they end here
            finished |= limit == t
            if bool(finished.all()):  # every sentence has ended: EOS, no step run
                outputs.append(all_eos)
                break
        log_probs, state = step(tokens, state)  # (B, V)
        if t < min_len:
            log_probs.select(1, eos_id).fill_(-torch.inf)  # (B,) column of EOS
        next_token = first_argmax(log_probs)  # (B,)
        if several:
            next_token.masked_fill_(finished, eos_id)  # finished sentences only repeat EOS
        outputs.append(next_token)
        if torch.equal(next_token, all_eos):  # every sentence has ended
            break
        if several:
            torch.eq(next_token, eos_id, out=finished)  # those ended before and ending now
        tokens = next_token.unsqueeze(1)  # (B,) -> (B, 1)
    rows = torch.stack(outputs, dim=1).tolist()  # (B, t)
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]
