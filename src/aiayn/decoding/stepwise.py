"""Greedy search and sampling one step at a time, each sequence leaving the batch the step it
ends: what a server needs to answer a request as soon as its own outputs are done, while the
others go on (``aiayn serve``, :mod:`aiayn.serving.decode`).

:class:`SteppedSearch` gives, sequence for sequence, the outputs of
:func:`~aiayn.decoding.greedy.greedy_search` and :func:`~aiayn.decoding.sampling.sample` with
one generator per row (tests hold them equal): the same limits (a row with limit m gives at most
m tokens; EOS is not allowed before ``min_len``), the same choice per row. Where those functions
keep a finished row in the batch, repeating EOS until every row is done, it leaves here
(``state.index_select``), so the rest run on a smaller batch; the searches are batch-invariant,
so no row's output changes. Rows that started later can join a running search
(:meth:`SteppedSearch.merge`, where their states can be merged: a decoder-only model's,
:func:`~aiayn.decoding.lm.merge_lm_states`, after its first step; the flattened encoder–decoder
step's, :func:`~aiayn.decoding.fast_step.merge_inference_states`, at any step); every row counts
its own tokens.

Shape legend:  B rows still decoding   V vocabulary
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aiayn.decoding.argmax import first_argmax
from aiayn.decoding.sampling import sample_tokens
from aiayn.decoding.step import DecoderState, StepFunction


@dataclass(frozen=True)
class Sampling:
    """Sampling's parameters (see :func:`~aiayn.decoding.sampling.sample`)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


@dataclass
class Row:
    """One sequence being decoded: its caller's key, its limit (tokens, EOS excluded), its
    generator (sampling) and its tokens so far."""

    key: Hashable
    limit: int
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)


class SteppedSearch:
    """Greedy search (``sampling`` None) or sampling over ``step``, one :meth:`advance` at a time.

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

    @property
    def done(self) -> bool:
        """Whether every row has ended."""
        return not self.rows

    @torch.inference_mode()
    def advance(self) -> list[Row]:
        """One step: the rows that end at it (at their limit, or by EOS), which leave."""
        ended = self.remove([r.key for r in self.rows if len(r.tokens) >= r.limit])
        if not self.rows:
            return ended
        log_probs, self.state = self.step(self.tokens, self.state)  # (B, V)
        chosen = self._choose(log_probs)  # (B,)
        self.stepped = True
        finished = []
        for row, token in zip(self.rows, chosen.tolist(), strict=True):
            if token == self.eos_id:
                finished.append(row.key)
            else:
                row.tokens.append(token)
        self.tokens = chosen[:, None]  # (B, 1)
        return ended + self.remove(finished)

    def remove(self, keys: Sequence[Hashable]) -> list[Row]:
        """Take the rows ``keys`` out of the batch (ended, or no longer wanted); returns them."""
        wanted = set(keys)
        if not wanted:
            return []
        keep = [i for i, r in enumerate(self.rows) if r.key not in wanted]
        gone = [r for r in self.rows if r.key in wanted]
        self.rows = [self.rows[i] for i in keep]
        if keep:
            index = torch.tensor(keep, device=self.tokens.device)
            self.state = self.state.index_select(index)  # (B',) rows
            self.tokens = self.tokens.index_select(0, index)  # (B', 1)
        return gone

    def merge(self, other: SteppedSearch, states: Callable[[Any, Any], DecoderState]) -> None:
        """Take in the rows of ``other`` (same step function and options): from now on they run
        in this batch; ``states`` merges the two states (rows of this one first), and refuses
        (raises) states it cannot merge, e.g. a decoder-only model's before its first step."""
        self.state = states(self.state, other.state)
        self.rows += other.rows
        self.tokens = torch.cat([self.tokens, other.tokens])  # (B + B', 1)
        other.rows = []

    def _choose(self, log_probs: Tensor) -> Tensor:
        """(B, V) log-probabilities -> (B,) next tokens: greedy search's or sampling's choice
        (:func:`~aiayn.decoding.sampling.sample_tokens`: a row whose values underflow takes
        greedy's); EOS is not allowed to a row with fewer than ``min_len`` tokens."""
        early = [len(r.tokens) < self.min_len for r in self.rows]
        if any(early):
            ban = torch.tensor(early, device=log_probs.device)  # (B,)
            log_probs[:, self.eos_id].masked_fill_(ban, -torch.inf)
        if self.sampling is None:
            return first_argmax(log_probs)  # (B,)
        s = self.sampling
        gens = [g for r in self.rows if (g := r.generator) is not None]  # one per row
        return sample_tokens(
            log_probs, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, generator=gens
        )  # (B, V) -> (B,)
