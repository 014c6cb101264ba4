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

from aiayn.data.tokenizer import BOS_ID
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


def encoder_decoder_step(
    model: Transformer, src: Tensor, *, banned: tuple[int, ...] | None = None
) -> tuple[StepFunction, Seq2SeqState]:
    """Encode ``src`` (B, S) once and return the step function and its initial state.

    The step's log-probabilities are the model's own, except for the ``banned`` tokens (default:
    PAD and BOS, which are never outputs), set to −inf without renormalising the rest.
    """
    banned = (model.config.pad_id, BOS_ID) if banned is None else banned
    banned_ids = torch.tensor(banned, dtype=torch.long, device=src.device)  # once, not per step
    src_mask = model.source_mask(src)  # (B, 1, 1, S)
    memory = model.encoder(src, src_mask).memory  # (B, S, D)

    def step(tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        assert isinstance(state, Seq2SeqState)
        out = model.decode(
            tokens, state.memory, state.src_mask, cache=state.cache, offset=state.offset
        )
        log_probs = model.log_probs(out.hidden[:, -1])  # (B, D) -> (B, V)
        if banned:
            log_probs.index_fill_(1, banned_ids, -torch.inf)
        return log_probs, Seq2SeqState(state.src_mask, None, out.cache, state.offset + 1)

    return step, Seq2SeqState(src_mask, memory, None, 0)
