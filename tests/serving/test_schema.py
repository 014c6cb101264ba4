"""Schemathesis against the service's OpenAPI schema, every served family loaded: over 1,000
generated requests spread over every operation (the schema's own values, bodies that break it,
and extreme numbers, huge sizes and odd Unicode put into the fields that reach the models).
None is answered 5xx, every answer conforms to the schema (status documented, body of its
schema), and afterwards every worker is alive (``/ready``, the worker gauge, no restart) and
ordinary requests are answered exactly as they were before the run."""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from aiayn.kernels import prepare
from aiayn.limits import MAX_REQUEST_ITEMS

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
MODELS = ["mt", "lm", "mlm", "cls", "vit"]
EXAMPLES = 200
"""Generated requests per operation that takes a body or parameters (7 of them: 1,400 in all;
one without any, such as ``GET /health``, has a single request to make)."""
MIN_CALLS = 1000
SERVER_TIMEOUT_S = 30
CLIENT_TIMEOUT_S = 60
"""The client waits longer than the server (a request it cannot finish in time is a 504)."""
SMALL = {"max_tokens": 4, "max_new_tokens": 8, "top_k": 3}
"""Generated sizes are cut to these, so that many requests are served, and quickly (an extreme
one put in by the run is sent as it is: the limits refuse it or the model's positions bound
its work)."""
ORDINARY = {
    "/v1/completions": {"model": "lm", "prompt": "the cat sleeps", "max_tokens": 6},
    "/v1/translate": {"model": "mt", "texts": ["a small dog runs", "hello world"]},
    "/v1/embeddings": {"model": "cls", "input": ["two men play chess", "hello world"]},
}
"""Requests answered the same every time (greedy search; the translation's default beam)."""
VOLATILE = ("id", "created")
"""A completion's fields that differ between two answers."""

SAMPLING = frozenset(
    {
        *("temperature", "top_p", "top_k", "max_tokens", "n", "best_of", "seed", "logprobs"),
        *("beam", "n_best", "alpha", "max_new_tokens", "dimensions"),
        *("presence_penalty", "frequency_penalty"),
    }
)
TEXT_LISTS = frozenset({"texts", "pairs", "views"})
TEXTS = frozenset({"text", "target", "prefix", "user", "suffix"})
TEXT_OR_LIST = frozenset({"prompt", "input", "stop"})

EXTREMES = [
    *(math.nan, math.inf, -math.inf, 1.7976931348623157e308, -1.7976931348623157e308),
    *(5e-324, -5e-324, -0.0, 1e-300, 2.0**53 + 1, 0, -1, 1, 2**31, 2**53 + 1),
    *(2**63 - 1, 2**63, 2**64, -(2**63), 10**30, True, "1", "NaN", None, [], {}),
]
ODD = [
    *("\ud800", "a\udfffb", "\x00", "\u202e\u2066abc\u2069", "\ufeff", "\ufffd", "e\u0301" * 64),
    *("👩‍👩‍👧‍👦" * 8, "\U0010ffff\U000e0001", "[MASK]", "[MASK] " * 64, "\r\n\t\x0b", " "),
    *("𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﷺ" * 32, "İ" * 40),
]
"""Lone surrogates, control, direction and format characters, combining marks, a long emoji
sequence, the last code points, mask tokens, blanks, letters that change length when cased."""
HUGE = ["x" * 100_000, "a b " * 25_000, "é" * 400_000]
"""One word of 100,000 characters, 50,000 words, and a body over 1 MiB (JSON's \\u00e9)."""

NUMBERS = st.one_of(
    st.sampled_from(EXTREMES), st.floats(), st.integers(), st.integers(-(2**70), 2**70)
)
TEXT = st.one_of(
    st.sampled_from(ODD),
    st.sampled_from(HUGE),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=24),
)
TEXT_LIST = st.one_of(
    st.lists(TEXT, min_size=1, max_size=4),
    st.sampled_from([["a"] * (MAX_REQUEST_ITEMS + 1), ["[MASK]"] * MAX_REQUEST_ITEMS]),
)

Call = Callable[..., Any]
"""``call(method, path, body=None)``: the schemathesis response of one ordinary request."""


@pytest.fixture(scope="module")
def app(checkpoints: dict[str, Path], serve_app: Any) -> Any:
    """The app serving every family; its kernels built first, as ``aiayn serve`` does (a build
    within a request would take its time); schemathesis' client starts it."""
    prepare()
    return serve_app(checkpoints, MODELS, timeout_s=SERVER_TIMEOUT_S).app


@pytest.fixture(scope="module")
def schema(app: Any) -> Any:
    """The app's OpenAPI schema, its operations called in process."""
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def call(schema: Any) -> Call:
    """:data:`Call`: one request of the schema's operations, not generated."""

    def call(method: str, path: str, body: Any = None) -> Any:
        operation = schema[path][method]
        if body is None:
            return operation.Case().call(timeout=CLIENT_TIMEOUT_S)
        case = operation.Case(body=json.dumps(body).encode(), media_type="application/json")
        return case.call(timeout=CLIENT_TIMEOUT_S)

    return call


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` × ``height`` RGB pixels and holds few of them."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def test_property_run(schema: Any, call: Call, png_bytes: Any) -> None:
    """Every operation, ``EXAMPLES`` generated requests each: no 5xx, every answer of its
    schema; after each operation the ordinary requests are answered as before; at the end
    every worker is alive."""
    served = _serving(call)
    images = [png_bytes(0), png_bytes(1, (1, 1)), png_bytes(2)[:60], png_claiming(16_000, 16_000)]
    before = _ordinary(call)
    statuses: dict[str, list[int]] = {}
    wanted: dict[str, int] = {}
    failures = []
    for operation in schema.get_all_operations():
        op = operation.ok()
        label = f"{op.method.upper()} {op.path}"
        wanted[label] = EXAMPLES if op.body or any(op.iter_parameters()) else 1
        fields = _fields(schema.raw_schema, op)
        variation = _Variation(op.path, fields, served.get(op.path, []), images)
        statuses[label], failure = _run(op, variation)
        if failure:
            failures.append(f"{label}: {failure}")
        after = _ordinary(call)
        if after != before:
            failures.append(f"after {label}, ordinary requests answered otherwise: {after}")
    assert not failures, "\n".join(failures)
    _assert_spread(statuses, wanted)
    _assert_workers_alive(call)


def _run(op: Any, variation: _Variation) -> tuple[list[int], str | None]:
    """``EXAMPLES`` requests of ``op`` (the schema's values and, where it has a body, bodies
    that break the schema; both varied): their statuses, and the first failure's report."""
    positive = op.as_strategy(generation_mode=GenerationMode.POSITIVE)
    strategy = positive
    if op.body:  # two requests in three of the schema's values, one of a body that breaks it
        negative = op.as_strategy(generation_mode=GenerationMode.NEGATIVE)
        strategy = st.sampled_from([positive, positive, negative]).flatmap(lambda s: s)
    statuses: list[int] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, data=st.data())
    def run(case: Case, data: st.DataObject) -> None:
        variation.vary(case, data)
        response = case.call(timeout=CLIENT_TIMEOUT_S)
        statuses.append(response.status_code)
        case.validate_response(response, checks=CHECKS)

    try:
        run()
    except Exception as error:  # the falsifying example is among the notes hypothesis adds
        return statuses, "\n".join([str(error), *getattr(error, "__notes__", [])])
    return statuses, None


class _Variation:
    """What the run puts into a generated request: a served model's name (so that bodies reach
    a model rather than a 404), extreme numbers in the sampling and size fields, odd Unicode
    and huge sizes in the texts, real and broken images in a form."""

    def __init__(self, path: str, fields: frozenset[str], models: list[str], images: list[bytes]):
        self.fields, self.models, self.images = fields, models, images
        self.masks = path == "/v1/fill-mask"  # a text needs a mask to be served there

    def vary(self, case: Case, data: st.DataObject) -> None:
        if case.path_parameters and "model_id" in case.path_parameters:
            name = data.draw(st.sampled_from(["generated", *MODELS]), label="model_id")
            if name != "generated":
                case.path_parameters["model_id"] = name
        if not isinstance(case.body, dict):
            return
        body = dict(case.body)
        model = data.draw(st.sampled_from(["generated", *self.models]), label="model")
        if model != "generated":
            body["model"] = model
        if case.media_type == "application/json":
            case.body = json.dumps(self._json(body, data)).encode()  # NaN and Infinity as such
        else:
            case.body = self._form(body, data)

    def _json(self, body: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
        """``body`` with up to 2 of its sampling, size and text fields set to extreme values
        (none in many requests, so that many reach a model)."""
        for name, cap in SMALL.items():
            if type(body.get(name)) is int:
                body[name] = min(body[name], cap)
        texts = body.get("texts")
        if self.masks and isinstance(texts, list) and data.draw(st.booleans(), label="masks"):
            body["texts"] = [f"{t} [MASK]" if isinstance(t, str) else t for t in texts]
        names = sorted(self.fields & (SAMPLING | TEXT_LISTS | TEXTS | TEXT_OR_LIST))
        varied = st.lists(st.sampled_from(names), max_size=2, unique=True) if names else st.just([])
        for name in data.draw(varied, label="varied"):
            if name in SAMPLING:
                body[name] = data.draw(NUMBERS, label=name)
            else:
                kinds = [TEXT_LIST] * (name not in TEXTS) + [TEXT] * (name not in TEXT_LISTS)
                body[name] = data.draw(st.one_of(*kinds), label=name)
        return body

    def _form(self, body: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
        if data.draw(st.booleans(), label="image"):
            body["image"] = data.draw(st.sampled_from(self.images), label="image bytes")
        if data.draw(st.booleans(), label="vary top_k"):
            body["top_k"] = str(data.draw(NUMBERS, label="top_k"))
        return body


def _fields(raw: dict[str, Any], op: Any) -> frozenset[str]:
    """The top-level fields of ``op``'s request bodies (none without a body)."""
    content = raw["paths"][op.path].get(op.method.lower(), {}).get("requestBody", {})
    names: set[str] = set()
    for media in content.get("content", {}).values():
        body = media["schema"]
        if "$ref" in body:
            body = raw["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
        names |= set(body.get("properties", {}))
    return frozenset(names)


def _serving(call: Call) -> dict[str, list[str]]:
    """The loaded models serving each endpoint (``GET /v1/models``)."""
    served: dict[str, list[str]] = {}
    for card in call("get", "/v1/models").json()["data"]:
        for endpoint in card["endpoints"]:
            served.setdefault(endpoint, []).append(card["id"])
    return served


def _ordinary(call: Call) -> dict[str, Any]:
    """The answers (status, body without its volatile fields) of the ordinary requests."""
    answers = {}
    for path, body in ORDINARY.items():
        response = call("post", path, body)
        answer = response.json()
        for field in VOLATILE:
            answer.pop(field, None)
        answers[path] = (response.status_code, answer)
    assert all(status == 200 for status, _ in answers.values()), answers
    return answers


def _assert_spread(statuses: dict[str, list[int]], wanted: dict[str, int]) -> None:
    """At least ``MIN_CALLS`` requests, each operation its ``wanted`` count or more; none 5xx,
    and both 2xx and 4xx answers among them."""
    counts = {label: len(codes) for label, codes in statuses.items()}
    assert sum(counts.values()) >= MIN_CALLS, counts
    assert all(counts[label] >= n for label, n in wanted.items()), (counts, wanted)
    kinds = Counter(code // 100 for codes in statuses.values() for code in codes)
    assert kinds[5] == 0 and kinds[2] > 0 and kinds[4] > 0, kinds


def _assert_workers_alive(call: Call) -> None:
    """``/ready`` answers 200 with every worker of every model running, the worker gauge
    says the same, and no worker was replaced after a failure."""
    ready = call("get", "/ready")
    assert ready.status_code == 200, ready.text
    states = {m["model"]: m for m in ready.json()["models"]}
    assert sorted(states) == sorted(MODELS), states
    assert all(m["ready"] and m["workers_alive"] == m["workers"] > 0 for m in states.values())
    samples = [
        sample
        for family in text_string_to_metric_families(call("get", "/metrics").text)
        for sample in family.samples
    ]
    alive = {s.labels["model"]: s.value for s in samples if s.name == "aiayn_workers_alive"}
    assert alive == {name: m["workers"] for name, m in states.items()}, alive
    restarts = [s for s in samples if s.name == "aiayn_worker_restarts_total"]
    assert sum(s.value for s in restarts) == 0, restarts


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/translate", {"model": "mt", "texts": ["a"], "prefix": "\ud800"}, "prefix"),
        ("/v1/completions", {"model": "lm", "prompt": "a", "user": "a\udfff"}, "user"),
        ("/v1/embeddings", {"model": "cls", "input": "a", "user": "\ud800"}, "user"),
        ("/v1/completions", {"model": "lm", "prompt": "a", "suffix": "\ud800"}, "suffix"),
        ("/v1/attention", {"model": "\ud800", "text": "a"}, "model"),
    ],
)
def test_lone_surrogate_is_refused_by_name(call: Call, path: str, body: Any, field: str) -> None:
    """A text that is not valid Unicode (JSON's ``"\\ud800"``) is a 422 naming its field in
    every string field, not only in those with a length limit (a translation's ``prefix``
    reached the tokenizer, which failed: a 500)."""
    response = call("post", path, body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == field


def test_huge_alpha_is_refused(call: Call) -> None:
    """An ``alpha`` whose length penalty would overflow a float is a 422 naming it (it was a
    500: aiayn.limits.MAX_LENGTH_PENALTY_ALPHA)."""
    body = {"model": "mt", "texts": ["a small dog runs"], "alpha": 1e308, "beam": 4}
    response = call("post", "/v1/translate", body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "alpha"
