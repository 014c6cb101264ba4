"""What OpenAI's clients send, and what they expect back, around the tasks of ``/v1/completions``
and ``/v1/embeddings``: the fields a model cannot honour refused by name (400), token-id prompts,
``echo``, usage counted as OpenAI counts it, OpenAI's 400 for a prompt or input beyond the
model's length, base64 embeddings and ``dimensions``, and the model objects of ``/v1/models``.

The tasks (:mod:`aiayn.serving.tasks`, :mod:`aiayn.serving.encoder_tasks`) compute the results;
this layer only checks requests before they reach a task and reshapes the task's answer.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from aiayn.serving import schemas as s
from aiayn.serving.engine import Job
from aiayn.serving.problems import Problem

T = TypeVar("T")

_PENALTY = "repetition penalties are not served (aiayn generate has none): leave it out or 0"
_LOGPROBS = (
    "token log-probabilities are not served (the stepped search keeps only the chosen "
    "tokens): leave it out or null"
)


def unhonoured(body: s.CompletionBody) -> Problem | None:
    """The 400 naming the first field of ``body`` whose value no served model can honour
    (None when every field is at a value served: the neutral ones of OpenAI's extras)."""
    problems = [
        ("presence_penalty", bool(body.presence_penalty), _PENALTY),
        ("frequency_penalty", bool(body.frequency_penalty), _PENALTY),
        ("logprobs", body.logprobs is not None, _LOGPROBS),
        ("logit_bias", bool(body.logit_bias), "biasing tokens is not served: leave it out"),
        (
            "suffix",
            bool(body.suffix),
            "inserting text before a suffix is not served "
            "(GPT-2 continues a prompt only): leave it out",
        ),
        (
            "best_of",
            body.best_of not in (None, body.n),
            "ranking more candidates than n by "
            "log-probability is not served: leave it out or equal to n",
        ),
        (
            "stream_options",
            body.stream_options is not None and not body.stream,
            "only with stream: true",
        ),
        (
            "stream_options.include_obfuscation",
            bool(body.stream_options and body.stream_options.include_obfuscation),
            "padding chunks is not done: leave it out",
        ),
    ]
    for field, refused, why in problems:
        if refused:
            return Problem(400, f"{field}: {why}", param=field)
    return None


def as_400(prepare: Callable[[], T]) -> T:
    """``prepare()``, with its 413 for an input beyond the model's length answered 400, as
    OpenAI answers a prompt or input over a model's context length."""
    try:
        return prepare()
    except Problem as problem:
        if problem.status != 413:
            raise
        raise Problem(400, problem.message, param=problem.param) from None


def token_prompts(prompt: Any) -> list[list[int]] | None:
    """A request's prompts as token-id lists, or None when they are texts."""
    if isinstance(prompt, str) or isinstance(prompt[0], str):
        return None
    if isinstance(prompt[0], int):
        return [list(prompt)]
    return [list(row) for row in prompt]


def task_request(body: s.CompletionBody, prompt: str | list[str]) -> s.CompletionRequest:
    """What the generation task reads of ``body``: its options, with ``prompt``."""
    names = [name for name in s.CompletionOptions.model_fields if name in body.model_fields_set]
    return s.CompletionRequest.model_construct(
        prompt=prompt, **{name: getattr(body, name) for name in names}
    )


@dataclass
class CompletionPlan:
    """A completion request on its way: its job and what its answer needs from the request.

    Attributes:
        job: the task's job (the prompts' token ids in its payload).
        n: completions per prompt (choice ``index`` = prompt number × n + choice number).
        echo: per prompt, the text put before its completions (``echo: true``), else None.
        stops: the stop strings (a streamed text holds back what may begin one).
        include_usage: streaming: end with a usage chunk (``stream_options.include_usage``).
    """

    job: Job
    n: int
    echo: list[str] | None
    stops: tuple[str, ...]
    include_usage: bool = False

    def prefix(self, index: int) -> str:
        """The echoed prompt before choice ``index`` ("" without ``echo``)."""
        return "" if self.echo is None else self.echo[index // self.n]

    def finish(self, answer: s.CompletionResponse) -> s.CompletionResponse:
        """The answer as OpenAI gives it: the prompts echoed where asked."""
        choices = [
            c.model_copy(update={"text": self.prefix(c.index) + c.text}) for c in answer.choices
        ]
        return answer.model_copy(update={"choices": choices})


def plan_completion(task: Any, body: s.CompletionBody, created: int) -> CompletionPlan:
    """The job of ``body`` for the generation ``task`` (``GenerateTask``), after the OpenAI
    checks: 400 for a value no model honours or a prompt + ``max_tokens`` beyond the model's
    positions, 422 for a token id outside the vocabulary."""
    refused = unhonoured(body)
    if refused is not None:
        raise refused
    ids = token_prompts(body.prompt)
    if ids is None:
        prompt = cast(str | list[str], body.prompt)
        job = as_400(lambda: task.prepare(task_request(body, prompt), created))
        texts = [prompt] if isinstance(prompt, str) else prompt
    else:
        job = _token_job(task, body, ids, created)
        texts = [task.tokenizer.decode(row) for row in ids]
    stops = () if body.stop is None else (body.stop,) if isinstance(body.stop, str) else body.stop
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return CompletionPlan(job, body.n, texts if body.echo else None, tuple(stops), include_usage)


def _token_job(task: Any, body: s.CompletionBody, ids: list[list[int]], created: int) -> Job:
    """The job of prompts given as token ids: each id checked against the vocabulary (422
    naming its position), then the task's job of these ids (its checks of length, ``n`` and
    the sampling options, as for text prompts)."""
    config, single = task.config, isinstance(body.prompt[0], int)
    for i, row in enumerate(ids):
        field = "prompt" if single else f"prompt.{i}"
        bad = next((j for j, x in enumerate(row) if x >= config.vocab_size), None)
        if bad is not None:
            raise Problem(
                422,
                f"{field}.{bad}: token id {row[bad]} is outside the vocabulary "
                f"(0..{config.vocab_size - 1})",
                param=f"{field}.{bad}",
            )
    options = task_request(body, "")  # the request's options; its prompts are ``ids``
    job: Job = as_400(lambda: task.prepare_ids(options, ids, single, created))
    return job


def check_embeddings(body: s.EmbeddingRequest, width: int) -> None:
    """400 for ``dimensions`` other than the model's ``width``: none of the served BERTs was
    trained for shortened vectors (Matryoshka representation learning), so a cut and
    renormalised vector would not be a meaningful embedding."""
    if body.dimensions is not None and body.dimensions != width:
        raise Problem(
            400,
            f"dimensions: the model gives {width}-dimensional embeddings and was not "
            f"trained for shorter ones: leave dimensions out or give {width}",
            param="dimensions",
        )


def encode_embeddings(answer: s.EmbeddingResponse, encoding: str) -> s.EmbeddingResponse:
    """The answer with its vectors as ``encoding`` asks: floats, or ``base64`` (each vector's
    little-endian float32 bytes, base64-encoded, as OpenAI sends them)."""
    if encoding != "base64":
        return answer
    data = [d.model_copy(update={"embedding": to_base64(d.embedding)}) for d in answer.data]
    return answer.model_copy(update={"data": data})


def to_base64(vector: Sequence[float] | str) -> str:
    """A vector's little-endian float32 bytes in base64 (a string is returned as it is)."""
    if isinstance(vector, str):
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def from_base64(text: str) -> list[float]:
    """The floats of :func:`to_base64`'s string."""
    return [float(x) for x in np.frombuffer(base64.b64decode(text), dtype="<f4")]
