"""Streamed completions: OpenAI's server-sent events, one chunk per new piece of a choice's text.

The worker sends each choice's text so far after every step (already cut at a stop string that
has appeared). What is sent of it is what can no longer change: a text that ends in an
incomplete character (a byte-level tokenizer's U+FFFD) or in the beginning of a stop string
(``" o"`` of ``"n o"`` may yet become the stop) holds that end back (:func:`sendable`), so the
streamed pieces join to exactly the unstreamed text.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiayn.serving.engine import Job
from aiayn.serving.openai_api import CompletionPlan

Update = tuple[int, str, str | None]
"""A worker's streamed update: (choice index, its text so far, its finish reason or None)."""


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` may begin a stop string: the length of the
    longest end of ``text`` that is a proper beginning of one of ``stops`` (0: none).

    ``held_back("X on", ["n o"]) == 1``; ``held_back("X on ", ["n o"]) == 2``;
    ``held_back("X o", ["n o"]) == 0``."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


def sendable(text: str, stops: Sequence[str], *, final: bool) -> str:
    """What of a choice's ``text`` so far may be sent: all of it when it is ``final``; before,
    without a trailing incomplete character (U+FFFD) and without an end that may begin a stop
    string (:func:`held_back`)."""
    if final:
        return text
    text = text.rstrip("\ufffd")
    return text[: len(text) - held_back(text, stops)]


def delta(sent: str, text: str, stops: Sequence[str], *, final: bool) -> str:
    """The next piece to send after ``sent``: what :func:`sendable` allows of ``text`` beyond
    it ("" where that no longer extends what was sent)."""
    ready = sendable(text, stops, final=final)
    return ready[len(sent) :] if ready.startswith(sent) else ""


async def events(
    plan: CompletionPlan, updates: asyncio.Queue[Update], timeout: float, model: str
) -> AsyncIterator[str]:
    """The SSE stream of a completion: one chunk per new piece of a choice's text (the first
    with the echoed prompt), a chunk with its ``finish_reason`` at its end, the usage chunk
    when asked for (``stream_options.include_usage``), then ``[DONE]``."""
    job = plan.job
    sent: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while not job.future.done() or not updates.empty():
            update = await _next_update(job, updates, deadline)
            if update is None:
                if job.future.done():
                    continue
                yield _chunk(plan, model, 0, "", None, error="no answer within the timeout")
                break
            index, text, reason = update
            first = index not in sent
            piece = delta(sent.get(index, ""), text, plan.stops, final=reason is not None)
            head = plan.prefix(index) if first else ""
            if piece or head or reason is not None:
                sent[index] = sent.get(index, "") + piece
                yield _chunk(plan, model, index, head + piece, reason)
        async for tail in _ending(plan, model):
            yield tail
    finally:
        job.cancelled = True  # the client went away, or all is sent: nothing more to do


async def _ending(plan: CompletionPlan, model: str) -> AsyncIterator[str]:
    """An error chunk if the job failed, else the usage chunk when asked for; then ``[DONE]``."""
    future = plan.job.future
    if future.done() and not future.cancelled():
        failed = future.exception()
        if failed is not None:
            yield _chunk(plan, model, 0, "", None, error=str(failed))
        elif plan.include_usage:
            usage = future.result().usage
            yield _data(_base(plan, model, [], None if usage is None else usage.model_dump()))
    yield "data: [DONE]\n\n"


async def _next_update(job: Job, updates: asyncio.Queue[Update], deadline: float) -> Update | None:
    """The next streamed update, or None when the job ended without one or time ran out."""
    if not updates.empty():
        return updates.get_nowait()
    getter = asyncio.ensure_future(updates.get())
    await asyncio.wait(
        {getter, job.future},
        timeout=max(0.0, deadline - time.monotonic()),
        return_when=asyncio.FIRST_COMPLETED,
    )
    if getter.done():
        return getter.result()
    getter.cancel()
    return None


def _base(
    plan: CompletionPlan, model: str, choices: list[dict[str, Any]], usage: Any = None
) -> dict[str, Any]:
    """A ``text_completion`` chunk (with ``usage``, null but the last, when asked for)."""
    p = plan.job.payload
    chunk: dict[str, Any] = {
        "id": p.id,
        "object": "text_completion",
        "created": p.created,
        "model": model,
        "choices": choices,
    }
    if plan.include_usage:
        chunk["usage"] = usage
    return chunk


def _chunk(
    plan: CompletionPlan, model: str, index: int, text: str, reason: str | None, error: str = ""
) -> str:
    """The event of one piece of choice ``index`` (with its finish reason at its end), or of
    an ``error`` that ended the stream."""
    choice = {"text": text, "index": index, "logprobs": None, "finish_reason": reason}
    chunk = _base(plan, model, [choice])
    if error:
        chunk["error"] = {"message": error, "type": "server_error"}
    return _data(chunk)


def _data(chunk: dict[str, Any]) -> str:
    """A server-sent event carrying ``chunk`` as JSON."""
    return f"data: {json.dumps(chunk)}\n\n"
