"""The service's Prometheus metrics (``GET /metrics``, text format, via ``prometheus-client``),
in a registry of the app's own, so that two apps in one process count apart.

- ``aiayn_requests_total{endpoint, status}`` and ``aiayn_request_errors_total{endpoint,
  status}`` (status ≥ 400);
- ``aiayn_request_duration_seconds{endpoint}``: latency histogram;
- ``aiayn_queue_depth{model}``: requests waiting;
- ``aiayn_batch_size{model}``: requests per encoder batch, rows per decoding step;
- ``aiayn_batch_tokens{model}``: tokens per encoder batch;
- ``aiayn_tokens_total{model, kind}``: tokens read (``input``) and generated (``output``);
- ``aiayn_tokens_per_second{model}``: tokens per second of the latest batch or decoding round;
- ``aiayn_workers_alive{model}``: worker threads running (the model's decode workers, or its
  one encoder worker, per endpoint); below the started count only while a failed thread is
  being replaced;
- ``aiayn_worker_restarts_total{model}``: worker threads replaced after a failure escaped their
  loop (:mod:`aiayn.serving.engine`).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (16, 64, 256, 1024, 4096, 16384, 65536)


class Metrics:
    """The metrics of one app."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "aiayn_requests", "requests answered", ["endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "aiayn_request_errors", "requests answered with an error", ["endpoint", "status"],
            registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "aiayn_request_duration_seconds", "time to the answer", ["endpoint"],
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge("aiayn_queue_depth", "requests waiting", ["model"], registry=r)
        self.batch_size = Histogram(
            "aiayn_batch_size", "requests per encoder batch, rows per decoding step", ["model"],
            buckets=_SIZES, registry=r,
        )  # fmt: skip
        self.batch_tokens = Histogram(
            "aiayn_batch_tokens", "tokens per encoder batch", ["model"], buckets=_TOKENS,
            registry=r,
        )  # fmt: skip
        self.tokens = Counter("aiayn_tokens", "tokens read and generated", ["model", "kind"],
                              registry=r)  # fmt: skip
        self.tokens_per_second = Gauge(
            "aiayn_tokens_per_second", "tokens per second of the latest batch or round",
            ["model"], registry=r,
        )  # fmt: skip
        self.workers = Gauge("aiayn_workers_alive", "worker threads running", ["model"], registry=r)
        self.worker_restarts = Counter(
            "aiayn_worker_restarts", "worker threads replaced after a failure", ["model"],
            registry=r,
        )  # fmt: skip

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request."""
        self.requests.labels(endpoint, str(status)).inc()
        if status >= 400:
            self.errors.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def batch(self, model: str, tokens: int, size: int, started: float) -> None:
        """Count one encoder batch of ``size`` requests and ``tokens`` tokens begun at
        ``started`` (``time.monotonic``)."""
        self.batch_size.labels(model).observe(size)
        self.batch_tokens.labels(model).observe(tokens)
        self.tokens.labels(model, "input").inc(tokens)
        self._rate(model, tokens, started)

    def step(self, model: str, rows: int, generated: int, started: float) -> None:
        """Count one decoding round: ``rows`` rows stepped, ``generated`` tokens."""
        self.batch_size.labels(model).observe(rows)
        self.tokens.labels(model, "output").inc(generated)
        self._rate(model, generated, started)

    def _rate(self, model: str, tokens: int, started: float) -> None:
        seconds = time.monotonic() - started
        if seconds > 0:
            self.tokens_per_second.labels(model).set(tokens / seconds)

    def text(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
