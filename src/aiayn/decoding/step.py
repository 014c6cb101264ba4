"""The one step function every search is written against.

    step(tokens, state) -> (log_probs, state)

``tokens`` (B, 1) are the newest tokens; ``log_probs`` (B, V) the distribution of the next one;
``state`` is opaque to the search except that it can be reordered along the batch with
``state.index_select(index)`` (beam search keeps the surviving beams). Decoder-only models supply
their own state class with the same two methods.

Shape legend:  B batch (sentences × beams)   S source length   V vocabulary   D d_model
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from aiayn.layers import DecoderLayerCache
from aiayn.models.transformer import Transformer


class DecoderState(Protocol):
    """What a search needs of a decoding state."""

    def index_select(self, index: Tensor) -> DecoderState:
        """Select/reorder batch rows: index is (B',) into B."""
        ...


class StepFunction(Protocol):
    """(tokens (B, 1), state) -> (log-probabilities (B, V), new state)."""

    def __call__(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """One decoding step."""
        ...


@dataclass(frozen=True)
class Seq2SeqState:
    """Incremental state of the encoder–decoder model.

    Attributes:
        src_mask: (B, 1, 1, S) source padding mask.
        memory: (B, S, D) encoder output; only needed before the first step fills ``cache``.
        cache: per-layer self- and cross-attention keys/values, or None before the first step.
        offset: number of target positions decoded so far.
    """

    src_mask: Tensor
    memory: Tensor | None
    cache: list[DecoderLayerCache] | None
    offset: int

    def index_select(self, index: Tensor) -> Seq2SeqState:
        """Reorder/select batch rows (sentences or beams)."""
        return Seq2SeqState(
            self.src_mask.index_select(0, index),
            None if self.memory is None else self.memory.index_select(0, index),
            None if self.cache is None else [c.index_select(index) for c in self.cache],
            self.offset,
        )


def encoder_decoder_step(model: Transformer, src: Tensor) -> tuple[StepFunction, Seq2SeqState]:
    """Encode ``src`` (B, S) once and return the step function and its initial state."""
    src_mask = model.source_mask(src)  # (B, 1, 1, S)
    memory = model.encoder(src, src_mask).memory  # (B, S, D)

    def step(tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        assert isinstance(state, Seq2SeqState)
        out = model.decode(
            tokens, state.memory, state.src_mask, cache=state.cache, offset=state.offset
        )
        log_probs = model.log_probs(out.hidden[:, -1])  # (B, D) -> (B, V)
        return log_probs, Seq2SeqState(state.src_mask, None, out.cache, state.offset + 1)

    return step, Seq2SeqState(src_mask, memory, None, 0)


@torch.no_grad()
def greedy_search(
    step: StepFunction,
    state: DecoderState,
    *,
    bos_id: int,
    eos_id: int,
    max_len: Tensor | int,
    batch_size: int,
    device: torch.device | str = "cpu",
) -> list[list[int]]:
    """Greedy decoding: at each step take the most probable token, until EOS or ``max_len``.

    Args:
        step, state: from e.g. :func:`encoder_decoder_step`.
        max_len: per-sentence (B,) or global maximum number of output tokens (EOS excluded).
        batch_size: B.

    Returns:
        B token lists, without BOS/EOS.
    """
    limit = torch.as_tensor(max_len, device=device).expand(batch_size)  # (B,)
    tokens = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=device)  # (B, 1)
    outputs = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # (B, t)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)  # (B,)
    for t in range(int(limit.max().item()) + 1):
        log_probs, state = step(tokens, state)  # (B, V)
        next_token = log_probs.argmax(dim=-1)  # (B,)
        next_token = torch.where(finished | (t >= limit), eos_id, next_token)
        outputs = torch.cat([outputs, next_token[:, None]], dim=1)  # (B, t + 1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
        tokens = next_token[:, None]  # (B, 1)
    return [_cut_at_eos(row, eos_id) for row in outputs.tolist()]


def _cut_at_eos(tokens: list[int], eos_id: int) -> list[int]:
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens
