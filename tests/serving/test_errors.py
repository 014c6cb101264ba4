"""Bad requests and faults: each answered with its status and a one-line message naming the field
or limit, never a 500; the bearer token; a cancelled request's rows leave its decode group."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from aiayn.serving.engine import Job

CASES = [
    # (path, body, status, fragment of the message)
    ("/v1/translate", {"texts": []}, 422, "texts: List should have at least 1 item"),
    ("/v1/translate", {"texts": [""]}, 422, "texts.0: String should have at least 1 character"),
    ("/v1/translate", {"texts": "a dog"}, 422, "texts: Input should be a valid list"),
    ("/v1/translate", {"texts": ["a"], "beems": 2}, 422, "beems: unknown field"),
    ("/v1/translate", {"texts": ["a"], "beam": 0}, 422, "beam: Input should be greater than"),
    ("/v1/translate", {"texts": ["a"], "beam": 2, "n_best": 3}, 422, "n_best must be between 1"),
    ("/v1/translate", {"texts": ["a"], "alpha": "x"}, 422, "alpha: Input should be a valid"),
    ("/v1/translate", {}, 422, "texts: required field missing"),
    ("/v1/translate", {"texts": ["dog " * 40]}, 413, "texts.0 has 80 subword tokens"),
    ("/v1/translate", {"texts": ["a"], "model": "nope"}, 404, "no loaded model 'nope'"),
    ("/v1/completions", {"prompt": []}, 422, "prompt: List should have at least 1 item"),
    ("/v1/completions", {"prompt": "a", "top_p": 0.5}, 422, "top_p applies to sampling"),
    ("/v1/completions", {"prompt": "a", "seed": 1}, 422, "seed applies to sampling"),
    ("/v1/completions", {"prompt": "a", "n": 0}, 422, "n: Input should be greater"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 40}, 400, "with max_tokens = 40"),
    ("/v1/completions", {"prompt": "a", "ecco": True}, 422, "ecco: unknown field"),
    ("/v1/embeddings", {"input": ""}, 422, "input: String should have at least 1 character"),
    ("/v1/embeddings", {"input": "a"}, 422, "model: several models serve /v1/embeddings"),
    ("/v1/embeddings", {"input": ["dog " * 80], "model": "mlm"}, 400, "the model reads at most 64"),
    ("/v1/classify", {"texts": ["a"], "top_k": 4}, 422, "top_k must be in 1..3"),
    ("/v1/classify", {"texts": ["a"], "pairs": ["b", "c"]}, 422, "pairs: 2 second texts"),
    ("/v1/fill-mask", {"texts": ["no mask here"]}, 422, "texts.0: no [MASK]"),
    ("/v1/fill-mask", {"texts": ["[MASK]"], "top_k": 0}, 422, "top_k: Input should be greater"),
]


@pytest.mark.parametrize(("path", "body", "status", "fragment"), CASES)
def test_bad_request(
    client: TestClient, path: str, body: object, status: int, fragment: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert fragment in error["message"], error
    assert "\n" not in error["message"]


def test_malformed_json_and_bad_uploads(client: TestClient) -> None:
    r = client.post(
        "/v1/translate", content=b'{"texts": [', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and "not valid JSON" in r.json()["error"]["message"]
    r = client.post("/v1/classify", files={"image": ("a.png", b"not an image", "image/png")})
    message = r.json()["error"]["message"]
    assert r.status_code == 422 and "cannot read the image" in message
    assert message.startswith("image: ") and "\n" not in message
    assert "BytesIO" not in message and "0x" not in message  # not the in-memory file's repr
    assert "not in an image format" in message and r.json()["error"]["param"] == "image"
    r = client.post(
        "/v1/classify", files={"image": ("a.png", b"x", "image/png")}, data={"path": "/etc"}
    )
    assert r.status_code == 422 and r.json()["error"]["message"] == "path: unknown field"
    r = client.post("/v1/classify", content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert client.get("/nope").status_code == 404


def test_body_over_the_limit_is_413(checkpoints: dict[str, Path], serve_app: Any) -> None:
    with serve_app(checkpoints, ["mt"], max_body_bytes=2048) as c:
        r = c.post("/v1/translate", json={"texts": ["a"] * 1000})
        assert r.status_code == 413 and "2048 bytes" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"texts": ['
            for _ in range(500):
                yield b'"a", '
            yield b'"a"]}'

        r = c.post("/v1/translate", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_the_bearer_token(checkpoints: dict[str, Path], serve_app: Any) -> None:
    with serve_app(checkpoints, ["mt"], api_key="s3cret") as c:
        assert c.get("/health").status_code == 200  # a load balancer's check needs no token
        r = c.post("/v1/translate", json={"texts": ["a"]})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = c.post(
            "/v1/translate", json={"texts": ["a"]}, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200
        assert "access-control-allow-origin" not in ok.headers  # CORS off unless asked


def test_timeout_is_504_and_a_full_queue_503(checkpoints: dict[str, Path], serve_app: Any) -> None:
    # the app is not entered: its workers never start, so requests wait in the queue
    c = serve_app(checkpoints, ["mt"], timeout_s=0.2, queue_size=1)
    r = c.post("/v1/translate", json={"texts": ["a dog"]})
    assert r.status_code == 504 and "no answer within 0.2 s" in r.json()["error"]["message"]
    r = c.post("/v1/translate", json={"texts": ["a dog"]})  # the timed-out one still holds a place
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "queue of model mt is full" in r.json()["error"]["message"]


def test_a_cancelled_request_leaves_its_decode_group(checkpoints: dict[str, Path]) -> None:
    from aiayn.serving import load_served_model
    from aiayn.serving.decode import advance
    from aiayn.serving.metrics import Metrics
    from aiayn.serving.options import ServeOptions
    from aiayn.serving.schemas import CompletionRequest

    served = load_served_model("lm", checkpoints["lm"], ServeOptions(), Metrics())
    lm = served.tasks["generate"]

    async def jobs() -> list[Job]:
        return [lm.prepare(CompletionRequest(prompt=p, max_tokens=9, n=2), 0)  # type: ignore[attr-defined]
                for p in ("the cat", "a")]  # fmt: skip

    first, second = asyncio.run(jobs())
    pools = lm.pools()  # type: ignore[attr-defined]
    group = lm.start([first, second], pools)  # type: ignore[attr-defined]
    advance(group)
    assert len(group.search.rows) == 4
    first.cancelled = True
    group.drop_cancelled()
    assert len(group.search.rows) == 2 and pools[0].free == pools[0].slots - 2  # freed
    while not group.done:
        ended, _ = advance(group)
        assert all(job is second for job, _ in ended)
    assert pools[0].free == pools[0].slots


def test_a_client_that_leaves_frees_its_place(checkpoints: dict[str, Path]) -> None:
    """The request is read, then the client disconnects: the answer is 499 (counted) and the
    queued job is cancelled, so the worker drops it (the app is called as ASGI directly; its
    workers are not started, so the job is still waiting when the client leaves)."""
    import json

    from aiayn.serving import ServeOptions, create_app, load_served_model
    from aiayn.serving.metrics import Metrics

    options, metrics = ServeOptions(), Metrics()
    served = load_served_model("mt", checkpoints["mt"], options, metrics)
    app = create_app([served], options, metrics)
    body = json.dumps({"texts": ["a small dog runs"]}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False},
                {"type": "http.disconnect"}]  # fmt: skip
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http", "method": "POST", "path": "/v1/translate", "raw_path": b"/v1/translate",
        "query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http",
        "server": ("test", 80), "client": ("test", 1), "root_path": "",
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 499
    queued = list(served.tasks["translate"].engine._queue)
    assert len(queued) == 1 and queued[0].cancelled
    counted = 'aiayn_requests_total{endpoint="/v1/translate",status="499"} 1.0'
    assert counted in metrics.text().decode()
