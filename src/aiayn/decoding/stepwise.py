"""Greedy search and sampling one step at a time, each sequence leaving the batch the step it
ends: what a server needs to answer a request as soon as its own outputs are done, while the
others go on (``aiayn serve``, :mod:`aiayn.serving.decode`).

:class:`SteppedSearch` gives, sequence for sequence, the outputs of
:func:`~aiayn.decoding.greedy.greedy_search` and :func:`~aiayn.decoding.sampling.sample` with
one generator per row (tests hold them equal): the same limits (a row with limit m gives at most
m tokens; EOS is not allowed before ``min_len``), the same choice per row. Where those functions
keep a finished row in the batch, repeating EOS until every row is done, it leaves here
(``state.index_select``: its slot is freed), so the rest run on a smaller batch; the searches
are batch-invariant, so no row's output changes. A step can also be made by the caller for
several searches at once (:meth:`SteppedSearch.begin`, one model call over their joined states,
then :meth:`SteppedSearch.end` with each search's share): rows of different searches, started
at different steps and with different options, step together, each at its own positions;
every row counts its own tokens.

Shape legend:  B rows still decoding   V vocabulary   M the longest limit
               E rows ending at a step
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from aiayn.decoding.argmax import first_argmax
from aiayn.decoding.sampling import sample_tokens
from aiayn.decoding.step import DecoderState, StepFunction, join_states, release_state


@dataclass(frozen=True)
class Sampling:
    """Sampling's parameters (see :func:`~aiayn.decoding.sampling.sample`)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


@dataclass
class Row:
    """One sequence being decoded: its caller's key, its limit (tokens, EOS excluded), its
    generator (sampling) and its tokens: set when it leaves the batch (while it runs, by
    :meth:`SteppedSearch.current_tokens`)."""

    key: Hashable
    limit: int
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)


class SteppedSearch:
    """Greedy search (``sampling`` None) or sampling over ``step``, one :meth:`advance` at a time.

    Its per-step bookkeeping is on tensors: each row's tokens so far, their count and its limit
    are columns of (B, M), (B,) and (B,) tensors, so a step's checks (limit reached, EOS, EOS
    allowed yet) are vectorised and the Python work of a step grows with the rows that end at
    it, not with the rows running.

    Args:
        step, state: the step function and the initial state of ``len(keys)`` rows.
        keys: one key per row (how :meth:`advance` names the rows that end).
        limits: per row, the most tokens it produces (EOS excluded).
        generators: sampling: one generator per row.
    """

    def __init__(
        self,
        step: StepFunction,
        state: DecoderState,
        keys: Sequence[Hashable],
        limits: Sequence[int],
        *,
        bos_id: int,
        eos_id: int,
        min_len: int = 0,
        sampling: Sampling | None = None,
        generators: Sequence[torch.Generator] | None = None,
        device: torch.device | str = "cpu",
    ):
        if len(limits) != len(keys) or (generators is not None and len(generators) != len(keys)):
            raise ValueError("need one limit (and one generator when sampling) per row")
        if sampling is not None and generators is None:
            raise ValueError("sampling needs one generator per row")
        gens = list(generators) if generators is not None else [None] * len(keys)
        self.rows = [Row(k, int(m), g) for k, m, g in zip(keys, limits, gens, strict=True)]
        self.step, self.state = step, state
        self.eos_id, self.min_len, self.sampling = eos_id, min_len, sampling
        self.device = device
        self.stepped = False  # whether a step has run (the state is past its first step)
        self.tokens = torch.full((len(keys), 1), bos_id, dtype=torch.long, device=device)
        b, widest = len(self.rows), max((r.limit for r in self.rows), default=0)
        self.limits = torch.tensor([r.limit for r in self.rows], dtype=torch.long)  # (B,)
        self.lengths = torch.zeros(b, dtype=torch.long)  # (B,) tokens so far
        self.out = torch.zeros((b, widest), dtype=torch.long)  # (B, M) tokens so far, on CPU
        self._leaving: list[Row] = []  # rows at their limit, taken out by begin()
        self.appended = 0  # tokens the latest step appended (its rows but those ending by EOS)

    @property
    def done(self) -> bool:
        """Whether every row has ended."""
        return not self.rows

    @torch.inference_mode()
    def advance(self) -> list[Row]:
        """One step: the rows that end at it (at their limit, or by EOS), which leave."""
        if not self.begin():
            return self.end(None, None)
        log_probs, state = self.step(self.tokens, self.state)  # (B, V)
        return self.end(log_probs, state)

    def begin(self) -> bool:
        """Before a step: the rows at their limit leave (:meth:`end` returns them); whether
        rows are left to step (``tokens`` and ``state`` are then the step's inputs)."""
        at_limit = (self.lengths >= self.limits).nonzero().flatten()  # (E,)
        self._leaving = self._remove_at(at_limit.tolist())
        return bool(self.rows)

    @torch.inference_mode()
    def end(self, log_probs: Tensor | None, state: DecoderState | None) -> list[Row]:
        """After the step made of :meth:`begin`'s inputs, its (B, V) log-probs and next state
        (None when there was no row to step): the rows that end, which leave."""
        ended, self._leaving, self.appended = self._leaving, [], 0
        if log_probs is None or state is None:
            return ended
        self.state = state
        chosen = self._choose(log_probs)  # (B,)
        self.stepped = True
        picked = chosen.cpu()  # (B,)
        eos = picked == self.eos_id  # (B,)
        at = torch.arange(picked.numel())  # (B,)
        self.out[at, self.lengths] = picked  # below each row's limit: it stepped
        self.lengths += (~eos).long()
        finished = eos.nonzero().flatten().tolist()  # the rows ending by EOS
        self.tokens = chosen[:, None]  # (B, 1)
        self.appended = len(self.rows) - len(finished)
        return ended + self._remove_at(finished)

    def current_tokens(self) -> None:
        """Set each running row's ``tokens`` to its tokens so far (for a caller that reads them
        between steps: stop strings, streaming)."""
        for row, tokens, n in zip(self.rows, self.out.tolist(), self.lengths.tolist(), strict=True):
            row.tokens = tokens[:n]

    def remove(self, keys: Sequence[Hashable]) -> list[Row]:
        """Take the rows ``keys`` out of the batch (ended, or no longer wanted); returns them.
        Their slots are freed (the state's ``index_select``; ``release`` when none is left)."""
        wanted = set(keys)
        if not wanted:
            return []
        return self._remove_at([i for i, r in enumerate(self.rows) if r.key in wanted])

    def _remove_at(self, gone: list[int]) -> list[Row]:
        """Take the rows at batch positions ``gone`` out, their tokens set; returns them."""
        if not gone:
            return []
        out = [self.rows[i] for i in gone]
        for i, row, n in zip(gone, out, self.lengths[gone].tolist(), strict=True):
            row.tokens = self.out[i, :n].tolist()
        kept = torch.ones(len(self.rows), dtype=torch.bool)  # (B,)
        kept[gone] = False
        keep = kept.nonzero().flatten()  # (B',)
        self.rows = [self.rows[i] for i in keep.tolist()]
        self.out, self.lengths, self.limits = self.out[keep], self.lengths[keep], self.limits[keep]
        if self.rows:
            index = keep.to(self.tokens.device)
            self.state = self.state.index_select(index)  # (B',) rows
            self.tokens = self.tokens.index_select(0, index)  # (B', 1)
        else:
            release_state(self.state)
        return out

    def merge(self, other: SteppedSearch) -> None:
        """Take in the rows of ``other`` (same step function and options; states that join:
        :func:`~aiayn.decoding.step.join_states`): from now on they run in this batch."""
        self.state = join_states([self.state, other.state])
        self.rows += other.rows
        self.tokens = torch.cat([self.tokens, other.tokens])  # (B + B', 1)
        widest = max(self.out.size(1), other.out.size(1))
        self.out = torch.cat([_widened(self.out, widest), _widened(other.out, widest)])
        self.lengths = torch.cat([self.lengths, other.lengths])  # (B + B',)
        self.limits = torch.cat([self.limits, other.limits])  # (B + B',)
        other.rows = []

    def _choose(self, log_probs: Tensor) -> Tensor:
        """(B, V) log-probabilities -> (B,) next tokens: greedy search's or sampling's choice
        (:func:`~aiayn.decoding.sampling.sample_tokens`: a row whose values underflow takes
        greedy's); EOS is not allowed to a row with fewer than ``min_len`` tokens."""
        if self.min_len > 0:
            early = self.lengths < self.min_len  # (B,)
            if bool(early.any()):
                ban = early.to(log_probs.device)  # (B,)
                log_probs[:, self.eos_id].masked_fill_(ban, -torch.inf)
        if self.sampling is None:
            return first_argmax(log_probs)  # (B,)
        s = self.sampling
        gens = [g for r in self.rows if (g := r.generator) is not None]  # one per row
        return sample_tokens(
            log_probs, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, generator=gens
        )  # (B, V) -> (B,)


def _widened(tokens: Tensor, width: int) -> Tensor:
    """(B, M) tokens with zero columns up to (B, ``width``)."""
    return torch.nn.functional.pad(tokens, (0, width - tokens.size(1)))  # (B, width)
