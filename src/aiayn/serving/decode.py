"""Decoding for many clients at once: translation and generation requests join the running decode
at the next step, and a request is answered as soon as its own outputs are done.

Each worker thread of a model (:class:`DecodeEngine`; ``decode_workers`` of them, taking
requests from one queue and filling in order: the next takes a request only where those before
it would not admit it, :meth:`DecodeEngine._may_take`) holds one key/value cache, a pair of
slot pools (:class:`~aiayn.attention.SlotPool`), and runs *groups*: the requests with the same
decoding options admitted at one round, started together (one encoder or prompt pass) as one
search. Each round of the loop:

1. **admits** waiting requests, first come first served, while their prompt or source tokens
   fit the round's prefill budget (``--max-batch-tokens``) and the cache tokens they may hold
   (rows × (input + output limit)) fit the worker's ``--max-cache-tokens`` (the first request
   is admitted whatever its size when nothing runs); each new group prefills into free slots;
2. **steps** every running group with **one model call**: their inputs and states joined
   (:func:`~aiayn.decoding.step.join_states`: the rows' slots and lengths, no key/value
   copied), each row at its own positions, each group then choosing its own tokens (greedy
   search, sampling with its own temperature and top-p, beam search with its own beam, α and
   limits), so requests with different options share every step;
3. **answers** the requests whose outputs all ended at that step; their rows' slots are freed.

* greedy search and sampling (:class:`SteppedGroup`, over
  :class:`~aiayn.decoding.stepwise.SteppedSearch`): a sequence leaves its group's batch the step
  it ends; a request leaves when its last sequence does (or when a stop string appears, or when
  nobody waits for it any more: the client went away or its time ran out);
* beam search (:class:`BeamGroup`, over :class:`~aiayn.decoding.beam.SteppedBeamSearch`, the
  library's beam search one step at a time): a sentence that is done leaves the batch at once,
  a request is answered the step its last sentence is done, and a request nobody waits for any
  more leaves at the next step.

Every result is the one the library gives the request alone: each row attends over exactly its
own keys/values, the searches are the library's (or held equal to it by tests), and aiayn's
steps are batch-invariant.

A failure fails only the requests it belongs to (:func:`~aiayn.serving.engine.fail_jobs`: a 4xx
where the input caused it, else a 500 naming the request). What one request's rows need alone
(its stop strings and streamed text, its result) fails that request alone. When the joint model
call fails, each group steps alone; a group whose own step fails ends, and each of its requests
starts again alone (once; not a request that has streamed text already), so that only a request
that fails alone gets the error; a group that fails to start starts each of its requests alone
in the same way. The other groups of the worker go on.

Memory: a worker's pools grow (doubling) to what its running rows need and are kept while it
runs; when it has nothing to run and its pools hold more than
:attr:`~aiayn.settings.PerformanceSettings.serve_pool_keep_bytes`, it drops them and returns the
freed heap to the system (``malloc_trim``), so one large request does not keep its memory.

Shape legend:  B rows of a group   V vocabulary
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, cast

import torch
from torch import Tensor

from aiayn.attention import SlotPool
from aiayn.decoding.beam import Hypothesis, SteppedBeamSearch
from aiayn.decoding.step import DecoderState, StepFunction, advanced, join_states, joins
from aiayn.decoding.stepwise import Row, SteppedSearch
from aiayn.performance import return_freed_memory
from aiayn.serving.engine import Engine, Job, fail_jobs
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.settings import performance

_log = logging.getLogger(__name__)

Inputs = tuple[Tensor, DecoderState]
"""A group's next model call: its (B, 1) newest tokens and its state."""


class Group(Protocol):
    """Requests decoding together, advanced one step at a time by the worker. A group that can
    fail after it starts also has ``close() -> list[Job]``: end every request not answered yet,
    returning them (:class:`SteppedGroup`, :class:`BeamGroup`)."""

    jobs: list[Job]
    stepped: bool  # whether a step of it has completed (set by the worker)

    @property
    def done(self) -> bool:
        """Whether every request of the group is answered."""
        ...

    @property
    def step(self) -> StepFunction | None:
        """The model's step its searches run (None: it runs no model call)."""
        ...

    def inputs(self) -> Inputs | None:
        """Before a step: its model call's inputs, or None when it has no row to step."""
        ...

    def complete(
        self, log_probs: Tensor | None, state: DecoderState | None
    ) -> tuple[list[tuple[Job, Any]], int]:
        """After the step made of :meth:`inputs` (its (B, V) log-probs and next state; None when
        it had no row to step): (the requests that ended with their results, or with the
        exception that failed each alone; tokens generated)."""
        ...

    def drop_cancelled(self) -> None:
        """Take the rows of the cancelled requests out (their slots are freed)."""
        ...


GroupStarter = Callable[[list[Job], tuple[SlotPool, ...]], Group]
"""A task's way to start a group from the requests admitted together, in the worker's pools."""


def advance(group: Group) -> tuple[list[tuple[Job, Any]], int]:
    """One step of ``group`` alone: its own model call."""
    inputs = group.inputs()
    if inputs is None:
        return group.complete(None, None)
    assert group.step is not None
    log_probs, state = group.step(*inputs)
    return group.complete(log_probs, state)


class _Worker:
    """What one worker thread runs: its groups, its pools (made on first use), and the requests
    it admitted with the rows and cache tokens they may hold."""

    def __init__(self, lock: threading.Condition | None = None) -> None:
        self.groups: list[Group] = []
        self.pools: tuple[SlotPool, ...] | None = None
        self.held: set[Job] = set()  # with ``rows`` and ``tokens``, changed under ``lock``
        self.rows = self.tokens = 0  # of the requests held (other workers read them)
        self.lock = lock or threading.Condition()
        self.rounds = 0  # rounds run so far

    def fits(self, job: Job, most: int, rows: int | None = None) -> bool:
        """Whether ``job``'s cache tokens fit beside those held, at most ``most``, and its rows
        beside those held, at most ``rows`` (None: any number); always, when none are held."""
        if not self.held:
            return True
        if rows is not None and self.rows + job.rows > rows:
            return False
        return self.tokens + job.reserve <= most

    def hold(self, job: Job) -> None:
        with self.lock:
            self.held.add(job)
            self.rows, self.tokens = self.rows + job.rows, self.tokens + job.reserve
            self.lock.notify_all()  # workers that left the next request to this one look again

    def let_go(self, jobs: Sequence[Job]) -> None:
        with self.lock:  # (fewer rows held lets no other worker take more: no one to wake)
            for job in jobs:
                if job in self.held:
                    self.held.remove(job)
                    self.rows, self.tokens = self.rows - job.rows, self.tokens - job.reserve


class DecodeEngine(Engine):
    """The worker loop of a decoding task (see the module docstring).

    Attributes:
        rounds: rounds of the loop that stepped a row so far.
        group_steps: model calls run so far: one a round while the groups' states join.
    """

    def __init__(
        self,
        name: str,
        options: ServeOptions,
        metrics: Metrics,
        start: GroupStarter,
        pools: Callable[[], tuple[SlotPool, ...]],
    ):
        super().__init__(name, options, metrics, threads=options.running_decode_workers)
        self._start, self._new_pools = start, pools
        self.rounds, self.group_steps = 0, 0
        self._counting = threading.Lock()  # the loops' counts add up from their threads
        self._fill_rows = performance().serve_worker_rows
        self._workers: list[_Worker | None] = [None] * self.threads  # each slot's, once it runs

    def _loop(self) -> None:
        worker = _Worker(self._cond)
        with self._cond:
            self._workers[self._slot()] = worker
        while True:
            self._admit(worker)
            if not worker.groups:
                return  # stopping, and nothing left
            started = time.monotonic()
            again: list[Group] = []  # requests of failed groups, started again alone
            rows, generated, calls = self._round(worker, again)
            with self._counting:
                self.rounds += rows > 0
                self.group_steps += calls
            self.metrics.step(self.name, rows, generated, started)
            for group in worker.groups:
                if group.done:
                    worker.let_go(group.jobs)
            worker.groups[:] = [g for g in worker.groups if not g.done] + again
            if not worker.groups:
                _return_memory(worker)

    def _slot(self) -> int:
        """The calling worker thread's slot."""
        return int(getattr(self._mine, "slot", 0))

    def _row_cap(self) -> int | None:
        """The rows the calling worker admits up to: the workers fill in order (see
        :meth:`_may_take`), each but the last up to
        :attr:`~aiayn.settings.PerformanceSettings.serve_worker_rows`."""
        last = self._slot() == self.threads - 1
        return None if last or not self._fill_rows else self._fill_rows

    def _may_take(self, worker: _Worker, job: Job) -> bool:
        """Whether ``worker`` (the calling thread's) admits ``job`` now: it fits its cache
        tokens and rows (:meth:`_row_cap`), and no worker before it would admit it (its rows or
        cache tokens full, or its thread not running). Workers fill in order: a light load runs
        as one batch on one worker, each model call's fixed cost shared by all its rows (two
        half batches would pay it twice); a heavier one spreads over the others (the lock
        held)."""
        if not worker.fits(job, self.options.max_cache_tokens, self._row_cap()):
            return False
        if not self._fill_rows:
            return True
        for before in range(self._slot()):
            other, thread = self._workers[before], self._threads[before]
            if thread is None or not thread.is_alive():
                continue
            if other is None or other.fits(job, self.options.max_cache_tokens, self._fill_rows):
                return False  # it takes the request (a worker starting: once it runs)
        return True

    def _round(self, worker: _Worker, again: list[Group]) -> tuple[int, int, int]:
        """One step of every running group: (rows stepped, tokens generated, model calls)."""
        ready: list[tuple[Group, Inputs | None]] = []
        worker.rounds += 1
        for group in worker.groups:
            try:
                group.drop_cancelled()
                if group.done:
                    continue
                ready.append((group, group.inputs()))
            except Exception as error:
                self._recover(worker, group, error, again)
        joint = [r for r in ready if r[1] is not None and joins(r[1][1])]
        rows = sum(r[1][0].size(0) for r in ready if r[1] is not None)
        generated, calls = 0, 0
        if len(joint) > 1 and len({id(r[0].step) for r in joint}) == 1:
            stepped = self._joint(worker, joint, again)
            if stepped is not None:
                generated, calls = stepped, 1
                ready = [r for r in ready if r not in joint]
        for group, inputs in ready:
            generated += self._alone(worker, group, inputs, again)
            calls += inputs is not None
        return rows, generated, calls

    def _joint(
        self,
        worker: _Worker,
        joint: list[tuple[Group, Inputs | None]],
        again: list[Group],
    ) -> int | None:
        """One model call for the groups ``joint`` (their states join): the tokens generated,
        or None when the call failed (each group then steps alone)."""
        inputs = [cast(Inputs, r[1]) for r in joint]
        step = joint[0][0].step
        assert step is not None
        try:
            tokens = torch.cat([x[0] for x in inputs])  # (ΣB, 1)
            log_probs, _ = step(tokens, join_states([x[1] for x in inputs]))  # (ΣB, V)
        except Exception:
            _log.exception(
                "model %s: a joint decoding step failed: each group steps alone", self.name
            )
            return None
        shares = log_probs.split([x[0].size(0) for x in inputs])  # per group (B, V)
        generated = 0
        for (group, x), share in zip(joint, shares, strict=True):
            generated += self._finish(worker, group, share, advanced(cast(Inputs, x)[1]), again)
        return generated

    def _alone(
        self,
        worker: _Worker,
        group: Group,
        inputs: Inputs | None,
        again: list[Group],
    ) -> int:
        """A step of ``group`` by its own model call (none when it has no row to step)."""
        if inputs is None:
            return self._finish(worker, group, None, None, again)
        assert group.step is not None
        try:
            log_probs, state = group.step(*inputs)
        except Exception as error:
            self._recover(worker, group, error, again)
            return 0
        return self._finish(worker, group, log_probs, state, again)

    def _finish(
        self,
        worker: _Worker,
        group: Group,
        log_probs: Tensor | None,
        state: DecoderState | None,
        again: list[Group],
    ) -> int:
        """The group's share of a step: its choices; the requests that ended are answered."""
        first = not group.stepped
        try:
            ended, tokens = group.complete(log_probs, state)
        except Exception as error:
            self._recover(worker, group, error, again)
            return 0
        group.stepped = True
        self._time_tokens(worker, group.jobs if first else [], ended)
        for job, result in ended:
            job.settle(result, self.name)
        worker.let_go([job for job, _ in ended])
        return tokens

    def _time_tokens(
        self, worker: _Worker, starting: list[Job], ended: list[tuple[Job, Any]]
    ) -> None:
        """After a round's step: the time to the first token of the requests ``starting`` (a
        group's first step gives each its first token), and the time per output token of those
        that ``ended`` with a result (each group steps once a round: the rounds since its first
        token are its steps after the first). The work grows with the requests that start or
        end, not with those running."""
        now, first = time.monotonic(), []
        for job in starting:
            if job.first_token_at is None:
                job.first_token_at, job.first_round = now, worker.rounds
                first.append(job.queued_at)
        self.metrics.first_tokens(self.name, first, now)
        for job, result in ended:
            if job.first_token_at is not None and not isinstance(result, Exception):
                steps = worker.rounds - job.first_round
                self.metrics.per_output_token(self.name, now - job.first_token_at, steps)

    def _recover(self, worker: _Worker, group: Group, error: Exception, again: list[Group]) -> None:
        """After ``group``'s step failed, the group ends: where it held several requests, each
        that may start again (not started again before, no text streamed yet) starts again
        alone, in ``again``; the others fail with ``error``."""
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
        failed = [j for j in jobs if j not in retry]
        fail_jobs(failed, error, self.name)
        worker.let_go(failed)
        for job in retry:
            job.retried = True
            self._begin(worker, [job], again)

    def _begin(self, worker: _Worker, jobs: list[Job], groups: list[Group]) -> None:
        """Start ``jobs`` as one group in ``groups``; where that fails for several, each starts
        alone, so that only a request whose own start fails gets the error."""
        if worker.pools is None:
            worker.pools = self._new_pools()
        try:
            groups.append(self._start(jobs, worker.pools))
        except Exception as error:
            if len(jobs) == 1:
                fail_jobs(jobs, error, self.name)
                worker.let_go(jobs)
                return
            for job in jobs:
                self._begin(worker, [job], groups)

    def _admit(self, worker: _Worker) -> None:
        """Start waiting requests as new groups while they fit the round's prefill budget and
        the worker's cache tokens, and no worker before it takes them (see the module docstring
        and :meth:`_may_take`: a request that does not fit waits in the queue for rows to leave,
        or for another worker); waits for a request only when nothing runs. With batching off,
        one request at a time."""
        budget = self.options.max_batch_tokens
        while budget > 0 and (self.options.batching or not worker.groups):
            first = self._take(wait=None if not worker.groups else 0, fits=self._fitting(worker))
            if first is None:
                return
            if self._run_inline(first):
                continue
            worker.hold(first)
            jobs = self._companions(worker, first, budget)
            budget -= sum(j.cost for j in jobs)
            self._begin(worker, jobs, worker.groups)

    def _fitting(self, worker: _Worker) -> Callable[[Job], bool]:
        """:meth:`_may_take` for ``worker``, as :meth:`_take` asks it of the queue's head."""
        return lambda job: self._may_take(worker, job)

    def _companions(self, worker: _Worker, first: Job, budget: int) -> list[Job]:
        """``first`` and the waiting requests with its options that fit the prefill ``budget``
        and the worker (:meth:`_may_take`), each held as it is taken."""
        jobs, cost = [first], first.cost
        while self.options.batching:
            waiting, key = self._peek_key()
            if not waiting or key != first.key:
                break
            job = self._take(wait=0, fits=self._fitting(worker))
            if job is None:
                break
            if cost + job.cost > budget:
                self._put_back(job)
                break
            worker.hold(job)
            jobs.append(job)
            cost += job.cost
        return jobs


def _return_memory(worker: _Worker) -> None:
    """With nothing running: drop the worker's pools where they hold more than
    ``serve_pool_keep_bytes``, and give the freed heap back to the system (glibc)."""
    pools = worker.pools
    if pools is None:
        return
    held = sum(p.buffer.numel() * p.buffer.element_size() for p in pools)
    if held <= performance().serve_pool_keep_bytes:
        return
    worker.pools = None
    del pools
    return_freed_memory()


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


Finish = Callable[[Job, list[Any]], Any]
"""A request's result from what its rows ended with (in its order: a stepped search's rows, a
beam search's n-best lists), once all have ended."""

Watch = Callable[[Job, list[Row]], list[Hashable]]
"""Called after each step with a request's rows still decoding: the keys of those to end now
(a stop string, streaming updates sent on the way)."""


class _Requests:
    """What a group keeps of its requests: each one's rows (keys (request, row), ``counts[j]``
    of request j), which requests are open, and what their ended rows found. A request is
    answered the step its last row ends (one with no rows at the first step), so a step's work
    here grows with the rows that end at it, not with the rows running."""

    def __init__(self, jobs: list[Job], counts: Sequence[int], search: Any, finish: Finish):
        self.jobs, self.search, self._finish = list(jobs), search, finish
        self._count = dict(enumerate(counts))
        self._left = dict(self._count)  # per request: its rows not ended yet
        self._open = set(self._count)
        self._found: dict[Hashable, Any] = {}  # (request, row) -> what the row ended with
        self._failed: list[tuple[Job, Any]] = []  # requests failed alone, with their errors
        self._empty = [j for j, n in self._count.items() if n == 0]
        self.stepped = False

    @property
    def done(self) -> bool:
        return not self._open

    @property
    def step(self) -> StepFunction:
        step: StepFunction = self.search.step
        return step

    def _answered(self, ended: Sequence[tuple[Hashable, Any]]) -> list[tuple[Job, Any]]:
        """The requests whose last rows are among ``ended`` ((key, found) pairs), with their
        results, and those failed alone since the last step."""
        out, self._failed = self._failed, []
        done, self._empty = self._empty, []
        for key, found in ended:
            j: int = key[0]  # type: ignore[index]
            if j in self._open:
                self._found[key] = found
                self._left[j] -= 1
                done += [j] if self._left[j] == 0 else []
        for j in done:
            self._open.discard(j)
            found = [self._found.pop((j, r)) for r in range(self._count[j])]
            out.append((self.jobs[j], _outcome(self._finish, self.jobs[j], found)))
        return out

    def drop_cancelled(self) -> None:
        """The rows of the requests nobody waits for any more leave the batch now."""
        cancelled = [j for j in self._open if self.jobs[j].cancelled]
        if cancelled:
            self._drop(cancelled)

    def close(self) -> list[Job]:
        """End every request not answered yet (after an error): their rows leave, all at once
        (the state, perhaps broken by the error, is only released); returns them."""
        left = sorted(self._open)
        self._drop(left)
        return [self.jobs[j] for j in left]

    def _drop(self, requests: list[int]) -> None:
        """The rows of ``requests`` leave the batch; they are no longer answered."""
        self.search.remove([(j, r) for j in requests for r in range(self._count[j])])
        self._open -= set(requests)


class Answered(_Requests):
    """Requests with no row to step (a translation's texts all empty): answered at the first
    step, each by ``finish`` with no rows."""

    def __init__(self, jobs: list[Job], finish: Finish):
        super().__init__(jobs, [0] * len(jobs), None, finish)

    @property
    def step(self) -> None:  # type: ignore[override]
        return None

    def inputs(self) -> None:
        return None

    def complete(self, log_probs: Any, state: Any) -> tuple[list[tuple[Job, Any]], int]:
        return self._answered([]), 0

    def _drop(self, requests: list[int]) -> None:
        self._open -= set(requests)


class SteppedGroup(_Requests):
    """Greedy search or sampling of a group's requests; row keys are (request, row). The rows
    of watched requests (``watched``: stop strings or a stream) are looked at after each
    step."""

    search: SteppedSearch

    def __init__(
        self,
        jobs: list[Job],
        search: SteppedSearch,
        finish: Finish,
        watch: Watch | None = None,
        watched: Callable[[Job], bool] = lambda job: True,
    ):
        counts = [0] * len(jobs)
        for row in search.rows:
            counts[row.key[0]] += 1  # type: ignore[index]
        super().__init__(jobs, counts, search, finish)
        self._watch = watch
        self._watching = {j for j in self._open if watch is not None and watched(jobs[j])}

    def inputs(self) -> Inputs | None:
        if not self.search.begin():
            return None
        return self.search.tokens, self.search.state

    def complete(
        self, log_probs: Tensor | None, state: DecoderState | None
    ) -> tuple[list[tuple[Job, Any]], int]:
        ended = self.search.end(log_probs, state)
        if self._watching & self._open:
            ended += self._watched()
        return self._answered([(row.key, row) for row in ended]), self.search.appended

    def _watched(self) -> list[Row]:
        """The rows that end at a stop string (each watched request on its own: one whose
        watch fails fails alone)."""
        self.search.current_tokens()
        running: dict[int, list[Row]] = {}
        for row in self.search.rows:
            j: int = row.key[0]  # type: ignore[index]
            if j in self._watching:
                running.setdefault(j, []).append(row)
        assert self._watch is not None
        stop: list[Hashable] = []
        for j, rows in running.items():
            try:
                stop += self._watch(self.jobs[j], rows)
            except Exception as error:
                self._drop([j])
                self._failed.append((self.jobs[j], error))
        return self.search.remove(stop)


class BeamGroup(_Requests):
    """Beam search of requests with the same options: one
    :class:`~aiayn.decoding.beam.SteppedBeamSearch` over all their sentences, keyed (request,
    sentence) (:func:`row_keys`). A sentence that is done leaves the batch at once (its slots
    freed), and its request is answered the step its last sentence is done; a cancelled
    request's sentences leave at the next step.

    Args:
        jobs, counts: the requests, and the sentences of each (the search's, in order).
        search: the beam search of those sentences.
        finish: a request's result from the n-best lists of its sentences, in order.
    """

    search: SteppedBeamSearch

    def __init__(
        self,
        jobs: list[Job],
        counts: list[int],
        search: SteppedBeamSearch,
        finish: Callable[[Job, list[list[Hypothesis]]], Any],
    ):
        super().__init__(jobs, counts, search, finish)

    def inputs(self) -> Inputs | None:
        if self.search.done:
            return None
        return self.search.tokens, self.search.state

    def complete(
        self, log_probs: Tensor | None, state: DecoderState | None
    ) -> tuple[list[tuple[Job, Any]], int]:
        """The step's choices; the tokens it counts as generated are those of the best
        hypotheses of the sentences done at it (what their answers hold)."""
        done = [] if log_probs is None or state is None else self.search.end(log_probs, state)
        generated = sum(len(hyps[0].tokens) for _, hyps in done if hyps)
        return self._answered(done), generated


def row_keys(counts: Sequence[int]) -> list[tuple[int, int]]:
    """The keys (request, row) of ``counts[j]`` rows for each request j, in order."""
    return [(j, r) for j, n in enumerate(counts) for r in range(n)]
