"""A failure inside a decoding step fails only the request it belongs to (aiayn.serving.decode):
that request gets a 500 naming it, the requests decoding beside it (in the same batch or not)
get the library's answers, the worker lives on, and the next request is answered exactly."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer
from aiayn.data import normalize
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.decoding.translate import options_for_checkpoint, translate_ids
from aiayn.models.gpt2 import GPT2
from aiayn.serving import ServedModel, ServeOptions, create_app, load_served_model
from aiayn.serving.decode import BeamGroup, SteppedGroup, _Worker
from aiayn.serving.metrics import Metrics
from aiayn.serving.problems import Problem
from aiayn.serving.schemas import CompletionRequest

PROMPTS = ["the cat", "two men play", "a", "hello world the", "the cat sleeps on"]
POISON = 7  # the max_tokens (max_new_tokens) that marks the request whose step fails
NAMED = re.compile(r"^request (\S+) failed: internal error of model (\w+)")


@pytest.fixture(scope="module")
def served(checkpoints: dict[str, Path]) -> Iterator[tuple[TestClient, list[ServedModel]]]:
    options, metrics = ServeOptions(decode_workers=2, max_wait_ms=2), Metrics()
    models = [load_served_model(n, checkpoints[n], options, metrics) for n in ("mt", "lm")]
    with TestClient(create_app(models, options, metrics)) as client:
        yield client, models


@pytest.fixture(scope="module")
def expected(checkpoints: dict[str, Path]) -> Any:
    """The library's answer to a request body (``/v1/completions`` or ``/v1/translate``)."""
    lm = load_checkpoint(checkpoints["lm"], expect=GPT2)
    lm_tok = load_lm_tokenizer(lm.tokenizer_path)
    mt = load_checkpoint(checkpoints["mt"])
    mt_tok = load_translation_tokenizer(mt.path)

    def answer(body: dict[str, Any]) -> str:
        if "prompt" in body:
            sample = {"method": "sample", "temperature": body.get("temperature"),
                      "seed": body.get("seed")}  # fmt: skip
            options = GenerateOptions(max_new_tokens=body["max_tokens"],
                                      **(sample if "temperature" in body else {}))  # fmt: skip
            return generate(lm.model, lm_tok, [body["prompt"]], options)[0]
        o = options_for_checkpoint(None, beam_size=body["beam"],
                                   max_new_tokens=body["max_new_tokens"])  # fmt: skip
        found = translate_ids(mt.model, mt_tok.encode_batch([normalize(body["texts"][0])]),
                              mt_tok, o)  # fmt: skip
        return mt_tok.decode_batch([found[0][0].tokens])[0]

    return answer


def _requests(path: str) -> list[dict[str, Any]]:
    """Requests of the same options (one batch) and of others, the poisoned one among them."""
    if path == "/v1/translate":
        return [{"texts": [p], "beam": 2, "max_new_tokens": POISON if i == 2 else 6}
                for i, p in enumerate(PROMPTS)]  # fmt: skip
    greedy = [{"prompt": p, "max_tokens": POISON if i == 2 else 6} for i, p in enumerate(PROMPTS)]
    sampled = [{"prompt": p, "max_tokens": 5, "temperature": 0.9, "seed": i}
               for i, p in enumerate(PROMPTS[:3])]  # fmt: skip
    return greedy + sampled


def _poisoned(group: Any) -> bool:
    """Whether the group decodes the poisoned request (and has run its first step)."""
    if not group.search.stepped:
        return False
    payloads = [group.jobs[j].payload for j in group._open]
    limits = [getattr(p, "max_tokens", None) or p.options.max_new_tokens for p in payloads]
    return POISON in limits


def _body_text(body: dict[str, Any]) -> str:
    return str(body["choices"][0]["text"] if "choices" in body else body["translations"][0]["text"])


@pytest.mark.parametrize(("path", "group"), [("/v1/completions", SteppedGroup),
                                             ("/v1/translate", BeamGroup)])  # fmt: skip
def test_a_failed_step_fails_only_its_request(
    served: tuple[TestClient, list[ServedModel]], expected: Any, path: str, group: type,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The model call of every batch holding the poisoned request fails (its tokens are made
    ids outside the vocabulary): the joint call fails, each group steps alone, and the
    poisoned request's group's other requests start again alone and get their answers."""
    client, models = served
    inputs = group.inputs

    def failing(self: Any) -> Any:
        given = inputs(self)
        if given is None or not _poisoned(self):
            return given
        tokens, state = given
        return torch.full_like(tokens, 10**6), state  # the model call raises IndexError

    monkeypatch.setattr(group, "inputs", failing)
    requests = _requests(path)
    with caplog.at_level(logging.WARNING), ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda body: client.post(path, json=body), requests))
    for body, r in zip(requests, answers, strict=True):
        if body.get("max_tokens", body.get("max_new_tokens")) == POISON:
            assert r.status_code == 500, r.text
            error = r.json()["error"]
            match = NAMED.match(error["message"])
            assert match is not None and error["type"] == "server_error", error
            assert any(match[1] in rec.getMessage() and rec.exc_info for rec in caplog.records)
        else:
            assert r.status_code == 200, r.text
            assert _body_text(r.json()) == expected(body)
    monkeypatch.undo()
    _answers_exactly(client, models, expected)


def _answers_exactly(client: TestClient, models: list[ServedModel], expected: Any) -> None:
    """The next ordinary requests get the library's answers; no worker died."""
    for path, body in (("/v1/completions", {"prompt": "the cat", "max_tokens": 6}),
                       ("/v1/translate", {"texts": ["a small dog"], "beam": 2,
                                          "max_new_tokens": 6})):  # fmt: skip
        r = client.post(path, json=body)
        assert r.status_code == 200 and _body_text(r.json()) == expected(body), r.text
    for model in models:
        engine = next(iter(model.tasks.values())).engine
        assert engine.alive == engine.threads == 2 and engine.restarts == 0


def test_a_request_whose_own_work_fails_fails_alone(
    served: tuple[TestClient, list[ServedModel]], expected: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's result (its text, stop strings) fails: that request alone gets a 500; the
    requests in its batch are answered at once (no restart needed)."""
    client, models = served
    task = models[1].tasks["generate"]
    finish = task._finish  # type: ignore[attr-defined]

    def failing(job: Any, rows: Any) -> Any:
        if job.payload.max_tokens == POISON:
            raise UnicodeError("injected: the text cannot be decoded")
        return finish(job, rows)

    monkeypatch.setattr(task, "_finish", failing)
    requests = _requests("/v1/completions")[:5]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda b: client.post("/v1/completions", json=b), requests))
    statuses = [r.status_code for r in answers]
    assert statuses == [200, 200, 500, 200, 200], [r.text for r in answers]
    assert NAMED.match(answers[2].json()["error"]["message"])
    for body, r in zip(requests, answers, strict=True):
        if r.status_code == 200:
            assert _body_text(r.json()) == expected(body)
    monkeypatch.undo()
    _answers_exactly(client, models, expected)


def test_a_failed_group_ends_and_its_requests_start_again(checkpoints: dict[str, Path]) -> None:
    """Issue 62: after a failed step the group's requests were cleared but still counted open,
    so the next ``drop_cancelled`` raised IndexError and killed the worker. Now the group ends
    (its rows leave), each request starts again alone, and a request that fails alone gets a 500
    naming it."""
    served = load_served_model("lm", checkpoints["lm"], ServeOptions(), Metrics())
    lm: Any = served.tasks["generate"]
    engine: Any = lm.engine

    def broken(*_: Any) -> Any:
        raise RuntimeError("injected")

    async def run() -> list[Any]:
        a, b = (lm.prepare(CompletionRequest(prompt=p, max_tokens=5), 0) for p in ("the cat", "a"))
        worker = _Worker()
        engine._begin(worker, [a, b], worker.groups)
        group = worker.groups[0]
        engine._round(worker, [])
        group.search.end = broken  # the step's choices fail
        again: list[Any] = []
        engine._round(worker, again)
        assert group.done and not group.search.rows and len(again) == 2
        assert worker.pools[0].free == worker.pools[0].slots - 2  # the group's slots are freed
        b.cancelled = True
        group.drop_cancelled()  # the IndexError of before
        again[0].search.end = broken  # a's own step fails again: a 500 naming it
        worker.groups[:] = again
        while worker.groups:
            engine._round(worker, [])
            worker.groups[:] = [g for g in worker.groups if not g.done]
        done = await asyncio.wait_for(asyncio.gather(a.future, return_exceptions=True), 10)
        return [a.name, done[0], b.future.done()]

    name, error, answered = asyncio.run(run())
    assert isinstance(error, Problem) and error.status == 500 and name in error.message
    assert not answered  # b was cancelled: it left its new group unanswered
