"""The index of the largest log-probability of each row, as ``torch.argmax(x, dim=-1)`` gives it,
found mostly by vectorised passes on CPU: greedy search's choice of the next token.

PyTorch's CPU ``argmax`` compares one element at a time, while its ``amax`` is vectorised; over
a vocabulary of tens of thousands, ``argmax`` takes longer than ``amax`` (docs/performance.md,
"Greedy search's argmax", has the timings). :func:`first_argmax` takes the maxima of
windows that cover the row with ``amax``, the first window holding the largest of them with an
``argmax`` over the window maxima, and the index within that window with an ``argmax`` over its
few hundred elements.

Shape legend:  B rows (all leading dimensions together)   V vocabulary
               N windows per row   W elements per window
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from aiayn.settings import performance

VECTOR_BLOCK = 64
"""Elements that PyTorch's vectorised CPU reduction takes per step (four AVX-512 vectors of
fp32; two steps of AVX2's): a window of whole blocks is reduced with no scalar remainder."""


@lru_cache(maxsize=256)
def windows(vocab: int, chunk: int) -> tuple[int, int]:
    """(stride, width) of the windows that cover a row of ``vocab`` elements exactly: window k
    holds elements ``[k·stride, k·stride + width)`` for ``k < vocab // stride``, and
    ``width = stride + vocab % stride``, so the last window ends at the row's end and the windows
    overlap by ``vocab % stride`` elements. The stride lies in ``[⌈chunk/2⌉, chunk]``, chosen to
    waste the fewest reads: the overlap plus the elements of a window beyond its whole
    :data:`VECTOR_BLOCK` blocks (reduced one at a time); among equals, the largest stride.

    E.g. ``windows(640, 64)`` is (64, 64): ten windows of one block each; ``windows(1000, 128)``
    is (124, 132): 1000 = 8 · 124 + 8, so eight windows, the last [868, 1000), eight elements
    read twice and four beyond two whole blocks, 12 in all (a stride of 125 would read none
    twice but 61 beyond a block; one of 128, 104 twice). Needs ``vocab ≥ chunk ≥ 1``.
    """
    if not 1 <= chunk <= vocab:
        raise ValueError(f"need 1 <= chunk <= vocab, got chunk {chunk}, vocab {vocab}")

    def waste(stride: int) -> tuple[int, int]:
        overlap = vocab % stride
        return overlap + (stride + overlap) % VECTOR_BLOCK, -stride

    stride = min(range((chunk + 1) // 2, chunk + 1), key=waste)
    return stride, stride + vocab % stride


def first_argmax(x: Tensor) -> Tensor:
    """``torch.argmax(x, dim=-1)``, exactly, on every input: among equal maxima the first index;
    a row holding NaN gives its first NaN's index (``argmax`` counts NaN above everything); a
    row of −inf gives 0.

    On CPU, fp32 rows of at least
    :attr:`~aiayn.settings.PerformanceSettings.chunked_argmax_min_vocab` elements (and at least
    :attr:`~aiayn.settings.PerformanceSettings.argmax_chunk`) take :func:`chunked_argmax`;
    shorter rows, other devices and other dtypes (not measured) one ``torch.argmax``.
    """
    settings = performance()
    if (
        not x.is_cpu
        or x.dtype != torch.float32
        or x.dim() == 0
        or x.size(-1) < max(settings.argmax_chunk, settings.chunked_argmax_min_vocab)
    ):
        return torch.argmax(x, dim=-1)
    return chunked_argmax(x, settings.argmax_chunk)


def chunked_argmax(x: Tensor, chunk: int) -> Tensor:
    """``torch.argmax(x, dim=-1)`` of ``x`` (..., V), V ≥ ``chunk``, through the maxima of the
    :func:`windows` of about ``chunk`` elements that cover each row.

    Why it is exact: the windows cover the row in order, so the first window whose maximum is
    the row's (the ``argmax`` of the window maxima: the first of equals, or the first NaN, as
    ``amax`` passes NaN on) holds the row's first maximal element p. Every element before that
    window's start lies in an earlier window, whose maximum is smaller, so p lies at or after
    its start; the window holds a maximal element q ≥ p, so it holds p too, and ``argmax``
    within the window finds p.
    """
    vocab = x.size(-1)
    stride, width = windows(vocab, chunk)
    flat = x.dim() == 2  # (B, V) already, as a step gives it
    rows = x if flat else x.reshape(-1, vocab)  # (..., V) -> (B, V); a view where it can be
    b = rows.size(0)
    spans = rows.unfold(1, width, stride)  # (B, V) -> (B, N, W), overlapping views
    best = spans.amax(dim=2).argmax(dim=1)  # (B, N) -> (B,) first window with the row's max
    if b == 1:  # one row: its window by position (a CPU tensor's value costs no wait)
        start = int(best) * stride
        found = rows.narrow(1, start, width).argmax(dim=1).add_(start)  # (1, W) -> (1,)
    else:
        picked = spans.gather(1, best.view(b, 1, 1).expand(b, 1, width))  # (B, 1, W)
        found = picked.argmax(dim=2).squeeze(1).add_(best, alpha=stride)  # (B, 1, W) -> (B,)
    return found if flat else found.view(x.shape[:-1])  # (B,) -> (...)
