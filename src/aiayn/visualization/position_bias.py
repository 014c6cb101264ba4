"""T5's learned relative position bias, drawn (``aiayn attention --checkpoint T5 --bias OUT.png``).

T5 (Raffel et al. 2020, §2.1) has no positional encoding: each layer's self-attention adds a
learned scalar per head and per *bucket* of the relative position r = key position − query
position to its scores (:mod:`aiayn.layers.relative_position`). The encoder's bias is
bidirectional (half of the buckets for keys after the query, half for keys at or before it); the
decoder's is causal (only r ≤ 0 counts: keys after the query are masked). Within a half of n'
buckets, the distances 0 .. n'/2 − 1 get a bucket each (*exact*); larger distances share
logarithmically wider buckets up to ``max_distance``, and every farther one the last bucket.

:func:`distance_buckets` gives the bucket of every relative position in a range (pure, the same
rule as transformers' ``T5Attention._relative_position_bucket``); :func:`bucket_spans` the runs
of equal buckets (where the picture marks a boundary); :func:`bias_by_distance` a stack's bias
per head over the range; :func:`draw_position_bias` draws every head of every stack as a heatmap
(heads × relative position, a colour bar in score units), the bucket boundaries marked, the
exact part shaded apart from the logarithmic part.

Shape legend:  H heads   R relative positions drawn (low .. high)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.layers.relative_position import RelativePositionBias, relative_position_bucket

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "BiasCurve",
    "bias_by_distance",
    "bucket_spans",
    "default_reach",
    "distance_buckets",
    "draw_position_bias",
    "exact_distances",
]


def distance_buckets(
    low: int, high: int, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> tuple[Tensor, Tensor]:
    """The relative positions ``low .. high`` (key − query, inclusive) and each one's bucket:
    two (R,) long tensors.

    >>> distance_buckets(-3, 3, bidirectional=True, num_buckets=8, max_distance=16)[1].tolist()
    [2, 2, 1, 0, 5, 6, 6]
    """
    if low > high:
        raise ValueError(f"need low <= high, got {low} > {high}")
    distances = torch.arange(low, high + 1)  # (R,)
    buckets = relative_position_bucket(
        distances, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    return distances, buckets


def exact_distances(*, bidirectional: bool, num_buckets: int) -> int:
    """How many distances (0, 1, …) get a bucket each on a side: n'/2, with n' the buckets of a
    side (half of them when bidirectional)."""
    return (num_buckets // 2 if bidirectional else num_buckets) // 2


def bucket_spans(distances: Tensor, buckets: Tensor) -> list[tuple[int, int, int]]:
    """The runs of one bucket along ``distances``: (bucket, first distance, last distance)."""
    spans: list[tuple[int, int, int]] = []
    for distance, bucket in zip(distances.tolist(), buckets.tolist(), strict=True):
        if spans and spans[-1][0] == bucket and spans[-1][2] == distance - 1:
            spans[-1] = (bucket, spans[-1][1], distance)
        else:
            spans.append((bucket, distance, distance))
    return spans


def default_reach(max_distance: int) -> int:
    """The farthest relative position drawn by default: a quarter past ``max_distance``, so the
    last (shared) bucket shows."""
    return max_distance + max(1, max_distance // 4)


@dataclass(frozen=True, eq=False)
class BiasCurve:
    """One stack's bias over a range of relative positions.

    Attributes:
        stack: the stack's name ("encoder", "decoder").
        bidirectional: True for the encoder's bias.
        num_buckets, max_distance: the bias's settings.
        distances: (R,) relative positions key − query.
        buckets: (R,) each one's bucket.
        values: (H, R) each head's bias at each relative position.
    """

    stack: str
    bidirectional: bool
    num_buckets: int
    max_distance: int
    distances: Tensor
    buckets: Tensor
    values: Tensor


@torch.no_grad()
def bias_by_distance(stack: str, bias: RelativePositionBias, reach: int) -> BiasCurve:
    """The bias of every head for relative positions −reach .. reach (bidirectional) or
    −reach .. 0 (causal: later keys are masked)."""
    high = reach if bias.bidirectional else 0
    distances, buckets = distance_buckets(
        -reach,
        high,
        bidirectional=bias.bidirectional,
        num_buckets=bias.num_buckets,
        max_distance=bias.max_distance,
    )
    values = bias.embedding.weight.detach().float().cpu()[buckets].T  # (R, H) -> (H, R)
    return BiasCurve(
        stack, bias.bidirectional, bias.num_buckets, bias.max_distance, distances, buckets, values
    )


def _ticks(low: int, high: int, max_distance: int) -> list[int]:
    """0, ±1, ±2, ±4, … up to the range's ends, and ±max_distance when within it."""
    magnitudes = [0] + [2**i for i in range(max(1, max(-low, high)).bit_length())]
    magnitudes += [max_distance]
    return sorted({s * m for m in magnitudes for s in (-1, 1) if low <= s * m <= high})


def _draw_curve(fig: Figure, ax: Axes, curve: BiasCurve) -> None:
    """One stack's heatmap: heads × relative position on a symmetric-log axis (linear over the
    exact distances, logarithmic beyond, as the buckets are), bucket boundaries marked."""
    d = curve.distances.double()
    heads = curve.values.shape[0]
    limit = float(curve.values.abs().max()) or 1.0
    edges = torch.cat([d - 0.5, d[-1:] + 0.5]).numpy()  # (R + 1,)
    rows = torch.arange(heads + 1).double().numpy() + 0.5  # (H + 1,)
    mesh = ax.pcolormesh(
        edges, rows, curve.values.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, shading="flat"
    )
    exact = exact_distances(bidirectional=curve.bidirectional, num_buckets=curve.num_buckets)
    ax.set_xscale("symlog", linthresh=exact, linscale=1.5)
    ax.set_xlim(edges[0], edges[-1])
    ax.invert_yaxis()
    for _, first, _ in bucket_spans(curve.distances, curve.buckets)[1:]:
        ax.axvline(first - 0.5, color="black", linewidth=0.5, alpha=0.4)
    for edge in (-exact + 0.5, exact - 0.5) if curve.bidirectional else (-exact + 0.5,):
        ax.axvline(edge, color="black", linewidth=1.4, linestyle="--")
    ax.set_yticks(range(1, heads + 1), [f"head {h}" for h in range(1, heads + 1)], fontsize=8)
    ticks = _ticks(int(curve.distances[0]), int(curve.distances[-1]), curve.max_distance)
    ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8)
    ax.set_xlabel(
        "relative position r = key position − query position "
        f"(axis linear for |r| < {exact}, logarithmic beyond)"
    )
    kind = "bidirectional" if curve.bidirectional else "causal: later keys are masked"
    ax.set_title(
        f"{curve.stack} ({kind}): one bucket per distance for |r| < {exact} (between the dashed "
        f"lines), {curve.num_buckets} buckets in all, one for |r| ≥ {curve.max_distance}",
        fontsize=9,
    )
    fig.colorbar(mesh, ax=ax, label="bias added to the score", shrink=0.9)


def draw_position_bias(curves: Sequence[BiasCurve], title: str) -> Figure:
    """A figure of each stack's :class:`BiasCurve`, one panel each, under ``title`` (save it
    with ``savefig``)."""
    from matplotlib.figure import Figure

    heads = max(int(c.values.shape[0]) for c in curves)
    fig = Figure(figsize=(11, len(curves) * (0.32 * heads + 1.6) + 0.6), layout="constrained")
    axes = fig.subplots(len(curves), 1, squeeze=False)
    for ax, curve in zip(axes[:, 0], curves, strict=True):
        _draw_curve(fig, ax, curve)
    fig.suptitle(
        f"{title}\nthe learned score each head adds for a key at relative position r; thin "
        "lines: bucket boundaries (one value per head and bucket)",
        fontsize=10,
    )
    return fig
