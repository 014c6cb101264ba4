"""Readiness of ``aiayn serve`` (``GET /ready``), beside liveness (``GET /health``: the process
answers).

The service is ready when every loaded model can answer now: its workers are started, not
stopping, and every worker thread is running its loop (a thread whose loop failed is replaced
by :class:`~aiayn.serving.engine.Engine`'s supervision; until its replacement runs, the model
is not ready). Models are loaded before the app is built, so a served model is a loaded one.
``/ready`` answers 200 with each model's workers when all are ready, else 503 with the same
body and ``Retry-After: 1``: a load balancer sends requests only where they can be answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from aiayn.serving.engine import Engine
from aiayn.serving.models import ServedModel


class WorkerState(BaseModel):
    """One loaded model's workers: running now, and started (all of its endpoints')."""

    model_config = ConfigDict(protected_namespaces=())

    model: str
    ready: bool
    workers_alive: int
    workers: int


class Readiness(BaseModel):
    """``GET /ready``: ``ready`` (200), or ``not ready`` / ``stopping`` (503), per model."""

    status: Literal["ready", "not ready", "stopping"]
    models: list[WorkerState]


def engines(model: ServedModel) -> list[Engine]:
    """The model's distinct workers (endpoints may share one: attention runs on the
    translation or encoder worker)."""
    seen: dict[int, Engine] = {}
    for task in model.tasks.values():
        seen.setdefault(id(task.engine), task.engine)
    return list(seen.values())


def worker_state(model: ServedModel) -> WorkerState:
    """Whether ``model`` can answer now: every worker started, not stopping, all threads
    running."""
    found = engines(model)
    alive = sum(e.alive for e in found)
    total = sum(e.threads for e in found)
    ready = all(e.accepting and e.alive == e.threads for e in found)
    return WorkerState(model=model.name, ready=ready, workers_alive=alive, workers=total)


def readiness(models: Sequence[ServedModel], *, stopping: bool = False) -> Readiness:
    """The service's readiness: ``stopping`` once shutdown began, else ``ready`` when every
    model is."""
    states = [worker_state(m) for m in models]
    if stopping:
        return Readiness(status="stopping", models=states)
    ready = all(state.ready for state in states)
    return Readiness(status="ready" if ready else "not ready", models=states)


def ready_response(models: Sequence[ServedModel], *, stopping: bool = False) -> JSONResponse:
    """``GET /ready``'s answer: 200 when ready, else 503 with ``Retry-After: 1`` (same body)."""
    state = readiness(models, stopping=stopping)
    if state.status == "ready":
        return JSONResponse(state.model_dump())
    return JSONResponse(state.model_dump(), status_code=503, headers={"Retry-After": "1"})
