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
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiayn.errors import UserError
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.problems import Problem

_log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One request's work for an engine.

    Attributes:
        payload: what the task needs (token ids, options).
        cost: its tokens, counted against a batch's budget.
        key: jobs of equal keys may share a batch (the same decoding options).
        loop, future: where the answer goes (set from the worker thread, thread-safely).
        progress: streaming: called on the event loop with each partial result.
        cancelled: set by the request when nobody waits for the answer any more.
    """

    payload: Any
    cost: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    key: Any = None
    progress: Callable[[Any], None] | None = None
    cancelled: bool = False
    queued_at: float = field(default_factory=time.monotonic)

    def resolve(self, result: Any) -> None:
        """Answer the request (from any thread)."""
        self.loop.call_soon_threadsafe(_settle, self.future, result, None)

    def fail(self, error: BaseException) -> None:
        """Fail the request (from any thread)."""
        self.loop.call_soon_threadsafe(_settle, self.future, None, error)

    def notify(self, update: Any) -> None:
        """Send a partial result (streaming), from any thread."""
        if self.progress is not None and not self.cancelled:
            self.loop.call_soon_threadsafe(self.progress, update)


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


def as_problem(error: Exception) -> BaseException:
    """An exception raised by the library for a job: a :class:`UserError` is the client's
    input (422); anything else is the service's fault and stays as it is (500)."""
    if isinstance(error, Problem):
        return error
    if isinstance(error, UserError):
        return Problem(422, str(error))
    return error


class Engine:
    """Worker threads and their queue (subclasses define :meth:`_loop`, which each thread runs
    on its own: what it holds between jobs is its own)."""

    def __init__(self, name: str, options: ServeOptions, metrics: Metrics, *, threads: int = 1):
        self.name, self.options, self.metrics = name, options, metrics
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._stopping = False
        self._threads: list[threading.Thread | None] = [None] * threads

    @property
    def threads(self) -> int:
        """The worker threads taking this engine's jobs (each runs :meth:`_loop`)."""
        return len(self._threads)

    def start(self) -> None:
        """Start the worker threads (again, after :meth:`stop`; running ones go on)."""
        with self._cond:
            self._stopping = False
            for i, thread in enumerate(self._threads):
                if thread is None or not thread.is_alive():
                    name = f"aiayn-serve-{self.name}" + (f"-{i}" if i else "")
                    thread = threading.Thread(target=self._main, name=name, daemon=True)
                    self._threads[i] = thread
                    thread.start()

    def stop(self) -> None:
        """Finish the queued and running jobs, then end the worker threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
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
            self._cond.notify()

    def _take(self, *, wait: float | None) -> Job | None:
        """The next job not cancelled; waiting at most ``wait`` seconds (None = until one comes
        or the engine stops; 0 = not at all). None when there is none."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while True:
                while self._queue:
                    job = self._queue.popleft()
                    self.metrics.queue_depth.labels(self.name).set(len(self._queue))
                    if not job.cancelled:
                        return job
                left = None if deadline is None else deadline - time.monotonic()
                if self._stopping or (left is not None and left <= 0):
                    return None
                self._cond.wait(left)

    def _put_back(self, job: Job) -> None:
        """Return ``job`` to the head of the queue (it did not fit this batch)."""
        with self._cond:
            self._queue.appendleft(job)
            self.metrics.queue_depth.labels(self.name).set(len(self._queue))

    def _run_inline(self, job: Job) -> bool:
        """Run ``job`` now if it is an :class:`Inline` job (and answer it); False otherwise."""
        if not isinstance(job.payload, Inline):
            return False
        try:
            result = job.payload.run()
        except Exception as error:
            job.fail(as_problem(error))
        else:
            job.resolve(result)
        return True

    def _peek_key(self) -> tuple[bool, Any]:
        """(whether a job waits, the key of the first one)."""
        with self._cond:
            return (True, self._queue[0].key) if self._queue else (False, None)

    def _main(self) -> None:
        try:
            self._loop()
        except Exception:  # a bug: fail what is left rather than leave requests hanging
            _log.exception("worker %s stopped", self.name)
            with self._cond:
                for job in self._queue:
                    job.fail(Problem(503, f"the worker of model {self.name} stopped"))
                self._queue.clear()
                self._stopping = True

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
        start = time.monotonic()
        try:
            results = list(self._run(jobs))
        except Exception as error:
            for job in jobs:
                job.fail(as_problem(error))
            return
        self.metrics.batch(self.name, sum(j.cost for j in jobs), len(jobs), start)
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, Exception):
                job.fail(as_problem(result))
            else:
                job.resolve(result)
