"""Readiness (aiayn.serving.health, ``GET /ready``) tells the truth: ready once every loaded
model's workers run, not ready while one is being replaced or before they start, stopping once
shutdown began; ``/health`` stays liveness."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from aiayn.serving import ServedModel, ServeOptions, create_app, load_served_model
from aiayn.serving.health import Readiness, readiness, ready_response
from aiayn.serving.metrics import Metrics


def _with_ready(app: FastAPI, models: list[ServedModel]) -> FastAPI:
    """The app with its ``/ready`` route (added here as app.py adds it, where it has none)."""
    if not any(getattr(route, "path", None) == "/ready" for route in app.routes):

        @app.get("/ready", response_model=Readiness, responses={503: {"model": Readiness}})
        async def ready() -> JSONResponse:
            return ready_response(models, stopping=app.state.stopping)

    return app


def test_ready_follows_the_workers(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    options, metrics = ServeOptions(decode_workers=2), Metrics()
    models = [load_served_model(n, checkpoints[n], options, metrics) for n in ("mt", "lm")]
    app = _with_ready(create_app(models, options, metrics), models)
    client = TestClient(app)
    r = client.get("/ready")  # the app not entered: loaded, no worker started
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["status"] == "not ready"
    with client:
        r = client.get("/ready")
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "ready", "models": [
            {"model": "mt", "ready": True, "workers_alive": 2, "workers": 2},
            {"model": "lm", "ready": True, "workers_alive": 2, "workers": 2},
        ]}  # fmt: skip
        _a_worker_being_replaced_is_not_ready(client, models, monkeypatch)
        assert client.get("/health").json()["status"] == "ok"
    assert readiness(models, stopping=True).status == "stopping"
    assert readiness(models).status == "not ready"  # stopped: no worker runs
    assert all(m.workers_alive == 0 for m in readiness(models).models)


def _a_worker_being_replaced_is_not_ready(
    client: TestClient, models: list[ServedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine: Any = models[1].tasks["generate"].engine
    engine._quick_failures = 10  # the next replacement waits 1 s: readiness is seen meanwhile
    companions = engine._companions

    def failing(*_: Any) -> Any:
        monkeypatch.setattr(engine, "_companions", companions)
        raise RuntimeError("injected: the worker's loop fails")

    monkeypatch.setattr(engine, "_companions", failing)
    assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 3}).status_code == 500
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["status"] == "not ready", r.text
    lm = r.json()["models"][1]
    assert lm == {"model": "lm", "ready": False, "workers_alive": 1, "workers": 2}
    assert r.json()["models"][0]["ready"]  # the other model is not affected
    assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 3}).status_code == 200
    deadline = time.monotonic() + 10
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, "the worker was not replaced"
        time.sleep(0.05)
    assert engine.restarts == 1
