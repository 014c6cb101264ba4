"""What OpenAI's clients send, through the in-process test client: neutral values of OpenAI's
extra fields accepted, the values no model honours refused with a 400 naming the field, token-id
prompts, ``echo``, usage counted once per prompt, streamed usage, the hold-back of a possible stop
string (pure functions checked by hand, then a stream against the unstreamed text), base64
embeddings and ``dimensions``, model objects, chat completions' 404, errors that name the field,
and CORS preflight before the bearer token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from serve_helpers import generated, lm_and_tokenizer

from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint
from aiayn.cli.main import main
from aiayn.inference.encoder_tasks import sentence_embeddings
from aiayn.models.bert import BERT
from aiayn.serving.app import _validation_problem, is_type_tag
from aiayn.serving.openai_api import from_base64, to_base64
from aiayn.serving.streaming import delta, held_back, sendable

PROMPTS = ["the cat", "two men play", "a", "hello world the"]


def _events(r: Any) -> list[Any]:
    events = [line[len("data: ") :] for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# -- the hold-back of a possible stop string: pure functions, checked by hand


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [
        ("X on", ["n o"], 1),  # "n" may begin "n o"
        ("X on ", ["n o"], 2),  # "n " too
        ("X o", ["n o"], 0),
        ("", ["n o"], 0),
        ("abc", ["xyz"], 0),
        ("ab", ["abc", "b"], 2),  # the longest: "ab" of "abc" (all of "b" is a stop, not held)
        ("aab", ["aabx", "bz"], 3),
        ("abc", ["c"], 0),  # a whole stop string is cut by the worker, never held
    ],
)
def test_held_back_is_the_longest_end_that_may_begin_a_stop(
    text: str, stops: list[str], held: int
) -> None:
    assert held_back(text, stops) == held


def test_sendable_and_delta_by_hand() -> None:
    assert sendable("X on", ["n o"], final=False) == "X o"
    assert sendable("X on", ["n o"], final=True) == "X on"  # the end: all of it
    assert sendable("X n\ufffd", ["n o"], final=False) == "X "  # incomplete character, then "n"
    assert sendable("X n\ufffd", [], final=False) == "X n"
    # the case: " on" must not leak where the unstreamed text ends " o"
    sent = delta("", " on", ["n o"], final=False)
    assert sent == " o"
    assert delta(sent, " o", ["n o"], final=True) == ""  # cut at "n o": nothing more
    assert delta(" o", " on a", ["n o"], final=False) == "n a"  # "n a" is no stop: released
    assert delta("abc", "abX", [], final=True) == ""  # no longer extends what was sent


# -- errors name the field


@pytest.mark.parametrize(
    ("part", "tag"),
    [("str", True), ("int", True), ("list[int]", True), ("constrained-str", True),
     ("list[constrained-str]", True), ("function-after[check(), str]", True),
     ("literal['float','base64']", True), ("stream", False), ("stream_options", False),
     ("integer", False), ("boolean_flag", False), ("list_items", False), ("3", False)],
)  # fmt: skip
def test_only_pydantics_type_tags_are_dropped(part: str, tag: bool) -> None:
    assert is_type_tag(part) is tag


def test_validation_problem_names_fields_that_start_like_types() -> None:
    errors = [{"type": "bool_parsing", "loc": ("body", "stream"), "msg": "bad"}]
    assert _validation_problem(errors, prefix=("body",)).param == "stream"
    errors = [{"type": "int_parsing", "loc": ("body", "prompt", "list[int]", 1), "msg": "x"}]
    assert _validation_problem(errors, prefix=("body",)).param == "prompt.1"


@pytest.mark.parametrize(
    ("body", "param"),
    [({"stream": "x"}, "stream"), ({"stream_options": 3}, "stream_options"),
     ({"stream_options": {"include_usage": "q"}}, "stream_options.include_usage"),
     ({"stream_options": {"includ_usage": True}}, "stream_options.includ_usage"),
     ({"prompt": [1, "a"]}, "prompt.1"), ({"prompt": [[1], [-2]]}, "prompt.1.0"),
     ({"logit_bias": {"5": "x"}}, "logit_bias.5")],
)  # fmt: skip
def test_errors_name_the_field(client: TestClient, body: dict[str, Any], param: str) -> None:
    r = client.post("/v1/completions", json={"prompt": "a", **body})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param + ":"), error


# -- completions


def test_neutral_fields_are_accepted(client: TestClient) -> None:
    plain = {"prompt": PROMPTS[:2], "max_tokens": 5}
    expected = client.post("/v1/completions", json=plain).json()["choices"]
    neutral = {"user": "someone", "presence_penalty": 0, "frequency_penalty": 0.0,
               "best_of": 1, "logit_bias": {}, "suffix": None, "logprobs": None, "echo": False,
               "stream_options": None, "max_tokens": 5, "n": None}  # fmt: skip
    r = client.post("/v1/completions", json={**plain, **neutral})
    assert r.status_code == 200, r.text
    assert r.json()["choices"] == expected


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"presence_penalty": 0.5}, "presence_penalty"),
     ({"frequency_penalty": -1}, "frequency_penalty"),
     ({"logprobs": 0}, "logprobs"), ({"logprobs": 2}, "logprobs"),
     ({"logit_bias": {"5": 1}}, "logit_bias"),
     ({"suffix": "end"}, "suffix"), ({"best_of": 3}, "best_of"),
     ({"stream_options": {"include_usage": True}}, "stream_options"),
     ({"stream": True, "stream_options": {"include_obfuscation": True}},
      "stream_options.include_obfuscation")],
)  # fmt: skip
def test_values_no_model_honours_are_a_400_naming_the_field(
    client: TestClient, extra: dict[str, Any], param: str
) -> None:
    r = client.post("/v1/completions", json={"prompt": "a", **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param + ":"), error
    assert error["type"] == "invalid_request_error"


def test_token_id_prompts_equal_their_texts(
    client: TestClient, checkpoints: dict[str, Path]
) -> None:
    _, tokenizer = lm_and_tokenizer(checkpoints)
    ids = [tokenizer.encode(p) for p in PROMPTS]
    texts = client.post("/v1/completions", json={"prompt": PROMPTS, "max_tokens": 6}).json()
    by_ids = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 6}).json()
    assert [c["text"] for c in by_ids["choices"]] == [c["text"] for c in texts["choices"]]
    assert by_ids["usage"] == texts["usage"]
    one = client.post("/v1/completions", json={"prompt": ids[1], "max_tokens": 6}).json()
    assert one["choices"][0]["text"] == texts["choices"][1]["text"]
    assert one["usage"]["prompt_tokens"] == len(ids[1])


def test_token_id_prompts_out_of_range(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": [[5], [6, 100000]]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "prompt.1.1", r.text
    r = client.post("/v1/completions", json={"prompt": [5] * 30, "max_tokens": 11})
    assert r.status_code == 400, r.text  # 30 + 11 > 40 positions: OpenAI's 400, not 413
    assert r.json()["error"]["param"] == "prompt"
    assert "needs 41 positions; the model reads at most 40" in r.json()["error"]["message"]


def test_echo_equals_the_clis_prompt_and_continuation(
    client: TestClient, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(checkpoints["lm"]), "--max-new-tokens", "6",
                 *PROMPTS]) == 0  # fmt: skip
    printed = capsys.readouterr().out.split("\n")[: len(PROMPTS)]
    r = client.post("/v1/completions", json={"prompt": PROMPTS, "max_tokens": 6, "echo": True})
    assert [c["text"] for c in r.json()["choices"]] == printed
    streamed = client.post(
        "/v1/completions",
        json={"prompt": PROMPTS[1], "max_tokens": 6, "echo": True, "stream": True},
    )
    assert "".join(c["choices"][0]["text"] for c in _events(streamed)) == printed[1]


def test_usage_counts_each_prompt_once_with_n(
    client: TestClient, checkpoints: dict[str, Path]
) -> None:
    _, tokenizer = lm_and_tokenizer(checkpoints)
    req = {"prompt": PROMPTS[:2], "max_tokens": 4, "n": 2, "temperature": 1.0, "seed": 3}
    usage = client.post("/v1/completions", json=req).json()["usage"]
    assert usage["prompt_tokens"] == sum(len(tokenizer.encode(p)) for p in PROMPTS[:2])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_stream_options_include_usage_ends_with_the_usage(client: TestClient) -> None:
    req = {"prompt": PROMPTS[:2], "max_tokens": 6, "n": 2, "temperature": 0.9, "seed": 1}
    whole = client.post("/v1/completions", json=req).json()
    streamed = {**req, "stream": True, "stream_options": {"include_usage": True}}
    r = client.post("/v1/completions", json=streamed)
    chunks = _events(r)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["usage"] is None for c in chunks[:-1])
    for index in range(4):
        text = "".join(x["text"] for c in chunks[:-1] for x in c["choices"] if x["index"] == index)
        assert text == whole["choices"][index]["text"]
    plain = _events(client.post("/v1/completions", json={**req, "stream": True}))
    assert all("usage" not in c for c in plain)  # no usage field unless asked for


def test_a_stream_never_sends_the_beginning_of_a_stop_string(
    client: TestClient, checkpoints: dict[str, Path], stop_that_leaks: Any
) -> None:
    prompt, stop = stop_that_leaks(*lm_and_tokenizer(checkpoints), PROMPTS, 12)
    full = generated(checkpoints, [prompt], max_new_tokens=12)[0]
    req = {"prompt": prompt, "max_tokens": 12, "stop": stop}
    whole = client.post("/v1/completions", json=req).json()["choices"][0]
    assert whole["text"] == full[: full.find(stop)] and whole["finish_reason"] == "stop"
    chunks = _events(client.post("/v1/completions", json={**req, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_completions_is_a_404_saying_why(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"model": "lm", "messages": []})
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "no loaded model has a chat template" in message and "/v1/completions" in message


# -- embeddings


def test_base64_embeddings_are_the_float32_bytes(
    client: TestClient, checkpoints: dict[str, Path]
) -> None:
    texts = ["the cat sat on the mat .", "a book"]
    req = {"model": "mlm", "input": texts}
    floats = client.post("/v1/embeddings", json=req).json()["data"]
    packed = client.post("/v1/embeddings", json={**req, "encoding_format": "base64"}).json()
    assert [from_base64(d["embedding"]) for d in packed["data"]] == [d["embedding"] for d in floats]
    assert to_base64([1.0, -2.5]) == "AACAPwAAIMA="  # little-endian float32: 3f800000 c0200000
    c = load_checkpoint(checkpoints["mlm"], expect=BERT)
    expected = sentence_embeddings(c.model, checkpoint_tokenizer(c.path), texts)
    got = torch.tensor([from_base64(d["embedding"]) for d in packed["data"]])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_dimensions_only_the_models_own(client: TestClient) -> None:
    req = {"model": "mlm", "input": "a book", "user": "u", "encoding_format": None}
    full = client.post("/v1/embeddings", json=req).json()["data"][0]["embedding"]
    same = client.post("/v1/embeddings", json={**req, "dimensions": len(full)})
    assert same.status_code == 200 and same.json()["data"][0]["embedding"] == full
    r = client.post("/v1/embeddings", json={**req, "dimensions": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    assert f"give {len(full)}" in r.json()["error"]["message"]


# -- models


def test_model_objects_and_retrieve(client: TestClient) -> None:
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert all(isinstance(m["created"], int) and m["created"] > 1_600_000_000
               for m in listed.values())  # fmt: skip
    assert client.get("/v1/models/lm").json() == listed["lm"]
    r = client.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert "no loaded model 'nope'" in r.json()["error"]["message"]
    metrics = client.get("/metrics").text
    assert 'endpoint="/v1/models/{id}",status="404"' in metrics


# -- CORS


def test_cors_preflight_is_answered_before_the_token(checkpoints: dict[str, Path]) -> None:
    from aiayn.serving import ServeOptions, create_app, load_served_model
    from aiayn.serving.metrics import Metrics

    options, metrics = ServeOptions(), Metrics()
    served = [load_served_model("mlm", checkpoints["mlm"], options, metrics)]
    origin = "https://app.example"
    app = create_app(served, options, metrics, api_key="k", cors_origins=[origin])
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}  # fmt: skip
    with TestClient(app) as c:
        r = c.options("/v1/embeddings", headers=preflight)
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == origin
        r = c.post("/v1/embeddings", json={"input": "a"}, headers={"Origin": origin})
        assert r.status_code == 401  # the call itself still needs the token
        assert r.headers["access-control-allow-origin"] == origin  # and the page can read why
        r = c.post("/v1/embeddings", json={"input": "a"},
                   headers={"Origin": origin, "Authorization": "Bearer k"})  # fmt: skip
        assert r.status_code == 200
    bare = create_app(served, options, metrics, api_key="k")  # no CORS: no 401 either
    with TestClient(bare) as c:
        assert c.options("/v1/embeddings", headers=preflight).status_code == 405
