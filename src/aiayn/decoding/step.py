"""The one step function every search is written against.

    step(tokens, state) -> (log_probs, state)

``tokens`` (B, 1) are the newest tokens; ``log_probs`` (B, V) the distribution of the next one;
``state`` is opaque to the search except for two batch operations: ``state.repeat_interleave(K)``
(each sentence becomes K beams) and ``state.index_select(index)`` (beam search keeps the surviving
beams). Decoder-only models supply their own state class with the same two methods.

Shape legend:  B batch (sentences × beams)   S source length   V vocabulary   D d_model
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import Tensor

from aiayn.data.tokenizer import BOS_ID
from aiayn.layers import DecoderLayerCache
from aiayn.models.transformer import EncoderDecoder


class DecoderState(Protocol):
    """What a search needs of a decoding state."""

    def index_select(self, index: Tensor) -> DecoderState:
        """Select/reorder batch rows: index is (B',) into B."""
        ...

    def repeat_interleave(self, repeats: int) -> DecoderState:
        """Each batch row becomes ``repeats`` consecutive rows, B -> B·repeats (beams)."""
        ...


class StepFunction(Protocol):
    """(tokens (B, 1), state) -> (log-probabilities (B, V), new state)."""

    def __call__(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """One decoding step."""
        ...


class EncoderRunner(Protocol):
    """(ids (B, S), real-token mask (B, S) or None = no padding) -> encoder output (B, S, D)."""

    def __call__(self, tokens: Tensor, real: Tensor | None = None) -> Tensor:
        """The encoder's final states (what its padded positions hold is never read)."""
        ...


@dataclass(frozen=True)
class Seq2SeqState:
    """Incremental state of the encoder–decoder model.

    The source side (mask, memory, cross-attention keys/values) is stored once per sentence even
    when G beams of it are decoded: decoder row ``b·G + g`` reads source row ``b``.

    Attributes:
        src_mask: (B, 1, 1, S) source padding mask.
        memory: (B, S, D) encoder output; only needed before the first step fills ``cache``.
        cache: per-layer self-attention keys/values (B·G, H, L, d_k) and cross-attention
            keys/values (B, H, S, d_k), or None before the first step.
        offset: number of target positions decoded so far.
        group: G, the number of consecutive decoder rows that share one source row.
    """

    src_mask: Tensor
    memory: Tensor | None
    cache: list[DecoderLayerCache] | None
    offset: int
    group: int = 1

    def repeat_interleave(self, repeats: int) -> Seq2SeqState:
        """Each decoder row becomes ``repeats`` rows (the beams); the source side is not copied."""
        rows = self.src_mask.size(0) * self.group
        index = torch.arange(rows, device=self.src_mask.device).repeat_interleave(repeats)
        cache = None if self.cache is None else [c.index_select(index, None) for c in self.cache]
        return replace(self, cache=cache, group=self.group * repeats)

    def index_select(self, index: Tensor) -> Seq2SeqState:
        """Reorder/select decoder rows (sentences or beams): index is (B'·G,) into B·G.

        The source side follows as :func:`select_source_rows` says: per sentence, untouched, or
        copied out to one source row per decoder row.
        """
        sentences, group = select_source_rows(index, self.src_mask.size(0), self.group)
        if sentences is None:
            return replace(self, cache=self._select_cache(index, None))
        return Seq2SeqState(
            self.src_mask.index_select(0, sentences),
            None if self.memory is None else self.memory.index_select(0, sentences),
            self._select_cache(index, sentences),
            self.offset,
            group,
        )

    def _select_cache(
        self, index: Tensor, sentences: Tensor | None
    ) -> list[DecoderLayerCache] | None:
        if self.cache is None:
            return None
        return [c.index_select(index, sentences) for c in self.cache]


def join_states(states: list[DecoderState]) -> DecoderState:
    """The rows of ``states`` as one batch (rows of each in order), where the states are of one
    kind that joins (a ``concat`` over one slot pool: the flattened step's, a decoder-only
    model's after its first step); ValueError otherwise, e.g. the module step's states."""
    concat = getattr(type(states[0]), "concat", None)
    if concat is None or any(type(s) is not type(states[0]) for s in states):
        raise ValueError(f"these decoding states do not join: {type(states[0]).__name__}")
    joined: DecoderState = concat(states)
    return joined


def joins(state: DecoderState) -> bool:
    """Whether ``state`` joins others of its kind (:func:`join_states`): a ``concat`` and no
    pending first step."""
    return hasattr(type(state), "concat") and getattr(state, "pending", None) is None


def advanced(state: DecoderState) -> DecoderState:
    """A joinable state (:func:`joins`) after a step wrote one position per row."""
    after: DecoderState = state.advanced()  # type: ignore[attr-defined]
    return after


def release_state(state: DecoderState) -> None:
    """Free the slots of every row of ``state`` where it holds slots (a decode that ended)."""
    release = getattr(state, "release", None)
    if release is not None:
        release()


def select_source_rows(index: Tensor, sources: int, group: int) -> tuple[Tensor | None, int]:
    """Which source rows decoder rows ``index`` need, when G = ``group`` consecutive decoder rows
    share each of ``sources`` source rows: index is (B'·G,) into B·G decoder rows.

    Returns (None, G) when every sentence keeps its G rows in place (the source side stays as it
    is; beam search's usual step, checked in one host sync); ((B',) source rows, G) when each
    group of G selected rows comes from one sentence (beam search keeps a sentence's beams
    together); else ((B'·G,) source rows, 1): one source row per decoder row.
    """
    if sources == 1 and index.numel() == group:  # one sentence: its rows, whichever they are
        return None, group
    source = index // group  # (B'·G,) source row of each selected decoder row
    if source.numel() == sources * group:
        in_place = (
            source.view(sources, group) == torch.arange(sources, device=index.device)[:, None]
        )
        if bool(in_place.all()):
            return None, group
    if group == 1:
        return source, 1
    if source.numel() % group == 0:
        groups = source.view(-1, group)  # (B', G)
        if bool((groups == groups[:, :1]).all()):
            return groups[:, 0], group
    return source, 1


def encode_source(
    model: EncoderDecoder, src: Tensor, encoder: EncoderRunner | None = None
) -> tuple[Tensor, Tensor, bool]:
    """Encode (B, S) source ids once for decoding: the encoder output (B, S, D), the (B, 1, 1, S)
    padding mask, and whether any source is padded.

    When none is (always at batch 1), no mask is applied at all, here or by the decoder's
    cross-attention: attending everywhere is what the all-True mask means, and it spares every
    cross-attention of every step the mask's work. One host sync per source batch.

    ``encoder``: what runs the model's encoder on (ids, real-token mask or None), such as
    :class:`~aiayn.inference.encoder.EncoderInference`; None = its module.
    """
    src_mask = model.source_mask(src)  # (B, 1, 1, S)
    padded = not bool(src_mask.all())
    if encoder is not None:
        memory = encoder(src, src_mask[:, 0, 0, :] if padded else None)  # (B, S, D)
    else:
        memory = model.encoder(src, src_mask if padded else None).memory  # (B, S, D)
    return memory, src_mask, padded


def banned_ids(
    model: EncoderDecoder, banned: tuple[int, ...] | None, device: torch.device
) -> Tensor | None:
    """The tokens a step never produces, as (n,) ids: ``banned``, by default PAD and BOS; None
    when there are none (the step then skips the fill)."""
    banned = (model.config.pad_id, BOS_ID) if banned is None else banned
    return torch.tensor(banned, dtype=torch.long, device=device) if banned else None


def banned_log_probs(logits: Tensor, ban: Tensor | None, *, renormalize: bool) -> Tensor:
    """(B, V) logits -> (B, V) log-probabilities in fp32 with the ``ban`` tokens at −inf: the
    model's own distribution (log-softmax, then −inf: the rest sums to less than 1), or with
    ``renormalize`` the distribution over the allowed tokens alone (−inf, then log-softmax:
    Hugging Face's ``renormalize_logits``, which takes a second log-softmax, in one).

    E.g. logits [0, 0, 0, 0] with token 3 banned: [−ln 4, −ln 4, −ln 4, −inf], or renormalised
    [−ln 3, −ln 3, −ln 3, −inf]. ``logits`` may be overwritten.
    """
    logits = logits.float()
    if ban is None:
        return torch.log_softmax(logits, dim=-1)
    if renormalize:
        return torch.log_softmax(logits.index_fill_(1, ban, -torch.inf), dim=-1)
    return torch.log_softmax(logits, dim=-1).index_fill_(1, ban, -torch.inf)


def encoder_decoder_step(
    model: EncoderDecoder,
    src: Tensor,
    *,
    banned: tuple[int, ...] | None = None,
    renormalize: bool = False,
) -> tuple[StepFunction, Seq2SeqState]:
    """Encode ``src`` (B, S) once (:func:`encode_source`) and return the step function and its
    initial state.

    The step's log-probabilities are the model's own, except for the ``banned`` tokens (default:
    PAD and BOS, which are never outputs), set to −inf; with ``renormalize``, over the allowed
    tokens alone (:func:`banned_log_probs`). The states' rows are always rows of this ``src``.
    """
    ban = banned_ids(model, banned, src.device)  # once, not per step
    memory, src_mask, padded = encode_source(model, src)

    def step(tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        assert isinstance(state, Seq2SeqState)
        memory_mask = state.src_mask if padded else None  # (B, 1, 1, S) or attend everywhere
        out = model.decode(
            tokens, state.memory, memory_mask, cache=state.cache, offset=state.offset
        )
        logits = model.logits(out.hidden[:, -1])  # (B, D) -> (B, V)
        log_probs = banned_log_probs(logits, ban, renormalize=renormalize)
        return log_probs, Seq2SeqState(
            state.src_mask, None, out.cache, state.offset + 1, state.group
        )

    return step, Seq2SeqState(src_mask, memory, None, 0)
