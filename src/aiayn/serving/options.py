"""How ``aiayn serve`` batches and what it accepts: one frozen, validated set of options, set by
the command's flags (each flag checked by the rule of the field it sets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from aiayn.limits import (
    MAX_BEAM_SIZE,
    MAX_REQUEST_BODY_BYTES,
    MAX_REQUEST_TOKENS,
    SERVE_MAX_BEAM,
    SERVE_MAX_REQUEST_TOKENS,
)
from aiayn.settings import performance
from aiayn.validation import Bounds, PositiveInt, validate, validated


@validated(None)
@dataclass(frozen=True)
class ServeOptions:
    """The service's batching and limits.

    Attributes:
        max_batch_tokens: the token budget of one batch: an encoder batch (BERT, ViT: tokens or
            patches of the merged requests), and the prefill of one decoding round (the
            source or prompt tokens of the requests admitted at it).
        max_wait_ms: how long an encoder batch waits for more requests after its first one.
        max_cache_tokens: the key/value cache tokens the requests admitted by one decode worker
            may hold together (each request's rows × (input + output limit)); a request that
            does not fit waits for rows to leave (one is admitted whatever its size when
            nothing runs).
        decode_workers: worker threads decoding for each translation or generation model,
            each running its own groups, all fed by the model's one queue and filling in order
            (the next takes requests only past the rows of those before it:
            :attr:`~aiayn.settings.PerformanceSettings.serve_worker_rows`); by default
            :attr:`~aiayn.settings.PerformanceSettings.serve_decode_workers`.
        queue_size: requests waiting per model; beyond it a request is refused (503).
        timeout_s: a request not answered within this many seconds is answered 504.
        max_body_bytes: the largest request body accepted (413 beyond it).
        batching: False = one request at a time per model (a baseline for benchmarks).
        max_beam: the largest ``beam`` of a translation request (422 beyond;
            :data:`aiayn.limits.SERVE_MAX_BEAM` says why 16).
        max_request_tokens: the most tokens one request may ask the model to hold (sources or
            prompts plus output limits, times beams or ``n``; 413, or 400 for completions,
            beyond; :data:`aiayn.limits.SERVE_MAX_REQUEST_TOKENS`).
        header_timeout_s: a connection must send a request's complete headers within this many
            seconds of opening, or of the end of its previous answer; it is closed otherwise
            (:mod:`aiayn.serving.connections`).
        keep_alive_s: an idle keep-alive connection is closed after this many seconds
            (uvicorn's ``timeout_keep_alive``).
        max_connections: the most connections open at once; one beyond is answered 503 and
            closed before its request is read.
    """

    max_batch_tokens: PositiveInt = 4096
    max_wait_ms: Annotated[float, Bounds(ge=0, le=10_000)] = 5.0
    max_cache_tokens: Annotated[int, Bounds(ge=1, le=MAX_REQUEST_TOKENS * 64)] = (
        SERVE_MAX_REQUEST_TOKENS
    )
    decode_workers: Annotated[int, Bounds(ge=1, le=64)] = field(
        default_factory=lambda: performance().serve_decode_workers
    )
    queue_size: PositiveInt = 256
    timeout_s: Annotated[float, Bounds(gt=0, le=86_400)] = 60.0
    max_body_bytes: Annotated[int, Bounds(ge=1024, le=MAX_REQUEST_BODY_BYTES)] = 1 << 20
    batching: bool = True
    max_beam: Annotated[int, Bounds(ge=1, le=MAX_BEAM_SIZE)] = SERVE_MAX_BEAM
    max_request_tokens: Annotated[int, Bounds(ge=1, le=MAX_REQUEST_TOKENS)] = (
        SERVE_MAX_REQUEST_TOKENS
    )
    header_timeout_s: Annotated[float, Bounds(gt=0, le=3600)] = 10.0
    keep_alive_s: Annotated[int, Bounds(ge=1, le=3600)] = 5
    max_connections: Annotated[int, Bounds(ge=1, le=1_000_000)] = 512

    def __post_init__(self) -> None:
        validate(self)

    @staticmethod
    def flag_help(name: str) -> str:
        """The ``aiayn serve`` flag's one-line help for field ``name`` (:data:`FLAG_HELP`)."""
        return FLAG_HELP[name]

    @property
    def running_decode_workers(self) -> int:
        """The decode workers each translation or generation model runs: ``decode_workers``,
        or one with batching off."""
        return self.decode_workers if self.batching else 1


FLAG_HELP = {
    "max_batch_tokens": "token budget of an encoder batch and of a decoding round's prefill",
    "max_wait_ms": "how long an encoder batch waits for more requests (ms)",
    "max_cache_tokens": "key/value cache tokens the requests of one decode worker may hold",
    "decode_workers": "worker threads decoding per translation or generation model",
    "queue_size": "requests waiting per model before 503",
    "timeout_s": "seconds before a request is answered 504",
    "max_body_bytes": "largest request body in bytes",
    "batching": "one request at a time per model (a baseline)",
    "max_beam": "largest beam of a translation request",
    "max_request_tokens": "most tokens one request may ask for: inputs plus output limits, "
    "times beams or n",
    "header_timeout_s": "seconds a connection has to send a request's headers",
    "keep_alive_s": "seconds an idle connection stays open",
    "max_connections": "connections open at once; 503 beyond",
}
"""The help of the ``aiayn serve`` flag of each :class:`ServeOptions` field (the flags are made
from the fields: ``--max-batch-tokens``, ..., and ``--no-batching`` for ``batching``)."""


def intra_op_threads(threads: int, options: ServeOptions) -> int:
    """The CPU threads each PyTorch operation of the service may use: the process's
    ``threads`` shared out between the decode workers, which run their steps at the same time
    (at a server's batch sizes, one thread per worker beats workers whose parallel operations
    contend for the same cores: docs/serving.md). With batching off, one worker keeps them all
    (for a small model one request's operations run faster on one thread, `OMP_NUM_THREADS=1`;
    docs/serving.md measures it, larger models were not measured). E.g. 2 threads and 2
    workers -> 1 each; 16 and 2 -> 8; 1 and 2 -> 1."""
    return max(1, threads // options.running_decode_workers)
