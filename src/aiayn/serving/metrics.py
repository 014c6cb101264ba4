"""The service's Prometheus metrics (``GET /metrics``, text format, via ``prometheus-client``),
in a registry of the app's own, so that two apps in one process count apart.

- ``aiayn_requests_total{endpoint, status}`` and ``aiayn_request_errors_total{endpoint,
  status}`` (status ≥ 400);
- ``aiayn_request_duration_seconds{endpoint, model}``: latency histogram (``model`` is the
  model the request went to; "" where it chose none: ``/health``, a refusal before a model);
- ``aiayn_queue_depth{model}``: requests waiting (queued, not taken by a worker yet);
- ``aiayn_requests_running{model}``: requests a worker has taken and not answered yet (read when
  scraped, summed over the model's workers);
- ``aiayn_time_to_first_token_seconds{model}``: translation and generation, from a request's
  arrival to the step that gives its first token;
- ``aiayn_time_per_output_token_seconds{model}``: translation and generation, a request's time
  from its first token to its last over the steps between them (one token a step per row);
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
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (16, 64, 256, 1024, 4096, 16384, 65536)
_TTFT = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """The metrics of one app."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        endpoint, model = ["endpoint", "status"], ["model"]
        self.requests = Counter("aiayn_requests", "requests answered", endpoint, registry=r)
        self.errors = Counter(
            "aiayn_request_errors", "requests answered with an error", endpoint, registry=r
        )
        self.latency = _histogram(
            r, "aiayn_request_duration_seconds", "time to the answer", _LATENCY, "endpoint"
        )
        self.queue_depth = Gauge("aiayn_queue_depth", "requests waiting", model, registry=r)
        self.running = Gauge(
            "aiayn_requests_running",
            "requests taken by a worker, not answered yet",
            model,
            registry=r,
        )
        self._running: dict[str, list[Callable[[], int]]] = {}
        self.first_token = _histogram(
            r,
            "aiayn_time_to_first_token_seconds",
            "time from a request's arrival to its first token",
            _TTFT,
        )
        self.per_token = _histogram(
            r,
            "aiayn_time_per_output_token_seconds",
            "time per output token after the first",
            _TPOT,
        )
        self.batch_size = _histogram(
            r, "aiayn_batch_size", "requests per encoder batch, rows per decoding step", _SIZES
        )
        self.batch_tokens = _histogram(r, "aiayn_batch_tokens", "tokens per encoder batch", _TOKENS)
        self.tokens = Counter(
            "aiayn_tokens", "tokens read and generated", ["model", "kind"], registry=r
        )
        self.tokens_per_second = Gauge(
            "aiayn_tokens_per_second",
            "tokens per second of the latest batch or round",
            model,
            registry=r,
        )
        self.workers = Gauge("aiayn_workers_alive", "worker threads running", model, registry=r)
        self.worker_restarts = Counter(
            "aiayn_worker_restarts", "worker threads replaced after a failure", model, registry=r
        )

    def request(self, endpoint: str, status: int, seconds: float, model: str = "") -> None:
        """Count one answered request (``model``: the model it went to, "" for none)."""
        self.requests.labels(endpoint, str(status)).inc()
        if status >= 400:
            self.errors.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint, model).observe(seconds)

    def watch_running(self, model: str, count: Callable[[], int]) -> None:
        """Add ``count()`` (one worker pool's running requests) to ``model``'s running gauge,
        read when scraped."""
        counts = self._running.setdefault(model, [])
        counts.append(count)
        self.running.labels(model).set_function(lambda: float(sum(c() for c in counts)))

    def first_tokens(self, model: str, arrived: Sequence[float], now: float) -> None:
        """Observe the time to the first token of requests that ``arrived`` then."""
        child = self.first_token.labels(model)
        for t in arrived:
            child.observe(now - t)

    def per_output_token(self, model: str, seconds: float, tokens: int) -> None:
        """Observe a finished request's time per output token: ``seconds`` from its first
        token to its last, over the ``tokens`` after the first (nothing for none)."""
        if tokens > 0:
            self.per_token.labels(model).observe(seconds / tokens)

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


def _histogram(
    registry: CollectorRegistry,
    name: str,
    documentation: str,
    buckets: tuple[float, ...],
    *labels: str,
) -> Histogram:
    """A histogram of ``registry`` labelled by ``labels`` and the model."""
    return Histogram(name, documentation, [*labels, "model"], buckets=buckets, registry=registry)
