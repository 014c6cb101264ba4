"""``POST /v1/attention``: the maps ``aiayn attention`` captures for the same input (the library's
capture, through the family registry), every weight equal; bad requests each with its status and
a message naming the field; and a request that runs on the model's worker between the decoding
steps of translations."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.limits import MAX_ATTENTION_TOKENS
from aiayn.visualization.capture import capture_attention


def _same_maps(answer: dict[str, Any], expected: Any, names: list[str] | None = None) -> None:
    """The answer's views are the capture's (those named), labels and every weight equal."""
    views = [v for v in expected.views if names is None or v.name in names]
    assert [v["name"] for v in answer["views"]] == [v.name for v in views]
    assert [[x["label"], x["text"]] for x in answer["lines"]] == [list(x) for x in expected.lines]
    for got, view in zip(answer["views"], views, strict=True):
        assert got["rows"] == view.rows and got["cols"] == view.cols
        assert got["title"] == view.title and got["axis_names"] == list(view.axis_names)
        assert len(got["layers"]) == len(view.layers)
        for layer, weights in zip(got["layers"], view.layers, strict=True):  # (H, R, C)
            assert torch.equal(torch.tensor(layer, dtype=torch.float32), weights)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("mt", {"text": "a small dog runs"}),  # the model's own greedy translation
        ("mt", {"text": "a small dog runs", "target": "the cat sleeps"}),
        ("lm", {"text": "the cat sleeps on"}),
        ("mlm", {"text": "the cat [MASK] on the mat ."}),
    ],
)
def test_the_maps_are_the_captures(
    client: TestClient, checkpoints: dict[str, Path], name: str, body: dict[str, str]
) -> None:
    r = client.post("/v1/attention", json={"model": name, **body})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == name
    expected = capture_attention(
        checkpoints[name], text=body["text"], target=body.get("target"),
        max_tokens=MAX_ATTENTION_TOKENS,
    )  # fmt: skip
    _same_maps(r.json(), expected)


def test_views_picks_the_maps(client: TestClient, checkpoints: dict[str, Path]) -> None:
    body = {"model": "mt", "text": "two men play chess", "views": ["cross", "encoder_self"]}
    r = client.post("/v1/attention", json=body)
    assert r.status_code == 200, r.text
    expected = capture_attention(checkpoints["mt"], text="two men play chess",
                                 max_tokens=MAX_ATTENTION_TOKENS)  # fmt: skip
    assert [v["name"] for v in r.json()["views"]] == ["cross", "encoder_self"]
    got = {v["name"]: v for v in r.json()["views"]}
    _same_maps({**r.json(), "views": [got["encoder_self"], got["cross"]]}, expected,
               ["encoder_self", "cross"])  # fmt: skip
    cross = got["cross"]
    # encoder-decoder attention: a row per decoder input (BOS + answer), a column per source
    # token (with EOS); each row a softmax
    assert cross["rows"][0] == "<s>" and cross["cols"][-1] == "</s>"
    sums = torch.tensor(cross["layers"]).sum(-1)  # (N, H, R)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)


ATTENTION_CASES = [
    # (body, status, fragment of the message, the field named)
    ({"model": "mt"}, 422, "text: required field missing", "text"),
    ({"model": "mt", "text": ""}, 422, "text: String should have at least 1 character", "text"),
    ({"model": "mt", "text": "a", "tgt": "b"}, 422, "tgt: unknown field", "tgt"),
    ({"model": "mt", "text": "a", "target": ""}, 422, "target: String should have", "target"),
    ({"model": "mt", "text": "a", "views": []}, 422, "views: List should have at least", "views"),
    ({"model": "mt", "text": "a", "views": ["self"]}, 422, "views.0: no view 'self'", "views.0"),
    ({"model": "mt", "text": " \t "}, 422, "the source sentence is empty", "text"),
    ({"model": "lm", "text": "a", "target": "b"}, 422, "target: model lm is not a translation",
     "target"),
    ({"model": "mt", "text": "dog " * 100}, 413, "more than the 160 a side", "text"),
    ({"model": "mt", "text": "a", "target": "dog " * 100}, 413, "target: the target sentence has",
     "target"),
    ({"model": "lm", "text": "dog " * 30}, 413, "this model's limit is 40", "text"),
    ({"model": "vit", "text": "a"}, 404, "no loaded model 'vit' serves /v1/attention", "model"),
    ({"text": "a"}, 422, "model: several models serve /v1/attention", "model"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "fragment", "param"), ATTENTION_CASES)
def test_bad_attention_request(
    client: TestClient, body: dict[str, Any], status: int, fragment: str, param: str
) -> None:
    r = client.post("/v1/attention", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert fragment in error["message"], error
    assert error["param"] == param and "\n" not in error["message"]
    assert "--" not in error["message"]  # the service's words, not the command's flags


def test_the_limit_is_the_commands_default() -> None:
    from aiayn.cli.attention import MAX_TOKENS

    assert MAX_TOKENS == MAX_ATTENTION_TOKENS == 160


def test_the_attention_task_uses_the_models_worker(checkpoints: dict[str, Path]) -> None:
    from aiayn.serving import ServeOptions, load_served_model
    from aiayn.serving.metrics import Metrics

    for name, other in (("mt", "translate"), ("lm", "generate"), ("mlm", "embed")):
        model = load_served_model(name, checkpoints[name], ServeOptions(), Metrics())
        assert model.tasks["attention"].engine is model.tasks[other].engine
    vit = load_served_model("vit", checkpoints["vit"], ServeOptions(), Metrics())
    assert "attention" not in vit.tasks  # its maps are of an image


def test_runs_between_the_translations_steps(checkpoints: dict[str, Path], serve_app: Any) -> None:
    """Only the translation model is served: attention requests share its decode worker with
    concurrent translations (no thread of their own), and every answer is the one it gets
    alone."""
    with serve_app(checkpoints, ["mt"]) as c:
        alone = c.post("/v1/attention", json={"text": "hello world"}).json()
        single = c.post("/v1/translate", json={"texts": ["a small dog runs"], "beam": 2}).json()

        def call(i: int) -> Any:
            if i % 2:
                return c.post("/v1/attention", json={"text": "hello world"}).json()
            return c.post("/v1/translate",
                          json={"texts": ["a small dog runs"], "beam": 2}).json()  # fmt: skip

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, range(16)))
    for i, answer in enumerate(answers):
        assert answer == (alone if i % 2 else single)


def test_an_answer_over_the_weight_bound_is_refused(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"model": "mt", "text": "two men play chess"}
    fits = client.post("/v1/attention", json={**body, "views": ["cross"]})
    assert fits.status_code == 200, fits.text
    cross = sum(len(h) * len(h[0]) * len(h[0][0]) for h in fits.json()["views"][0]["layers"])
    monkeypatch.setattr("aiayn.serving.attention_task.MAX_ATTENTION_WEIGHTS", cross)
    assert client.post("/v1/attention", json={**body, "views": ["cross"]}).status_code == 200
    r = client.post("/v1/attention", json=body)  # every view: more than the cross maps alone
    assert r.status_code == 413, r.text
    assert "views" in r.text and f"{cross:,}" in r.text
