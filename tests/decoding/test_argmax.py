"""first_argmax: torch.argmax(x, dim=-1) exactly — ties, infinities, NaN, every row length and
batch size, either side of its thresholds — and its windows, which cover a row exactly."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor

from aiayn.decoding.argmax import first_argmax, windows
from aiayn.settings import performance, performance_settings

NAN, INF = math.nan, math.inf
CHUNKS = (8, performance().argmax_chunk)  # a small chunk: many windows; the default


def same(x: Tensor, chunk: int) -> Tensor:
    """first_argmax of x on the chunked path (windows of about ``chunk``), checked against
    torch.argmax; returns it."""
    with performance_settings(argmax_chunk=chunk, chunked_argmax_min_vocab=0):
        got = first_argmax(x)
    want = torch.argmax(x, dim=-1)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), (x.shape, chunk)
    return got


def test_small_rows_by_hand() -> None:
    x = torch.tensor(
        [
            [0.0, 3.0, 1.0, 3.0, 2.0, 0.0, 3.0, 1.0, 0.0, 2.0, 3.0],  # ties: the first, 1
            [-INF] * 11,  # nothing but −inf: 0
            [1.0, 2.0, INF, 0.0, INF, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # +inf twice: 2
            [1.0, 2.0, INF, 0.0, 0.0, 0.0, 0.0, NAN, 0.0, NAN, 5.0],  # NaN beats +inf: 7
            [0.0] * 10 + [1.0],  # the last element, in the last window: 10
            [-0.0, 0.0] + [-1.0] * 9,  # signed zeros are equal: 0
        ]
    )
    assert windows(11, 4) == (2, 3)  # windows [0, 3), [2, 5), [4, 7), [6, 9), [8, 11)
    with performance_settings(argmax_chunk=4, chunked_argmax_min_vocab=0):
        assert first_argmax(x).tolist() == [1, 0, 2, 7, 10, 0]
        assert first_argmax(x[3]).item() == 7  # one row, no batch dimension
    assert same(x, 4).tolist() == [1, 0, 2, 7, 10, 0]


def test_windows_by_hand() -> None:
    assert windows(640, 64) == (64, 64)  # ten whole blocks
    assert windows(1000, 128) == (124, 132)  # 1000 = 8·124 + 8: 8 read twice, 4 beyond 2 blocks
    assert windows(11, 4) == (2, 3)  # strides 2, 3, 4 waste 1 + 3, 2 + 5, 3 + 7
    assert windows(7, 7) == (7, 7)  # one window, the whole row
    for bad in ((5, 6), (5, 0)):
        with pytest.raises(ValueError, match="chunk"):
            windows(*bad)


LENGTHS = (1, 7, 8, 9, 11, 100, 997, 1000, 32128, 58101)


@pytest.mark.parametrize(
    ("vocab", "chunk"), [(v, c) for v in LENGTHS for c in (1, 2, 8, 64, 128, 512) if c <= v]
)
def test_windows_cover_the_row_in_order(vocab: int, chunk: int) -> None:
    stride, width = windows(vocab, chunk)
    assert (chunk + 1) // 2 <= stride <= chunk and stride <= width < 2 * stride
    starts = range(0, vocab // stride * stride, stride)
    covered = torch.zeros(vocab, dtype=torch.long)
    for s in starts:
        covered[s : s + width] += 1
    assert starts[-1] + width == vocab and bool((covered >= 1).all())  # ends at the row's end
    x = torch.arange(vocab, dtype=torch.float32)
    assert x.unfold(0, width, stride).size(0) == len(starts)  # what first_argmax views


def marked_rows(b: int, vocab: int, positions: list[list[int]], mark: float) -> Tensor:
    """(b, vocab) random values in [0, 1) with ``mark`` at row i's ``positions[i]``."""
    x = torch.rand(b, vocab)
    for i in range(b):
        for p in positions[i]:
            x[i, p] = mark
    return x


def placements(vocab: int, chunk: int) -> list[list[int]]:
    """Tied maxima where windows meet, overlap and end, and at the row's two ends."""
    stride, width = windows(vocab, chunk)
    last = vocab - width  # the last window's start
    edges = sorted({0, vocab - 1, stride - 1, stride, width - 1, last, last - 1, vocab // 2})
    edges = [e for e in edges if 0 <= e < vocab]
    pairs = [[a, b] for a, b in itertools.combinations(edges, 2)]
    return [[e] for e in edges] + pairs + [[last, vocab - 1], [vocab - 1, last]]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_equals_argmax_over_lengths_batches_and_ties(chunk: int) -> None:
    torch.manual_seed(0)
    prime = 1009 if chunk < 100 else 7919
    for vocab in (chunk, chunk + 1, 2 * chunk - 1, 2 * chunk, 2 * chunk + 1, prime, 58101):
        places = placements(vocab, chunk)
        for b in (0, 1, 3, 32):
            same(torch.randn(b, vocab), chunk)  # distinct values
            for first in range(0, len(places), max(b, 1)):  # every placement in some row
                rows = [places[(first + i) % len(places)] for i in range(b)]
                for mark in (2.0, INF, NAN):  # a tied maximum, +inf, NaN at the places
                    got = same(marked_rows(b, vocab, rows, mark), chunk)
                    assert got.tolist() == [min(r) for r in rows]  # the first place, by hand


@pytest.mark.parametrize("chunk", CHUNKS)
def test_infinities_and_nan_everywhere(chunk: int) -> None:
    vocab = 3 * chunk + 5
    for b in (1, 3):
        same(torch.full((b, vocab), -INF), chunk)
        same(torch.full((b, vocab), INF), chunk)
        same(torch.full((b, vocab), NAN), chunk)
        ninf = torch.full((b, vocab), -INF)
        ninf[:, -1] = -1e30  # one finite element, last
        assert same(ninf, chunk).tolist() == [vocab - 1] * b
        mixed = torch.randn(b, vocab)
        mixed[:, ::3] = -INF
        mixed[:, 5::7] = INF
        mixed[:, vocab - 2] = NAN  # a NaN after every +inf still wins
        assert same(mixed, chunk).tolist() == [vocab - 2] * b


def test_rows_shorter_than_a_chunk_and_other_inputs_take_torch_argmax() -> None:
    torch.manual_seed(0)
    for vocab in (1, 2, 7):
        x = torch.randn(3, vocab)
        with performance_settings(argmax_chunk=8, chunked_argmax_min_vocab=0):
            assert torch.equal(first_argmax(x), x.argmax(-1))
    for dtype in (torch.float64, torch.bfloat16, torch.float16, torch.int64):
        x = (torch.randn(3, 300) * 10).to(dtype)
        with performance_settings(argmax_chunk=8, chunked_argmax_min_vocab=0):
            assert torch.equal(first_argmax(x), x.argmax(-1))
    scalar = torch.tensor(3.0)
    assert torch.equal(first_argmax(scalar), torch.argmax(scalar, dim=-1))


@pytest.mark.parametrize("chunk", CHUNKS)
def test_non_contiguous_and_many_leading_dimensions(chunk: int) -> None:
    torch.manual_seed(0)
    wide = torch.randn(6, 4000)
    wide[:, 1500] = 9.0
    wide[:, 2999] = 9.0
    assert same(wide[:, 1000:3000], chunk).tolist() == [500] * 6  # rows of a wider tensor
    assert same(wide[::2, 1000:3000], chunk).tolist() == [500] * 3  # every other row too
    assert same(wide.t()[:3000].t(), chunk).tolist() == [1500] * 6  # transposed twice
    cols = torch.randn(3000, 5).t()  # (5, 3000), elements 5 apart
    same(cols, chunk)
    same(torch.randn(1, 3000).expand(4, 3000), chunk)  # one row seen 4 times (stride 0)
    same(torch.randn(2, 3, 1500), chunk)  # (2, 3, V) -> (2, 3)
    same(torch.randn(3, 2, 1500).transpose(0, 1), chunk)  # leading dimensions not a view
    same(torch.randn(1500), chunk)  # (V,) -> ()


def test_the_same_either_side_of_the_thresholds() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 58101).log_softmax(-1)
    x[1, 3] = x[1, 40000] = 1.0
    whole = {"chunked_argmax_min_vocab": 1 << 40}
    for settings in (whole, {"chunked_argmax_min_vocab": 0}, {}):
        with performance_settings(**settings):
            assert first_argmax(x).tolist() == x.argmax(-1).tolist()
            assert first_argmax(x)[1].item() == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_off_cpu_it_is_torch_argmax() -> None:
    x = torch.randn(4, 58101, device="cuda")
    x[:, 7] = x[:, 40000] = 9.0  # tied maxima: the first
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        got = first_argmax(x.to(dtype))
        assert got.device == x.device and got.tolist() == [7] * 4
