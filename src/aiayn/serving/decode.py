"""Decoding for many clients at once: translation and generation requests join the running decode
at the next step, and a request is answered as soon as its own outputs are done.

Each worker thread of a model (:class:`DecodeEngine`; ``decode_workers`` of them, taking
requests from one queue) runs its own *groups*: the requests admitted at one step,
started together (one encoder or prompt pass) as one batch. Each round of the loop first admits
the waiting requests as a new group (those with the same decoding options, up to the token
budget, while fewer than ``max_decode_groups`` groups run), then advances every running group by
one decoding step, then answers the requests whose outputs all ended at that step:

* greedy search and sampling (:class:`SteppedGroup`, over
  :class:`~aiayn.decoding.stepwise.SteppedSearch`): a sequence leaves its group's batch the step
  it ends; a request leaves when its last sequence does (or when a stop string appears, or when
  nobody waits for it any more: the client went away or its time ran out);
* beam search (:class:`BeamGroup`, over :class:`~aiayn.decoding.beam.SteppedBeamSearch`, the
  library's beam search one step at a time): a sentence that is done leaves the batch at once,
  a request is answered the step its last sentence is done, and a request nobody waits for any
  more leaves at the next step.

A group's step is one model call for its rows. Groups with the same options merge into a
running group: greedy translation and beam-search groups at any step, generation groups after
their first (the prompt pass): :meth:`SteppedGroup.absorb`, :meth:`BeamGroup.absorb`, the later
rows right-aligned into the running batch at their own positions
(:func:`~aiayn.decoding.fast_step.merge_inference_states`,
:func:`~aiayn.decoding.lm.merge_lm_states`), so a new request joins the running batch itself.
Merged beam-search groups are one search: each sentence counts its own steps under the same
rules, with one top-k over every sentence's candidates and one selection of the kept rows per
step. Every result is the one the library gives the request alone: the searches are
the library's (or held equal to it by tests), and aiayn's steps are batch-invariant.

A failure fails only the requests it belongs to (:func:`~aiayn.serving.engine.fail_jobs`: a 4xx
where the input caused it, else a 500 naming the request). What one request's rows need alone
(its stop strings and streamed text, its result) fails that request alone. A step's model call
is shared: when it fails, the group ends, and each of its requests starts again alone (once;
not a request that has streamed text already), in a group that merges with no other to its end,
so that only a request that fails alone gets the error; a group that fails to start starts each
of its requests alone in the same way. The other groups of the worker go on.

Shape legend:  B rows of a group   V vocabulary
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from aiayn.decoding.beam import Hypothesis, SteppedBeamSearch
from aiayn.decoding.stepwise import Row, SteppedSearch
from aiayn.serving.engine import Engine, Job, fail_jobs
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions

_log = logging.getLogger(__name__)


class Group(Protocol):
    """Requests decoding together, advanced one step at a time by the worker. A group that can
    fail after it starts also has ``close() -> list[Job]``: end every request not answered yet,
    returning them (:class:`SteppedGroup`, :class:`BeamGroup`)."""

    jobs: list[Job]

    @property
    def done(self) -> bool:
        """Whether every request of the group is answered."""
        ...

    @property
    def rows(self) -> int:
        """B, the rows its next step runs."""
        ...

    def advance(self) -> tuple[list[tuple[Job, Any]], int]:
        """One step: (the requests that ended with their results, or with the exception that
        failed each alone; tokens generated)."""
        ...

    def drop_cancelled(self) -> None:
        """Take the rows of the cancelled requests out (where the search allows it)."""
        ...


GroupStarter = Callable[[list[Job]], Group]
"""A task's way to start a group from the requests admitted together (one batch)."""


class DecodeEngine(Engine):
    """The worker loop of a decoding task (see the module docstring).

    Attributes:
        rounds: rounds of the loop that stepped a group so far.
        group_steps: group steps run so far, one model call each: as many as ``rounds`` while
            every round runs one batch.
    """

    def __init__(self, name: str, options: ServeOptions, metrics: Metrics, start: GroupStarter):
        super().__init__(name, options, metrics, threads=options.running_decode_workers)
        self._start = start
        self._max_groups = options.max_decode_groups if options.batching else 1
        self._budget = options.max_batch_tokens * self._max_groups  # tokens of merged groups
        self.rounds, self.group_steps = 0, 0
        self._counting = threading.Lock()  # the loops' counts add up from their threads

    def _loop(self) -> None:
        groups: list[Group] = []
        while True:
            self._admit(groups)
            if not groups:
                return  # stopping, and nothing left
            if self.options.batching:
                _merge_groups(groups, self._budget)  # a new group joins before its first step
            started, rows, generated, steps = time.monotonic(), 0, 0, 0
            again: list[Group] = []  # requests of failed groups, started again alone
            failed: list[Group] = []
            for group in groups:
                n, tokens = self._step(group, again, failed)
                rows, generated, steps = rows + n, generated + tokens, steps + (n > 0)
            with self._counting:
                self.rounds += rows > 0
                self.group_steps += steps
            self.metrics.step(self.name, rows, generated, started)
            groups[:] = [g for g in groups if not g.done and g not in failed] + again
            if self.options.batching:
                _merge_groups(groups, self._budget)

    def _step(self, group: Group, again: list[Group], failed: list[Group]) -> tuple[int, int]:
        """One step of ``group`` (its cancelled rows out first): (rows stepped, tokens
        generated); the requests that ended are answered. A failure ends the group
        (:meth:`_recover`: it joins ``failed``, its requests start again in ``again``)."""
        rows = 0
        try:
            group.drop_cancelled()
            if group.done:
                return 0, 0
            rows = group.rows
            live = [j for j in group.jobs if not (j.settled or j.cancelled)]
            ended, tokens = group.advance()
        except Exception as error:
            failed.append(group)
            self._recover(group, error, again)
            return rows, 0
        self._time_tokens(live, ended)
        for job, result in ended:
            job.settle(result, self.name)
        return rows, tokens

    def _time_tokens(self, live: list[Job], ended: list[tuple[Job, Any]]) -> None:
        """After a step of the ``live`` requests: the time to the first token of those that
        got it now, and the time per output token of those that ``ended`` with a result."""
        now, first = time.monotonic(), []
        for job in live:
            job.steps += 1
            if job.first_token_at is None:
                job.first_token_at = now
                first.append(job.queued_at)
        self.metrics.first_tokens(self.name, first, now)
        for job, result in ended:
            if job.first_token_at is not None and not isinstance(result, Exception):
                self.metrics.per_output_token(self.name, now - job.first_token_at, job.steps - 1)

    def _recover(self, group: Group, error: Exception, again: list[Group]) -> None:
        """After ``group``'s step failed: where it held several requests, each that may start
        again (not started again before, no text streamed yet) starts again alone, in
        ``again``; the others fail with ``error``."""
        jobs = [j for j in _closed(group) if not j.cancelled]
        retry = [j for j in jobs if not (j.retried or j.streamed)] if len(jobs) > 1 else []
        if retry:
            names = ", ".join(j.name for j in retry)
            _log.warning(
                "model %s: a decoding step of requests %s failed (%r): each starts again alone",
                self.name,
                names,
                error,
            )
        fail_jobs([j for j in jobs if j not in retry], error, self.name)
        for job in retry:
            job.retried = True
            self._begin([job], again)

    def _begin(self, jobs: list[Job], groups: list[Group]) -> None:
        """Start ``jobs`` as one group in ``groups``; where that fails for several, each starts
        alone, so that only a request whose own start fails gets the error."""
        try:
            groups.append(self._start(jobs))
        except Exception as error:
            if len(jobs) == 1:
                fail_jobs(jobs, error, self.name)
                return
            for job in jobs:
                self._begin([job], groups)

    def _admit(self, groups: list[Group]) -> None:
        """Start the waiting requests as new groups while fewer than the most run; waits for a
        request only when nothing runs."""
        while len(groups) < self._max_groups:
            first = self._take(wait=None if not groups else 0)
            if first is None:
                return
            if self._run_inline(first):
                continue
            self._begin(self._companions(first), groups)

    def _companions(self, first: Job) -> list[Job]:
        """``first`` and the waiting requests with its options that fit the token budget."""
        jobs, cost = [first], first.cost
        while self.options.batching:
            waiting, key = self._peek_key()
            if not waiting or key != first.key:
                break
            job = self._take(wait=0)
            if job is None:
                break
            if cost + job.cost > self.options.max_batch_tokens:
                self._put_back(job)
                break
            jobs.append(job)
            cost += job.cost
        return jobs


def _merge_groups(groups: list[Group], budget: int | None = None) -> None:
    """Merge the groups that can run as one batch (same options, states that merge, and
    together at most ``budget`` tokens of requests still decoding: as many as the groups they
    were could hold): the earlier takes in the later's rows, which leave ``groups``. A group of
    a request started again after a failure runs apart to its end (it merges with none)."""
    i = 0
    while i < len(groups):
        absorb = getattr(groups[i], "absorb", None)
        if absorb is not None and not _apart(groups[i]):
            groups[i + 1 :] = [
                g for g in groups[i + 1 :] if _apart(g) or not _absorbed(absorb, g, budget)
            ]
        i += 1


def _apart(group: Group) -> bool:
    """Whether ``group`` runs apart: it holds a request started again after a failure."""
    return any(job.retried for job in group.jobs)


def _absorbed(absorb: Callable[[Any, int | None], bool], other: Group, budget: int | None) -> bool:
    """Whether ``absorb`` took ``other`` in; a merge that fails leaves the two apart (logged:
    a group left broken by it fails at its next step)."""
    try:
        return absorb(other, budget)
    except Exception:
        _log.exception("two decode groups failed to merge: they run apart")
        return False


def _closed(group: Group) -> list[Job]:
    """The requests ``group`` had not answered, the group ended (after a failure)."""
    close = getattr(group, "close", None)
    try:
        left: list[Job] = close() if close is not None else []
    except Exception:
        _log.exception("a failed decode group could not be closed")
        left = []
    return left or [j for j in group.jobs if not j.settled]


def _outcome(finish: Callable[[Job, Any], Any], job: Job, found: Any) -> Any:
    """``finish(job, found)``, or the exception it raised (which fails that request alone)."""
    try:
        return finish(job, found)
    except Exception as error:
        return error


Finish = Callable[[Job, list[Row]], Any]
"""A request's result from its rows (in its order), once all have ended."""

Watch = Callable[[Job, list[Row]], list[Hashable]]
"""Called after each step with a request's rows still decoding: the keys of those to end now
(a stop string, streaming updates sent on the way)."""


Merge = Callable[[SteppedSearch, SteppedSearch], bool]
"""Takes the second search's rows into the first where their states allow it (True), else
leaves both as they are (False)."""


class SteppedGroup:
    """Greedy search or sampling of a group's requests; row keys are (request, row).

    With ``merge`` (the task's states merge: see the module docstring), a group takes in
    another's rows (:meth:`absorb`) where ``merge`` agrees: from then on they run in one batch;
    ``compact`` trims the state after rows leave."""

    def __init__(
        self,
        jobs: list[Job],
        search: SteppedSearch,
        finish: Finish,
        watch: Watch | None = None,
        *,
        merge: Merge | None = None,
        compact: Callable[[Any], Any] | None = None,
    ):
        self.jobs, self.search, self._finish, self._watch = jobs, search, finish, watch
        self.key = jobs[0].key
        self._merge, self._compact = merge, compact
        self._ended: dict[Hashable, Row] = {}
        self._failed: list[tuple[Job, Any]] = []  # requests failed alone, with their errors
        self._count = {j: 0 for j in range(len(jobs))}
        for row in search.rows:
            self._count[row.key[0]] += 1  # type: ignore[index]
        self._open = set(self._count)

    @property
    def done(self) -> bool:
        return not self._open

    @property
    def rows(self) -> int:
        return len(self.search.rows)

    def advance(self) -> tuple[list[tuple[Job, Any]], int]:
        before = sum(len(r.tokens) for r in self.search.rows)
        ended = self.search.advance()
        generated = sum(len(r.tokens) for r in self.search.rows) + sum(len(r.tokens) for r in ended)
        if self._watch is not None:
            ended += self._watched()
        for row in ended:
            self._ended[row.key] = row
        if ended and self._compact is not None and self.search.rows:
            self.search.state = self._compact(self.search.state)
        return self._answered(), generated - before

    @property
    def cost(self) -> int:
        """The tokens (:attr:`Job.cost`) of the requests still decoding."""
        return sum(self.jobs[j].cost for j in self._open)

    def absorb(self, other: SteppedGroup, budget: int | None = None) -> bool:
        """Take in ``other``'s requests and rows (same options), where the states allow it and
        the two groups' :attr:`cost` together is at most ``budget`` (None = any)."""
        if not isinstance(other, SteppedGroup) or self._merge is None or other.done or self.done:
            return False
        if other.key != self.key:
            return False
        if budget is not None and self.cost + other.cost > budget:
            return False
        offset, moved = len(self.jobs), [*other.search.rows, *other._ended.values()]
        if not self._merge(self.search, other.search):
            return False
        for row in moved:  # (request, row) keys: other's requests now follow this group's
            key: tuple[int, int] = row.key  # type: ignore[assignment]
            row.key = (key[0] + offset, key[1])
        self._ended.update({row.key: row for row in other._ended.values()})
        self._count.update({j + offset: n for j, n in other._count.items()})
        self._open |= {j + offset for j in other._open}
        self.jobs += other.jobs
        other._open, other.jobs = set(), []
        return True

    def _watched(self) -> list[Row]:
        """The rows that end at a stop string (each request watched on its own: one whose
        watch fails fails alone)."""
        running: dict[int, list[Row]] = {}
        for row in self.search.rows:
            running.setdefault(row.key[0], []).append(row)  # type: ignore[index]
        assert self._watch is not None
        stop: list[Hashable] = []
        for j, rows in running.items():
            try:
                stop += self._watch(self.jobs[j], rows)
            except Exception as error:
                self._drop(j)
                self._failed.append((self.jobs[j], error))
        return self.search.remove(stop)

    def _answered(self) -> list[tuple[Job, Any]]:
        out, self._failed = self._failed, []
        for j in sorted(self._open):
            rows = [self._ended.get((j, r)) for r in range(self._count[j])]
            if all(row is not None for row in rows):
                self._open.discard(j)
                out.append((self.jobs[j], _outcome(self._finish, self.jobs[j], rows)))
        return out

    def drop_cancelled(self) -> None:
        for j in [j for j in self._open if self.jobs[j].cancelled]:
            self._drop(j)

    def close(self) -> list[Job]:
        """End every request not answered yet (after an error): their rows leave, all at once
        (the state, perhaps broken by the error, is not touched); returns them."""
        left = sorted(self._open)
        self.search.remove([(j, r) for j in left for r in range(self._count[j])])
        self._open.clear()
        return [self.jobs[j] for j in left]

    def _drop(self, j: int) -> None:
        """Request ``j``'s rows leave the batch; it is no longer answered."""
        self.search.remove([(j, r) for r in range(self._count[j])])
        self._open.discard(j)


@dataclass(frozen=True)
class StateMerge:
    """How a task's decoding states merge, for beam searches that share one model call per step.

    Attributes:
        states: ``states(a, b)``: one state with b's rows after a's, each row at its own
            positions (:func:`~aiayn.decoding.fast_step.merge_inference_states`).
        compact: the state without the columns no row needs any more.
        fits: ``fits(state, steps)``: whether rows joining ``state`` (None: it has run no step
            yet) with at most ``steps`` more steps to run keep its key columns bounded.
        max_cost: the most tokens (:attr:`Job.cost`) of requests still decoding that merged
            groups may hold (None: as many as the worker's budget allows).
    """

    states: Callable[[Any, Any], Any]
    compact: Callable[[Any], Any]
    fits: Callable[[Any, int], bool]
    max_cost: int | None = None


class BeamGroup:
    """Beam search of requests with the same options: one
    :class:`~aiayn.decoding.beam.SteppedBeamSearch` over all their sentences, keyed (request,
    sentence) (:func:`row_keys`). A sentence that is done leaves the batch at once, and its
    request is answered the step its last sentence is done; a cancelled request's sentences
    leave at the next step.

    With ``merge`` (the step's states merge), the group takes in another's sentences
    (:meth:`absorb`): from then on they run in this group's batch, each at its own step, one
    model call, one top-k and one selection of the kept rows per step for all; when sentences
    leave, the state drops the columns no row needs any more (``merge.compact``).

    Args:
        jobs, counts: the requests, and the sentences of each (the search's, in order).
        search: the beam search of those sentences.
        finish: a request's result from the n-best lists of its sentences, in order.
        merge: how states merge (None: the group takes in no other).
    """

    def __init__(
        self,
        jobs: list[Job],
        counts: list[int],
        search: SteppedBeamSearch,
        finish: Callable[[Job, list[list[Hypothesis]]], Any],
        *,
        merge: StateMerge | None = None,
    ):
        self.jobs, self.key, self.search = list(jobs), jobs[0].key, search
        self._finish, self._merge = finish, merge
        self._found: dict[Hashable, list[Hypothesis]] = {}  # (request, sentence) -> n-best
        self._count = dict(enumerate(counts))
        self._open = set(self._count)

    @property
    def done(self) -> bool:
        return not self._open

    @property
    def rows(self) -> int:
        return self.search.rows

    @property
    def cost(self) -> int:
        """The tokens (:attr:`Job.cost`) of the requests still decoding."""
        return sum(self.jobs[j].cost for j in self._open)

    def absorb(self, other: BeamGroup, budget: int | None = None) -> bool:
        """Take in ``other``'s requests and sentences (same options; either may have run
        steps), where the states merge, the key columns fit (``merge.fits``: the running rows'
        columns with the most steps a sentence of either may still run), and the two groups'
        :attr:`cost` together is at most ``budget`` (None = any) and the merge's ``max_cost``."""
        if not isinstance(other, BeamGroup) or self._merge is None or other.key != self.key:
            return False
        if self.done or other.done:
            return False
        limits = [x for x in (budget, self._merge.max_cost) if x is not None]
        if limits and self.cost + other.cost > min(limits):
            return False
        searches = (self.search, other.search)
        steps = max(s.most_steps() for s in searches)
        if not all(self._merge.fits(s.state if s.stepped else None, steps) for s in searches):
            return False
        offset, before = len(self.jobs), len(self.search.sentences)
        self.search.merge(other.search, self._merge.states)
        for sentence in self.search.sentences[before:]:  # other's requests follow this group's
            sentence.key = _shifted(sentence.key, offset)
        self._found.update({_shifted(k, offset): v for k, v in other._found.items()})
        self._count.update({j + offset: n for j, n in other._count.items()})
        self._open |= {j + offset for j in other._open}
        self.jobs += other.jobs
        other._open, other.jobs = set(), []
        return True

    def advance(self) -> tuple[list[tuple[Job, Any]], int]:
        """One step; the tokens it counts as generated are those of the best hypotheses of
        the sentences done at it (what their answers hold)."""
        done = self.search.advance()  # a failure: the worker ends the group (close)
        self._found.update(done)
        if done:
            self._compact()
        generated = sum(len(hyps[0].tokens) for _, hyps in done if hyps)
        return self._answered(), generated

    def _compact(self) -> None:
        """After sentences left: the state without the columns no row needs any more."""
        if self._merge is not None and not self.search.done:
            self.search.state = self._merge.compact(self.search.state)

    def _answered(self) -> list[tuple[Job, Any]]:
        out = []
        for j in sorted(self._open):
            keys = [(j, r) for r in range(self._count[j])]
            if all(key in self._found for key in keys):
                self._open.discard(j)
                found = [self._found.pop(key) for key in keys]
                out.append((self.jobs[j], _outcome(self._finish, self.jobs[j], found)))
        return out

    def drop_cancelled(self) -> None:
        """The sentences of the requests nobody waits for any more leave the batch now (the
        others keep theirs)."""
        cancelled = [j for j in self._open if self.jobs[j].cancelled]
        if cancelled:
            self._drop(cancelled)
            self._compact()

    def close(self) -> list[Job]:
        """End the search of every request not answered yet (after an error); returns them."""
        left = sorted(self._open)
        self._drop(left)
        return [self.jobs[j] for j in left]

    def _drop(self, requests: list[int]) -> None:
        self.search.remove([(j, r) for j in requests for r in range(self._count[j])])
        self._open -= set(requests)


def _shifted(key: Hashable, offset: int) -> tuple[int, int]:
    """A (request, sentence) key with the request ``offset`` places later."""
    request, sentence = cast(tuple[int, int], key)
    return (request + offset, sentence)


def row_keys(counts: Sequence[int]) -> list[tuple[int, int]]:
    """The keys (request, row) of ``counts[j]`` rows for each request j, in order."""
    return [(j, r) for j, n in enumerate(counts) for r in range(n)]
