"""Performance settings: the thresholds where one kernel takes over from another that computes
the same thing (up to summation order), tuned by timing both on a machine.

They live here and nowhere else. Each field says what it chooses; docs/performance.md ("Tuned
thresholds") gives the command that times the two kernels and the figures that set its value.
No threshold changes what is computed: tests hold the kernels on either side of it equal, so a
machine that is faster with other values may change them freely.

Every field can be set from the environment (:data:`PREFIX`) for tuning. The modules read
:func:`performance` at call time; :func:`performance_settings` changes fields
for a block (a benchmark trying other cut-offs, a test forcing one side).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

from aiayn.errors import ConfigError


@dataclass(frozen=True)
class PerformanceSettings:
    """The machine-tuned thresholds of aiayn's CPU inference kernels.

    Attributes:
        explicit_attention_max_queries: the longest query T for which attention may run as
            three plain ops (Q Kᵀ, softmax, · V) instead of PyTorch's fused CPU kernel
            (:func:`aiayn.attention.scaled_dot_product_attention`, without gradients).
        explicit_attention_min_rows: from this many query rows B·H·T (of length at most the
            above), the plain ops: batched greedy and beam steps.
        explicit_attention_min_folded_rows: from this many query rows when 2 ≤ T < S (a
            sentence's beams folded into T queries over its source), the plain ops.
        small_product_max_macs: products of up to this many multiply–adds (rows × D_in × D_out)
            keep PyTorch's ``F.linear`` instead of oneDNN's packed kernel, whose call has a
            fixed cost (:class:`aiayn.inference.kernels.LinearKernel`), while the weights stay
            in cache.
        step_weights_max_cache_share: small products keep PyTorch's kernel only when a decoding
            step's linear weights take at most this share of the last-level cache
            (:func:`aiayn.inference.packed.step_weights_stay_in_cache`); beyond it oneDNN reads
            each weight on all threads.
        default_last_level_cache_bytes: the cache size assumed where the OS does not report
            one (:func:`aiayn.inference.packed.last_level_cache_bytes`).
        topk_chunk: beam search's candidate selection on CPU finds the best chunks of this many
            candidates by their maxima, then runs ``topk`` over those chunks only
            (:func:`aiayn.decoding.beam.top_candidates`).
        chunked_topk_min_candidates: rows of fewer candidates (beams × vocabulary) take one
            ``topk``.
        int8_native_max_rows: int8 linear layers (:class:`aiayn.layers.quantized.Int8Kernel`)
            run products of up to this many rows on aiayn's own kernel
            (:mod:`aiayn.kernels.linear`) where it runs, larger ones on the library kernels
            below.
        int8_onednn_max_rows: int8 products of more rows than the above (or all, where aiayn's
            kernel does not run) and up to this many run on oneDNN's ``qlinear_pointwise``,
            larger ones (or all, without oneDNN) on ``torch._int_mm``. All three sum
            exactly in int32 and scale in one order, so the choice changes no output.
        fp32_native_max_rows: fp32 products of up to this many rows on a packed linear
            (:class:`aiayn.inference.kernels.LinearKernel`) run on aiayn's fp32 kernel
            (:mod:`aiayn.kernels.linear`) where it runs, more rows on oneDNN's; 0: never (and
            :class:`~aiayn.inference.kernels.PackedLinear` then keeps no copy of the weight in
            its layout).
        argmax_chunk: greedy search's choice of the next token on CPU
            (:func:`aiayn.decoding.argmax.first_argmax`) takes the maxima of windows of about
            this many elements (a stride between half of it and all of it), then ``argmax``
            within the first window holding the row's maximum.
        chunked_argmax_min_vocab: shorter rows (vocabularies) take one ``torch.argmax``.
        native_attention_max_queries: attention without gradients on CPU in float32 with
            one query, or at most this many over more keys (T < S: a sentence's beams folded
            into T queries over its source), runs on aiayn's own kernel
            (:mod:`aiayn.kernels.attention`) where it runs; 0 turns it off. Other calls keep
            the choice between the fused kernel and the plain ops above.
        native_attention_min_parallel_macs: that kernel shares the heads (B·H) out over threads
            from this many multiply–adds in a call (B·H·T·S·(d_k + d_v)), each thread getting
            at least half of them; smaller calls run on the calling thread.
        serve_pool_keep_bytes: a decode worker of ``aiayn serve`` with nothing to run keeps its
            key/value slot pools up to this many bytes; larger ones (grown for a large
            request) are dropped and the freed heap returned to the system, so memory freed
            after a large request goes back (:mod:`aiayn.serving.decode`).
        serve_decode_workers: worker threads ``aiayn serve`` runs per translation or
            generation model by default (:attr:`aiayn.serving.ServeOptions.decode_workers`):
            a decoding step at a server's batch sizes leaves cores idle (its Python
            bookkeeping and its small products run on one), which a second worker's steps use.
        serve_worker_rows: the decode workers of a model fill in order: the second takes
            requests only while the first steps this many rows or more (the third while the
            second does too, ...). Below it, splitting the rows over workers costs more CPU per
            request than it saves in time: each model call has a fixed cost, paid once per
            worker (docs/serving.md measures both). 0: any worker takes any request.
        kernel_build_timeout_s: the longest a build of aiayn's C++ kernels may take
            (:mod:`aiayn.kernels.build`) before it is stopped and the library kernels run
            instead (docs/performance.md gives a measured build time).
    """

    explicit_attention_max_queries: int = 8
    explicit_attention_min_rows: int = 512
    explicit_attention_min_folded_rows: int = 32
    small_product_max_macs: int = 1 << 18
    step_weights_max_cache_share: float = 0.5
    default_last_level_cache_bytes: int = 32 << 20
    topk_chunk: int = 128
    chunked_topk_min_candidates: int = 1 << 14
    int8_native_max_rows: int = 1024
    int8_onednn_max_rows: int = 1 << 20
    fp32_native_max_rows: int = 8
    argmax_chunk: int = 512
    chunked_argmax_min_vocab: int = 1 << 14
    native_attention_max_queries: int = 32
    native_attention_min_parallel_macs: int = 1 << 17
    serve_pool_keep_bytes: int = 256 << 20
    serve_decode_workers: int = 2
    serve_worker_rows: int = 64
    kernel_build_timeout_s: float = 300.0


PREFIX = "AIAYN_"
"""A field is set from the environment by its name in capitals after this prefix, e.g.
``AIAYN_INT8_NATIVE_MAX_ROWS=64`` (for tuning on a machine: the values are read once)."""


def from_environment(environ: Mapping[str, str]) -> PerformanceSettings:
    """The defaults with every field named in ``environ`` (``AIAYN_<FIELD>``) set from it; a
    value that is not a number of the field's kind, or is negative, is refused by name."""
    changes: dict[str, int | float] = {}
    for field in fields(PerformanceSettings):
        name = PREFIX + field.name.upper()
        text = environ.get(name)
        if text is None or not text.strip():
            continue
        kind = int if field.type in (int, "int") else float
        try:
            value = kind(text.strip())
        except ValueError:
            raise ConfigError(
                f"{name}={text!r}: not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name}={text!r}: must be finite and at least 0")
        changes[field.name] = value
    return PerformanceSettings(**changes)  # type: ignore[arg-type]


_current: PerformanceSettings | None = None


def performance() -> PerformanceSettings:
    """The settings in force (the defaults, with the environment's changes read on first use)."""
    global _current
    if _current is None:
        _current = from_environment(os.environ)
    return _current


@contextmanager
def performance_settings(**changes: Any) -> Iterator[PerformanceSettings]:
    """The settings in force with ``changes`` (fields by name) inside the block, restored after
    it: ``with performance_settings(small_product_max_macs=0): ...``."""
    global _current
    previous = performance()
    _current = replace(previous, **changes)
    try:
        yield _current
    finally:
        _current = previous
