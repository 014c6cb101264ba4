"""The workers are supervised (aiayn.serving.engine): a failure that escapes a worker's loop
fails only the requests that worker held (a 500 naming each), a new thread replaces it, the
worker gauge and restart counter say so, and the model keeps answering exactly. An encoder batch
that fails runs again one request at a time, so only the request that fails alone gets it."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from aiayn.checkpoint import load_checkpoint
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.models.gpt2 import GPT2
from aiayn.serving import ServedModel, ServeOptions, create_app, load_served_model
from aiayn.serving.engine import Engine
from aiayn.serving.metrics import Metrics

PROMPTS = ["the cat", "two men play", "a", "hello world the"]


@pytest.fixture(scope="module")
def served(checkpoints: dict[str, Path]) -> Iterator[tuple[TestClient, list[ServedModel]]]:
    options, metrics = ServeOptions(decode_workers=2), Metrics()
    models = [load_served_model(n, checkpoints[n], options, metrics) for n in ("lm", "mlm")]
    with TestClient(create_app(models, options, metrics)) as client:
        yield client, models


@pytest.fixture(scope="module")
def greedy(checkpoints: dict[str, Path]) -> Callable[[str, int], str]:
    c = load_checkpoint(checkpoints["lm"], expect=GPT2)
    tokenizer = load_lm_tokenizer(c.tokenizer_path)

    def text(prompt: str, tokens: int) -> str:
        return generate(c.model, tokenizer, [prompt], GenerateOptions(max_new_tokens=tokens))[0]

    return text


def _metric(client: TestClient, line: str) -> float:
    text = client.get("/metrics").text
    return float(text.split(line + " ")[1].split()[0])


def _wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_worker_that_fails_is_replaced_and_the_model_keeps_serving(
    served: tuple[TestClient, list[ServedModel]], greedy: Callable[[str, int], str],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    client, models = served
    engine: Any = models[0].tasks["generate"].engine
    assert engine.alive == 2 and _metric(client, 'aiayn_workers_alive{model="lm"}') == 2
    companions, broke = engine._companions, []

    def failing(worker: Any, first: Any, budget: int) -> Any:  # a bug outside any group
        if not broke:
            broke.append(first)
            raise RuntimeError("injected: the worker's loop fails")
        return companions(worker, first, budget)

    monkeypatch.setattr(engine, "_companions", failing)
    with caplog.at_level(logging.ERROR), ThreadPoolExecutor(4) as pool:
        bodies = [{"prompt": p, "max_tokens": 6} for p in PROMPTS]
        answers = list(pool.map(lambda b: client.post("/v1/completions", json=b), bodies))
    failed = [r for r in answers if r.status_code != 200]
    assert len(failed) == 1 and failed[0].status_code == 500, [r.text for r in answers]
    message = failed[0].json()["error"]["message"]
    name = re.match(r"request (cmpl-\w+) failed", message)
    assert name is not None and name[1] == broke[0].name, message
    assert any(name[1] in r.getMessage() for r in caplog.records)  # the log names it too
    for body, r in zip(bodies, answers, strict=True):
        if r.status_code == 200:
            assert r.json()["choices"][0]["text"] == greedy(str(body["prompt"]), 6)
    _wait_for(lambda: engine.alive == 2)
    assert engine.restarts == 1
    assert _metric(client, 'aiayn_workers_alive{model="lm"}') == 2
    assert _metric(client, 'aiayn_worker_restarts_total{model="lm"}') == 1
    r = client.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy("the cat", 8)


def test_an_encoder_batch_that_fails_fails_only_its_request(
    served: tuple[TestClient, list[ServedModel]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, models = served
    engine: Any = models[1].tasks["embed"].engine
    texts = ["the cat sat", "a dog", "poison", "paris is a city", "she reads"]
    alone = {t: client.post("/v1/embeddings", json={"model": "mlm", "input": t}).json()
             for t in texts if t != "poison"}  # fmt: skip
    run = engine._run

    def failing(jobs: Any) -> Any:
        if any("poison" in str(j.payload) for j in jobs):
            raise RuntimeError("injected: the batch fails")
        return run(jobs)

    monkeypatch.setattr(engine, "_run", failing)
    with ThreadPoolExecutor(len(texts)) as pool:
        answers = list(pool.map(
            lambda t: client.post("/v1/embeddings", json={"model": "mlm", "input": t}), texts
        ))  # fmt: skip
    for text, r in zip(texts, answers, strict=True):
        if text == "poison":
            assert r.status_code == 500 and "internal error of model mlm" in r.text, r.text
        else:
            assert r.status_code == 200, r.text
            got = r.json()["data"][0]["embedding"]
            assert got == pytest.approx(alone[text]["data"][0]["embedding"], abs=1e-5)
    assert engine.alive == 1 and engine.restarts == 0


def test_stop_ends_the_workers_and_start_brings_them_back(checkpoints: dict[str, Path]) -> None:
    options, metrics = ServeOptions(decode_workers=2), Metrics()
    model = load_served_model("lm", checkpoints["lm"], options, metrics)
    engine: Engine = model.tasks["generate"].engine
    assert (engine.alive, engine.accepting) == (0, False)  # not started: no thread, none replaced
    engine.start()
    _wait_for(lambda: engine.alive == 2)
    assert engine.accepting
    engine.stop()
    assert (engine.alive, engine.accepting) == (0, False)
    engine.start()
    _wait_for(lambda: engine.alive == 2)
    engine.stop()
