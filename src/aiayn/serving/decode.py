"""Decoding for many clients at once: translation and generation requests join the running decode
at the next step, and a request is answered as soon as its own outputs are done.

The worker of a model (:class:`DecodeEngine`) runs *groups*: the requests admitted at one step,
started together (one encoder or prompt pass) as one batch. Each round of the loop first admits
the waiting requests as a new group (those with the same decoding options, up to the token
budget, while fewer than ``max_decode_groups`` groups run), then advances every running group by
one decoding step, then answers the requests whose outputs all ended at that step:

* greedy search and sampling (:class:`SteppedGroup`, over
  :class:`~aiayn.decoding.stepwise.SteppedSearch`): a sequence leaves its group's batch the step
  it ends; a request leaves when its last sequence does (or when a stop string appears, or when
  nobody waits for it any more: the client went away or its time ran out);
* beam search (:class:`BeamGroup`): the library's beam search of each admitted batch runs as it
  is, one step per round (it hands the worker back at each step call); a sentence that is done
  leaves the batch at once, and a request is answered the step its last sentence is done.

A group's step is one model call for its rows. Greedy translation groups with the same options
merge into a running group before their first step, generation groups after it (the prompt
pass): :meth:`SteppedGroup.absorb`, the later rows right-aligned into the running batch at
their own positions (:func:`~aiayn.decoding.fast_step.merge_inference_states`,
:func:`~aiayn.decoding.lm.merge_lm_states`), so a new request joins the running batch itself.
Beam-search groups with the same options merge the same way before their first step
(:meth:`BeamGroup.absorb`): each search goes on choosing its own beams, and the rows all
searches keep run in one model call per step. Every result is the one the library gives the request
alone: the searches are the library's (or held equal to it by tests), and aiayn's steps are
batch-invariant.

Shape legend:  B rows of a group   V vocabulary
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from aiayn.decoding.step import DecoderState, StepFunction
from aiayn.decoding.stepwise import Row, SteppedSearch
from aiayn.serving.engine import Engine, Job, as_problem
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions


class Group(Protocol):
    """Requests decoding together, advanced one step at a time by the worker."""

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
        """One step: (the requests that ended with their results, tokens generated)."""
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
        super().__init__(name, options, metrics)
        self._start = start
        self._max_groups = options.max_decode_groups if options.batching else 1
        self._budget = options.max_batch_tokens * self._max_groups  # tokens of merged groups
        self.rounds, self.group_steps = 0, 0

    def _loop(self) -> None:
        groups: list[Group] = []
        while True:
            self._admit(groups)
            if not groups:
                return  # stopping, and nothing left
            if self.options.batching:
                _merge_groups(groups, self._budget)  # a new group joins before its first step
            started, rows, generated = time.monotonic(), 0, 0
            for group in groups:
                group.drop_cancelled()
                if group.done:
                    continue
                rows += group.rows
                self.group_steps += group.rows > 0
                ended, tokens = self._advance(group)
                generated += tokens
                for job, result in ended:
                    job.resolve(result)
            self.rounds += rows > 0
            self.metrics.step(self.name, rows, generated, started)
            groups[:] = [g for g in groups if not g.done]
            if self.options.batching:
                _merge_groups(groups, self._budget)

    def _advance(self, group: Group) -> tuple[list[tuple[Job, Any]], int]:
        try:
            return group.advance()
        except Exception as error:
            for job in group.jobs:
                job.fail(as_problem(error))
            group.jobs.clear()
            return [], 0

    def _admit(self, groups: list[Group]) -> None:
        """Start the waiting requests as new groups while fewer than the most run; waits for a
        request only when nothing runs."""
        while len(groups) < self._max_groups:
            first = self._take(wait=None if not groups else 0)
            if first is None:
                return
            if self._run_inline(first):
                continue
            jobs = self._companions(first)
            try:
                groups.append(self._start(jobs))
            except Exception as error:
                for job in jobs:
                    job.fail(as_problem(error))

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
    were could hold): the earlier takes in the later's rows, which leave ``groups``."""
    i = 0
    while i < len(groups):
        absorb = getattr(groups[i], "absorb", None)
        if absorb is not None:
            groups[i + 1 :] = [g for g in groups[i + 1 :] if not absorb(g, budget)]
        i += 1


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
        running: dict[int, list[Row]] = {}
        for row in self.search.rows:
            running.setdefault(row.key[0], []).append(row)  # type: ignore[index]
        assert self._watch is not None
        stop = [k for j, rows in running.items() for k in self._watch(self.jobs[j], rows)]
        return self.search.remove(stop)

    def _answered(self) -> list[tuple[Job, Any]]:
        out = []
        for j in sorted(self._open):
            rows = [self._ended.get((j, r)) for r in range(self._count[j])]
            if all(row is not None for row in rows):
                self._open.discard(j)
                out.append((self.jobs[j], self._finish(self.jobs[j], rows)))  # type: ignore[arg-type]
        return out

    def drop_cancelled(self) -> None:
        for j in [j for j in self._open if self.jobs[j].cancelled]:
            self.search.remove([(j, r) for r in range(self._count[j])])
            self._open.discard(j)


BeamRun = Callable[[StepFunction, Callable[[int, Any], None]], list[Any]]
"""``run(step, on_done)``: the library's beam search of a batch's sentences over ``step``,
calling ``on_done(sentence, found)`` as each sentence is done."""


@dataclass(frozen=True)
class StateMerge:
    """How a task's decoding states merge, for searches that share one model call per step.

    Attributes:
        states: ``states(a, b)``: one state with b's rows after a's, each row at its own
            positions (:func:`~aiayn.decoding.fast_step.merge_inference_states`).
        compact: the state without the columns no row needs any more.
        fits: ``fits(state, steps)``: whether rows joining ``state`` (None: none runs) with at
            most ``steps`` more steps to run keep its key columns bounded.
        max_cost: the most tokens (:attr:`Job.cost`) of requests still decoding that merged
            groups may hold (None: as many as the worker's budget allows).
    """

    states: Callable[[Any, Any], Any]
    compact: Callable[[Any], Any]
    fits: Callable[[Any, int], bool]
    max_cost: int | None = None


@dataclass(frozen=True)
class _Rows:
    """A search's view of the shared state: its ``count`` rows, and which of them it keeps for
    its next step once it has chosen (``index``: its ``index_select``)."""

    count: int
    index: Tensor | None = None

    def index_select(self, index: Tensor) -> _Rows:
        return _Rows(index.numel(), index)  # (B',) into its B rows

    def repeat_interleave(self, repeats: int) -> _Rows:
        raise RuntimeError("a beam search repeats its rows before its first step, not after")


class _Aborted(Exception):
    """Ends a search whose requests nobody waits for any more (raised inside its step)."""


class _Search:
    """One batch's beam search, the library's, run as it is in a helper thread. Each call of its
    step function hands (tokens, state) to the worker (:attr:`request`) and waits until the
    worker answers it (:meth:`resume`): only one of the two threads runs at a time. A request
    is answered the step its last sentence is done."""

    def __init__(
        self,
        jobs: list[Job],
        counts: list[int],
        run: BeamRun,
        finish: Callable[[Job, list[Any]], Any],
        steps: int,
    ):
        self.jobs, self._finish = jobs, finish
        starts = [sum(counts[:j]) for j in range(len(counts))]
        self._spans = [range(a, a + n) for a, n in zip(starts, counts, strict=True)]
        self._found: dict[int, Any] = {}
        self.open = set(range(len(jobs)))
        self.request: tuple[Tensor, Any] | None = None  # its next step's (tokens, state)
        self.left = steps  # the most steps it may still run
        self.started = self.finished = False
        self._reply: tuple[Tensor, _Rows] | None = None
        self._error: BaseException | None = None
        self._abort = False
        self._go, self._paused = threading.Semaphore(0), threading.Semaphore(0)
        self._thread = threading.Thread(target=self._body, args=(run,), daemon=True)
        self._thread.start()

    def _step(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        self.request = (tokens, state)
        self._paused.release()  # to the worker, which runs the step
        self._go.acquire()
        if self._abort:
            raise _Aborted
        assert self._reply is not None
        return self._reply

    def _body(self, run: BeamRun) -> None:
        self._go.acquire()
        try:
            if not self._abort:
                run(self._step, self._found.__setitem__)
        except _Aborted:
            pass
        except BaseException as error:
            self._error = error
        finally:
            self.finished = True
            self._paused.release()

    def resume(self, reply: tuple[Tensor, _Rows] | None = None) -> None:
        """Let the search go on (``reply``: its step's answer) to its next step call or its
        end; raises what the search raised."""
        self._reply, self.request, self.started = reply, None, True
        self.left -= reply is not None
        self._go.release()
        self._paused.acquire()
        if self.finished:
            self._thread.join()
            if self._error is not None:
                raise self._error

    def answered(self) -> list[tuple[Job, Any]]:
        """The requests whose sentences are all done now, with their results."""
        out = []
        for j in sorted(self.open):
            if all(s in self._found for s in self._spans[j]):
                self.open.discard(j)
                found = [self._found[s] for s in self._spans[j]]
                out.append((self.jobs[j], self._finish(self.jobs[j], found)))
        if self.finished and self.open:  # never left waiting: failed instead (a bug)
            self.open.clear()
            raise RuntimeError("the beam search returned without giving every sentence's result")
        return out

    def abort(self) -> None:
        """End the search now (its requests get no answer; its rows leave)."""
        self.open.clear()
        self.request = None
        if not self.finished:
            self._abort = True
            self._go.release()
            self._thread.join()


class BeamGroup:
    """Beam searches of requests with the same options, each the library's search of one batch
    run as it is (:class:`_Search`), all of whose steps run as one model call: the rows each
    search keeps (its ``index_select``) are taken from one shared state in one selection, the
    first rows of a search that joins (:meth:`absorb`) are merged in at its first step
    (``merge``: each row at its own positions), and the step's log-probabilities go back to
    each search, its own rows. A sentence that is done leaves the batch at once; a search that
    ends leaves it, its columns trimmed.

    Args:
        jobs, counts: the requests, and the sentences of each (the search's, in order).
        run: the search (:data:`BeamRun`); ``finish``: a request's result from what was found
            for its sentences, in order.
        step: the step function the searches share; ``steps``: the most steps the search runs.
        merge: how states merge (None: the group takes in no other).
    """

    def __init__(
        self,
        jobs: list[Job],
        counts: list[int],
        run: BeamRun,
        finish: Callable[[Job, list[Any]], Any],
        *,
        step: StepFunction,
        steps: int,
        merge: StateMerge | None = None,
    ):
        self.jobs, self.key = list(jobs), jobs[0].key
        self._searches = [_Search(jobs, counts, run, finish, steps)]
        self._step, self._merge = step, merge
        self._state: Any = None  # the shared state of the rows in _layout
        self._layout: list[tuple[_Search, int]] = []  # its searches in order, with their rows
        self._rows = sum(counts)

    @property
    def done(self) -> bool:
        return not self._searches

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cost(self) -> int:
        """The tokens (:attr:`Job.cost`) of the requests still decoding."""
        return sum(s.jobs[j].cost for s in self._searches for j in s.open)

    def absorb(self, other: BeamGroup, budget: int | None = None) -> bool:
        """Take in ``other``'s searches (same options, none started yet), where the states
        merge and the two groups' :attr:`cost` together is at most ``budget`` (None = any) and
        the merge's ``max_cost``."""
        if not isinstance(other, BeamGroup) or self._merge is None or other.key != self.key:
            return False
        if self.done or other.done or any(s.started for s in other._searches):
            return False
        limits = [x for x in (budget, self._merge.max_cost) if x is not None]
        if limits and self.cost + other.cost > min(limits):
            return False
        steps = max(s.left for s in self._searches + other._searches)
        if not self._merge.fits(self._state, steps):
            return False
        self._searches += other._searches
        self.jobs += other.jobs
        other._searches, other.jobs = [], []
        return True

    def advance(self) -> tuple[list[tuple[Job, Any]], int]:
        try:
            for search in self._searches:
                if not search.started:
                    search.resume()  # to its first step call
            running = [s for s in self._searches if s.request is not None]
            if running:
                log_probs = self._run_step(running)  # (B, V)
                rows = [s.request[0].size(0) for s in running]  # type: ignore[index]
                for search, part in zip(running, log_probs.split(rows), strict=True):
                    search.resume((part, _Rows(part.size(0))))
            answered = [a for s in self._searches for a in s.answered()]
        except BaseException:
            self.close()
            raise
        self._searches = [s for s in self._searches if not s.finished]
        self._rows = sum(s.request[0].size(0) for s in self._searches if s.request is not None)
        return answered, 0

    def _run_step(self, running: list[_Search]) -> Tensor:
        """One model call over the rows of the ``running`` searches, in their order."""
        tokens = torch.cat([s.request[0] for s in running])  # type: ignore[index]  # (B, 1)
        state, self._state = self._shared_state(running, tokens.device), None
        log_probs, self._state = self._step(tokens, state)  # (B, V)
        self._layout = [(s, s.request[0].size(0)) for s in running]  # type: ignore[index]
        return log_probs

    def _shared_state(self, running: list[_Search], device: torch.device) -> Any:
        """The state of the running searches' rows: the rows each kept of the last shared
        state (one selection), then the first rows of those that start now, merged in."""
        parts, offset, left = [], 0, False
        for search, rows in self._layout:
            if search.request is None:
                left = True  # ended: its rows leave
            else:
                view = search.request[1]
                assert isinstance(view, _Rows)
                kept = torch.arange(rows, device=device) if view.index is None else view.index
                parts.append(kept + offset)  # (B_s',) into the shared rows
            offset += rows
        state = self._state.index_select(torch.cat(parts)) if parts else None
        if left and state is not None and self._merge is not None:
            state = self._merge.compact(state)
        for search in running[len(parts) :]:  # those that start now
            first = search.request[1]  # type: ignore[index]
            if state is not None:
                assert self._merge is not None  # absorb takes in searches only with one
                first = self._merge.states(state, first)
            state = first
        return state

    def drop_cancelled(self) -> None:
        """A search none of whose requests anybody waits for ends; its rows leave the batch at
        the next step (the other searches keep theirs)."""
        for search in self._searches:
            waiting = [search.jobs[j] for j in search.open]
            if search.started and waiting and all(job.cancelled for job in waiting):
                search.abort()
        self._searches = [s for s in self._searches if not s.finished]

    def close(self) -> None:
        """End every search (after an error)."""
        for search in self._searches:
            search.abort()
        self._searches, self._state, self._layout = [], None, []


def row_keys(counts: Sequence[int]) -> list[tuple[int, int]]:
    """The keys (request, row) of ``counts[j]`` rows for each request j, in order."""
    return [(j, r) for j, n in enumerate(counts) for r in range(n)]
