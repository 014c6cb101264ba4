"""Sampling values that underflow, through ``/v1/completions``: issue 62's reproductions. A
temperature or top-p near 0 (1e-38, 1e-300, 5e-324) means the top token, as ``aiayn generate
--sample`` gives it (greedy search's text); the model's workers live on, and the next ordinary
request is answered exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.checkpoint import load_checkpoint
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.models.gpt2 import GPT2
from aiayn.serving import ServedModel, ServeOptions, create_app, load_served_model
from aiayn.serving.health import readiness
from aiayn.serving.metrics import Metrics

PROMPT = "the cat sleeps"
TINY = [1e-38, 1e-300, 5e-324]


@pytest.fixture(scope="module")
def served(checkpoints: dict[str, Path]) -> Iterator[tuple[TestClient, list[ServedModel]]]:
    """The GPT-2 served as ``gpt2`` (two decode workers), with its loaded model."""
    options, metrics = ServeOptions(decode_workers=2), Metrics()
    models = [load_served_model("gpt2", checkpoints["lm"], options, metrics)]
    with TestClient(create_app(models, options, metrics)) as client:
        yield client, models


@pytest.fixture(scope="module")
def library(checkpoints: dict[str, Path]) -> Any:
    """``generate``'s text for one prompt and options (the CLI's continuation)."""
    c = load_checkpoint(checkpoints["lm"], expect=GPT2)
    tokenizer = load_lm_tokenizer(c.tokenizer_path)

    def text(prompt: str, **options: Any) -> str:
        return generate(c.model, tokenizer, [prompt], GenerateOptions(**options))[0]

    return text


def _complete(client: TestClient, **body: Any) -> Any:
    r = client.post("/v1/completions", json={"model": "gpt2", "prompt": PROMPT, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _still_serving(client: TestClient, models: list[ServedModel], library: Any) -> None:
    """The next ordinary requests (greedy, seeded sampling) get the library's answers, and
    every worker runs."""
    assert _complete(client, max_tokens=6) == library(PROMPT, max_new_tokens=6)
    sampled = library(PROMPT, max_new_tokens=6, method="sample", temperature=0.8, seed=3)
    assert _complete(client, max_tokens=6, temperature=0.8, seed=3) == sampled
    state = readiness(models)
    assert state.status == "ready" and state.models[0].workers_alive == 2


@pytest.mark.parametrize("field", ["temperature", "top_p"])
@pytest.mark.parametrize("tiny", TINY)
def test_values_that_underflow_mean_the_top_token(
    served: tuple[TestClient, list[ServedModel]], library: Any, field: str, tiny: float
) -> None:
    client, models = served
    body: dict[str, Any] = {"temperature": tiny} if field == "temperature" else {
        "temperature": 1.0, "top_p": tiny
    }  # fmt: skip
    greedy = library(PROMPT, max_new_tokens=8)
    assert _complete(client, max_tokens=8, **body) == greedy
    cli = library(PROMPT, max_new_tokens=8, method="sample", seed=11,
                  **{("top_p" if field == "top_p" else "temperature"): tiny})  # fmt: skip
    assert _complete(client, max_tokens=8, seed=11, **body) == cli == greedy
    _still_serving(client, models, library)


def test_the_issues_request_is_answered_and_health_tells_the_truth(
    served: tuple[TestClient, list[ServedModel]], library: Any
) -> None:
    client, models = served
    for body in ({"temperature": 1e-300}, {"top_p": 1e-300, "temperature": 1}):
        r = client.post("/v1/completions", json={"model": "gpt2", "prompt": "Hi", **body})
        assert r.status_code == 200, r.text
    assert client.get("/health").json()["status"] == "ok"
    assert 'aiayn_workers_alive{model="gpt2"} 2.0' in client.get("/metrics").text
    _still_serving(client, models, library)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    temperature=st.none() | st.floats(0.0, 100.0, allow_subnormal=True),
    top_p=st.none() | st.floats(0.0, 1.0, allow_subnormal=True, exclude_min=True),
    seed=st.none() | st.integers(0, 2**63 - 1),
)
def test_any_sampling_values_answer_without_a_500(
    served: tuple[TestClient, list[ServedModel]],
    library: Any,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
) -> None:
    """Extreme floats (subnormals included): a 200, or a 4xx for values of another method;
    never a 500; the next ordinary request is answered exactly."""
    client, _ = served
    body = {"temperature": temperature, "top_p": top_p, "seed": seed, "max_tokens": 3}
    sent = {k: v for k, v in body.items() if v is not None}
    r = client.post("/v1/completions", json={"model": "gpt2", "prompt": PROMPT, **sent})
    assert r.status_code < 500, r.text
    assert r.status_code == 200 or (not temperature and (top_p, seed) != (None, None)), r.text
    assert _complete(client, max_tokens=4) == library(PROMPT, max_new_tokens=4)
