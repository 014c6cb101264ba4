"""``GET /metrics`` read with Prometheus' own parser: translations count their input and output
tokens (greedy and beam search), the time to the first token and per output token of each
decoded request, the running and waiting gauges, and request latency by model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from aiayn.checkpoint import load_translation_tokenizer
from aiayn.data import normalize

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess"]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_translations_and_completions_are_counted(
    checkpoints: dict[str, Path], serve_app: Any
) -> None:
    tokenizer = load_translation_tokenizer(checkpoints["mt"])
    source_tokens = sum(len(ids) for ids in tokenizer.encode_batch([normalize(t) for t in TEXTS]))
    outputs = []
    with serve_app(checkpoints, ["mt", "lm"]) as client:
        for beam in (1, 3):
            for text in TEXTS:
                r = client.post("/v1/translate", json={"texts": [text], "beam": beam})
                assert r.status_code == 200
            before = _samples(client.get("/metrics").text)
            outputs.append(_value(before, "aiayn_tokens_total", model="mt", kind="output"))
        r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 5, "n": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 10
        samples = _samples(client.get("/metrics").text)
    total = "aiayn_tokens_total"
    assert _value(samples, total, model="mt", kind="input") == 2 * source_tokens
    greedy, greedy_and_beam = outputs
    assert greedy > 0 and greedy_and_beam > greedy  # both searches count what they generate
    lm_out = _value(samples, total, model="lm", kind="output")
    assert lm_out - _value(before, total, model="lm", kind="output") == 10
    ttft = "aiayn_time_to_first_token_seconds"
    assert _value(samples, ttft + "_count", model="mt") == 2 * len(TEXTS)  # one per request
    assert _value(samples, ttft + "_count", model="lm") == 1
    assert _value(samples, ttft + "_sum", model="mt") > 0
    tpot = "aiayn_time_per_output_token_seconds"
    assert _value(samples, tpot + "_count", model="lm") == 1  # 5 steps: 4 after the first
    assert _value(samples, tpot + "_sum", model="lm") > 0
    assert _value(samples, "aiayn_requests_running", model="mt") == 0  # all answered
    assert ("aiayn_requests_running", (("model", "lm"),)) in samples
    assert _value(samples, "aiayn_queue_depth", model="lm") == 0
    latency = "aiayn_request_duration_seconds_count"
    assert _value(samples, latency, endpoint="/v1/translate", model="mt") == 2 * len(TEXTS)
    assert _value(samples, latency, endpoint="/v1/completions", model="lm") == 1
    assert _value(samples, latency, endpoint="/metrics", model="") == 2  # no model chosen


def test_the_running_gauge_counts_taken_requests(
    checkpoints: dict[str, Path], serve_app: Any
) -> None:
    """A request held by a worker counts as running until it is answered."""
    from aiayn.serving.engine import Engine

    with serve_app(checkpoints, ["mt"]) as client:
        seen: list[int] = []
        original = Engine._hold

        def hold(self: Engine, job: Any) -> None:
            original(self, job)
            seen.append(self.running())

        Engine._hold = hold  # type: ignore[method-assign]
        try:
            assert client.post("/v1/translate", json={"texts": ["hello world"]}).status_code == 200
        finally:
            Engine._hold = original  # type: ignore[method-assign]
        assert seen == [1]
        running = _samples(client.get("/metrics").text)
        assert _value(running, "aiayn_requests_running", model="mt") == 0
