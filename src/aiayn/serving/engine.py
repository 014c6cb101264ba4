"""The workers that run a model: worker threads per served model and task (one for an encoder
task; ``decode_workers`` for translation and generation), fed by one bounded queue, answering
asyncio futures of the event loop that serves HTTP.

A :class:`Job` is one request: its payload, its cost in tokens (what a batch's budget counts), the
future its answer goes to and, for streaming, a callback for partial results. The queue refuses a
job beyond ``queue_size`` (:class:`~aiayn.serving.problems.Problem` 503 with ``Retry-After``). A
job cancelled by its request (the client went away, or its time ran out) is dropped before it
runs, or taken out of a running decode at the next step (:mod:`aiayn.serving.decode`).

:class:`BatchEngine` merges the waiting jobs of an encoder task (BERT embeddings, classes, masked
tokens; ViT classes) under a token budget: after the first job it waits at most ``max_wait_ms``
for more, and runs them as one call of the library function the CLI command calls.

An :class:`Inline` job (a request that runs alone: the attention maps of one input) may be
queued on any worker: the worker runs it on its own when it takes it, between batches or
decoding steps, so that it never runs the model at the same time as that worker's batches.

No request can take a model down. A failure fails only the requests it belongs to
(:func:`fail_jobs`): a 4xx where the input caused it (:class:`~aiayn.errors.UserError`: 422),
otherwise a 500 naming the request, its traceback logged with that name. A batch of several
requests that fails runs again one request at a time, so only the one that fails alone is
answered with the error. The worker threads are supervised: a failure that escapes a worker's
loop (a bug) fails the requests that worker held, and a new thread replaces it and takes the
queue on; ``aiayn_workers_alive{model}`` counts the threads running (:attr:`Engine.alive`, which
``/ready`` reads: :mod:`aiayn.serving.health`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiayn.errors import UserError
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.problems import Problem

_log = logging.getLogger(__name__)
T = TypeVar("T")

REQUEST_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop] = contextvars.ContextVar(
    "aiayn_request_loop"
)
"""The event loop a request is answered on, while its job is prepared on another thread
(:func:`prepared`): the loop the job's answer goes to."""


async def prepared(make: Callable[[], T]) -> T:
    """``make()`` (a task's ``prepare``: tokenizing, decoding an image) on a worker thread, so
    that the event loop goes on serving meanwhile; a job it makes is answered on this loop."""
    token = REQUEST_LOOP.set(asyncio.get_running_loop())
    try:
        return await asyncio.to_thread(make)
    finally:
        REQUEST_LOOP.reset(token)


def request_loop() -> asyncio.AbstractEventLoop:
    """The loop of the request being prepared: :data:`REQUEST_LOOP`, else the running one."""
    loop = REQUEST_LOOP.get(None)
    return loop if loop is not None else asyncio.get_running_loop()


@dataclass(eq=False)
class Job:
    """One request's work for an engine.

    Attributes:
        payload: what the task needs (token ids, options).
        cost: its tokens, counted against a batch's budget (the prefill's, for decoding).
        reserve: decoding: the cache tokens its rows may hold (rows × (input + output limit)),
            counted against a worker's ``--max-cache-tokens``.
        rows: decoding: the rows its search steps at most (sentences × beam, prompts × n).
        key: jobs of equal keys may share a batch (the same decoding options).
        loop, future: where the answer goes (set from the worker thread, thread-safely).
        progress: streaming: called on the event loop with each partial result.
        cancelled: set by the request when nobody waits for the answer any more.
        id: the request's own name (``req-…``), where its payload has none (:attr:`name`).
        settled: set by the worker when it answers or fails the request.
        streamed: whether a partial result was sent (the request cannot start again unseen).
        retried: whether the request already started again alone after a failure.
        first_token_at: when a decoding step first gave it a token (``time.monotonic``).
        first_round: the decode worker's round that gave it its first token.
    """

    payload: Any
    cost: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    key: Any = None
    reserve: int = 0
    rows: int = 1
    progress: Callable[[Any], None] | None = None
    cancelled: bool = False
    queued_at: float = field(default_factory=time.monotonic)
    id: str = field(default_factory=lambda: "req-" + secrets.token_hex(8))
    settled: bool = False
    streamed: bool = False
    retried: bool = False
    first_token_at: float | None = None
    first_round: int = 0

    @property
    def name(self) -> str:
        """The request's name in error messages and the log: its payload's ``id`` where it has
        one (a completion's ``cmpl-…``, which its answer carries), else :attr:`id`."""
        named = getattr(self.payload, "id", None)
        return named if isinstance(named, str) else self.id

    def resolve(self, result: Any) -> None:
        """Answer the request (from any thread)."""
        self.settled = True
        self.loop.call_soon_threadsafe(_settle, self.future, result, None)

    def fail(self, error: BaseException) -> None:
        """Fail the request (from any thread)."""
        self.settled = True
        self.loop.call_soon_threadsafe(_settle, self.future, None, error)

    def notify(self, update: Any) -> None:
        """Send a partial result (streaming), from any thread."""
        if self.progress is not None and not self.cancelled:
            self.streamed = True
            self.loop.call_soon_threadsafe(self.progress, update)

    def settle(self, result: Any, model: str) -> None:
        """Answer the request with ``result``, or fail it where ``result`` is the exception
        that ended it (:func:`fail_jobs`)."""
        if isinstance(result, Exception):
            fail_jobs([self], result, model)
        else:
            self.resolve(result)


@dataclass(frozen=True)
class Inline:
    """A job's payload that runs alone on the worker that takes it: ``run()`` gives its result
    (or raises)."""

    run: Callable[[], Any]


INLINE = "inline"
"""The key of :class:`Inline` jobs: no other job shares it, so none joins their batches."""


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the request was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def as_problem(error: BaseException) -> BaseException:
    """An exception raised by the library for a job: a :class:`UserError` is the client's
    input (422); anything else is the service's fault and stays as it is (500)."""
    if isinstance(error, Problem):
        return error
    if isinstance(error, UserError):
        return Problem(422, str(error))
    return error


def internal_error(job: Job, model: str) -> Problem:
    """The 500 of a request that failed through no fault of its input: it names the request
    (the log holds the traceback under that name)."""
    return Problem(
        500,
        f"request {job.name} failed: internal error of model {model} (the server's log "
        "has the details under the request's name)",
    )


def fail_jobs(jobs: Sequence[Job], error: BaseException, model: str) -> None:
    """Fail ``jobs`` (which ``error`` ended) and nothing else: with a 4xx where their input
    caused it (a :class:`Problem` as it is, a :class:`UserError` 422), otherwise with a 500
    naming each request, the traceback logged once with their names."""
    if not jobs:
        return
    problem = as_problem(error)
    if problem is error and not isinstance(error, Problem):
        names = ", ".join(job.name for job in jobs)
        _log.error("model %s: request(s) %s failed", model, names, exc_info=error)
    for job in jobs:
        job.fail(problem if isinstance(problem, Problem) else internal_error(job, model))


class Engine:
    """Worker threads and their queue (subclasses define :meth:`_loop`, which each thread runs
    on its own: what it holds between jobs is its own).

    Attributes:
        restarts: worker threads replaced after a failure escaped their loop.
    """

    def __init__(self, name: str, options: ServeOptions, metrics: Metrics, *, threads: int = 1):
        self.name, self.options, self.metrics = name, options, metrics
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._stopping = False
        self._threads: list[threading.Thread | None] = [None] * threads
        self._mine = threading.local()  # per worker thread: its slot, its jobs not settled yet
        self._alive = 0  # threads in their loop (the gauge's value for this engine)
        self._quick_failures = 0  # failures in a row of threads that ran under a second
        self._running: set[Job] = set()  # taken by a worker, perhaps answered since
        self.restarts = 0
        metrics.watch_running(name, self.running)

    def running(self) -> int:
        """The requests taken by a worker and neither answered nor cancelled yet."""
        with self._cond:
            self._running = {j for j in self._running if not (j.settled or j.cancelled)}
            return len(self._running)

    @property
    def threads(self) -> int:
        """The worker threads taking this engine's jobs (each runs :meth:`_loop`)."""
        return len(self._threads)

    @property
    def alive(self) -> int:
        """The worker threads running their loop now (:attr:`threads` while all is well)."""
        with self._cond:
            return self._alive

    @property
    def accepting(self) -> bool:
        """Whether the engine takes requests: started, and not stopping."""
        with self._cond:
            return not self._stopping and any(t is not None for t in self._threads)

    def start(self) -> None:
        """Start the worker threads (again, after :meth:`stop`; running ones go on)."""
        with self._cond:
            self._stopping = False
            for i in range(len(self._threads)):
                self._spawn(i)

    def _spawn(self, slot: int) -> None:
        """Start worker thread ``slot`` unless it runs (the lock held)."""
        thread = self._threads[slot]
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            return
        name = f"aiayn-serve-{self.name}" + (f"-{slot}" if slot else "")
        thread = threading.Thread(target=self._main, args=(slot,), name=name, daemon=True)
        self._threads[slot] = thread
        self._alive += 1  # counted from its start, so that /ready is true once start() returns
        self.metrics.workers.labels(self.name).inc()
        thread.start()

    def stop(self) -> None:
        """Finish the queued and running jobs, then end the worker threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            threads = list(self._threads)  # none is replaced from now on
        for thread in threads:
            if thread is not None and thread.is_alive():
                thread.join()

    def submit(self, job: Job) -> None:
        """Queue ``job``; a full queue is a 503 with ``Retry-After``."""
        with self._cond:
            if self._stopping:
                raise Problem(503, "the server is shutting down", headers={"Retry-After": "1"})
            if len(self._queue) >= self.options.queue_size:
                raise Problem(
                    503,
                    f"the queue of model {self.name} is full ({self.options.queue_size} "
                    "requests waiting): retry later",
                    headers={"Retry-After": "1"},
                )
            self._queue.append(job)
            self.metrics.queue_depth.labels(self.name).set(len(self._queue))
            self._cond.notify_all()  # a worker that may not take it waits on

    def _take(self, *, wait: float | None, fits: Callable[[Job], bool] | None = None) -> Job | None:
        """The next job not cancelled; waiting at most ``wait`` seconds (None = until one comes
        or the engine stops; 0 = not at all). None when there is none. With ``fits`` (called
        with the lock held), only a head job it accepts is taken; otherwise the call waits as
        for an empty queue (a worker's admissions, :meth:`submit` and :meth:`_put_back`
        notify)."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while True:
                while self._queue:
                    job = self._queue[0]
                    if not job.cancelled and fits is not None and not fits(job):
                        break
                    self._queue.popleft()
                    self.metrics.queue_depth.labels(self.name).set(len(self._queue))
                    if not job.cancelled:
                        self._hold(job)
                        return job
                left = None if deadline is None else deadline - time.monotonic()
                if self._stopping or (left is not None and left <= 0):
                    return None
                self._cond.wait(left)

    def _put_back(self, job: Job) -> None:
        """Return ``job`` to the head of the queue (it did not fit this batch)."""
        held: list[Job] = getattr(self._mine, "jobs", [])
        if job in held:
            held.remove(job)
        with self._cond:
            self._running.discard(job)
            self._queue.appendleft(job)
            self.metrics.queue_depth.labels(self.name).set(len(self._queue))
            self._cond.notify_all()  # another worker may take it

    def _hold(self, job: Job) -> None:
        """Count ``job`` among the calling worker's (failed if the worker fails); those already
        answered or cancelled are let go."""
        held: list[Job] | None = getattr(self._mine, "jobs", None)
        if held is None:
            held = self._mine.jobs = []
        held[:] = [j for j in held if not (j.settled or j.cancelled)]
        held.append(job)
        self._running = {j for j in self._running if not (j.settled or j.cancelled)}
        self._running.add(job)

    def _run_inline(self, job: Job) -> bool:
        """Run ``job`` now if it is an :class:`Inline` job (and answer it); False otherwise."""
        if not isinstance(job.payload, Inline):
            return False
        try:
            result = job.payload.run()
        except Exception as error:
            fail_jobs([job], error, self.name)
        else:
            job.resolve(result)
        return True

    def _peek_key(self) -> tuple[bool, Any]:
        """(whether a job waits, the key of the first one)."""
        with self._cond:
            return (True, self._queue[0].key) if self._queue else (False, None)

    def _main(self, slot: int) -> None:
        """Worker thread ``slot``: :meth:`_loop` until the engine stops. A failure escaping the
        loop (a bug) fails the requests this thread held, each with a 500 naming it, and a new
        thread replaces this one (after a pause while threads keep failing within a second)."""
        self._mine.jobs, self._mine.slot = [], slot
        started = time.monotonic()  # counted alive by _spawn
        failure: BaseException | None = None
        try:
            self._loop()
        except BaseException as error:  # a bug: the thread's requests fail, the model goes on
            failure = error
        finally:
            with self._cond:
                self._alive -= 1
                self.metrics.workers.labels(self.name).dec()
                self._cond.notify_all()  # workers that left its jobs to it may take them
        if failure is not None:
            held = [j for j in self._mine.jobs if not (j.settled or j.cancelled)]
            names = ", ".join(j.name for j in held) or "none"
            _log.error(
                "worker %s (thread %d) failed; its requests fail with it: %s",
                self.name,
                slot,
                names,
                exc_info=failure,
            )
            for job in held:
                job.fail(internal_error(job, self.name))
            self._replace(slot, time.monotonic() - started)

    def _replace(self, slot: int, ran: float) -> None:
        """Start a new worker thread in ``slot`` (unless the engine stops), ``ran`` seconds
        after the failed one started: at once, or after 0.01 · 2^n s (at most 1 s) for the n-th
        failure in a row of threads that ran under a second."""
        with self._cond:
            self._quick_failures = self._quick_failures + 1 if ran < 1.0 else 0
            pause = min(1.0, 0.01 * 2**self._quick_failures) if self._quick_failures > 1 else 0
        time.sleep(pause)
        with self._cond:
            if self._stopping:
                return
            self.restarts += 1
            self.metrics.worker_restarts.labels(self.name).inc()
            self._spawn(slot)

    def _loop(self) -> None:
        raise NotImplementedError


Runner = Callable[[Sequence[Job]], Sequence[Any]]
"""A task's batch function: jobs -> one result (or exception) per job."""


class BatchEngine(Engine):
    """Merges waiting jobs under the token budget (``max_batch_tokens``), waiting at most
    ``max_wait_ms`` after the first, and runs them in one call of ``run``."""

    def __init__(self, name: str, options: ServeOptions, metrics: Metrics, run: Runner):
        super().__init__(name, options, metrics)
        self._run = run

    def _loop(self) -> None:
        while True:
            first = self._take(wait=None)
            if first is None:
                return
            if self._run_inline(first):
                continue
            jobs = self._gather(first)
            self._execute(jobs)

    def _gather(self, first: Job) -> list[Job]:
        """``first`` and the jobs that join it: same key, within the budget, arriving before
        the wait ends."""
        jobs, cost = [first], first.cost
        if not self.options.batching:
            return jobs
        deadline = time.monotonic() + self.options.max_wait_ms / 1000
        while cost < self.options.max_batch_tokens:
            job = self._take(wait=max(0.0, deadline - time.monotonic()))
            if job is None:
                break
            if job.key != first.key or cost + job.cost > self.options.max_batch_tokens:
                self._put_back(job)
                break
            jobs.append(job)
            cost += job.cost
        return jobs

    def _execute(self, jobs: list[Job]) -> None:
        """Run ``jobs`` as one batch and answer each; a batch of several that fails runs again
        one job at a time, so that only a job that fails alone gets the error."""
        start = time.monotonic()
        try:
            results = list(self._run(jobs))
        except Exception as error:
            if len(jobs) == 1:
                fail_jobs(jobs, error, self.name)
                return
            _log.warning(
                "model %s: a batch of %d failed (%r); each runs alone", self.name, len(jobs), error
            )
            for job in jobs:
                self._execute([job])
            return
        self.metrics.batch(self.name, sum(j.cost for j in jobs), len(jobs), start)
        for job, result in zip(jobs, results, strict=True):
            job.settle(result, self.name)
