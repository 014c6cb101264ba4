"""The paper's claims about attention, as small experiments (``aiayn experiment NAME``).

Each experiment is a function ``(out_dir, *, quick=False, seed=0) -> ExperimentResult`` that
measures something, writes a PNG plot ``NAME.png`` and the table as ``NAME.md`` (Markdown) and
``NAME.csv`` into ``out_dir``, and returns the table as a list of dict rows. ``quick=True`` runs
a tiny version in about a second (for tests); the default size is the one documented in
``docs/notes/insight.md`` (the lab book of docs/insight.md). :data:`EXPERIMENTS` maps the names
to the functions:

``scaling`` (§3.2.1)
    Why Q Kᵀ is divided by √d_k: for queries and keys with unit-variance components the dot
    product has variance d_k; unscaled, the softmax saturates as d_k grows (its entropy falls
    towards 0) and its gradient (the norm of its Jacobian) vanishes; scaled, neither moves.
``additive`` (§3.2.1)
    Dot-product versus additive (Bahdanau) attention, :class:`aiayn.attention.additive.
    AdditiveAttention`: time and peak memory, forward and forward + backward, for growing
    sequence length and d_k. "Similar in theoretical complexity, [dot-product] is much faster
    and more space-efficient in practice."
``multihead`` (§3.2.2)
    h = 8 heads of d_k = 64 versus one head of d_k = 512 at d_model = 512 (and other splits):
    the same parameter count, 3·m·h·n_h + n_h·h·o (m inputs, n_h heads of size h, o outputs),
    the same FLOPs, and the measured time.
``positional`` (§3.5)
    The sinusoidal encodings as an image (position × dimension), and PE(p)·PE(q): it depends only
    on the distance q − p, symmetrically (Σ_i cos(ω_i (q − p))).

Timings are medians of a few repeats with :func:`time.perf_counter` on the current device (CPU
here) and depend on the machine and its load; peak memory counts the bytes of the tensors the
computation allocates and that are alive at the same time (a dispatch-mode tracker, so it works
on CPU where PyTorch keeps no allocator statistics).

Shape legend:
    N  number of queries (rows)        S  number of keys
    B  batch size                      H  heads          T  sequence length
    d_k  query/key size                A  additive attention's hidden size (= d_k here)
    P  positions                       D  d_model
"""

from __future__ import annotations

import csv
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.attention import SelfAttention

__all__ = [
    "EXPERIMENTS",
    "ExperimentResult",
    "PeakMemory",
    "additive_experiment",
    "format_table",
    "multihead_experiment",
    "multihead_parameter_formula",
    "positional_experiment",
    "run_experiment",
    "scaling_experiment",
    "softmax_jacobian_norm",
]


@dataclass(frozen=True)
class ExperimentResult:
    """What an experiment returns.

    Attributes:
        name: the registry name (``scaling`` …).
        title: one line saying what is measured, with the paper's section.
        rows: the table, one dict per row (the same keys in every row).
        summary: what this run shows, in a few sentences with its numbers.
        plot: the PNG written.
        table: the Markdown file written (the CSV lies beside it).
    """

    name: str
    title: str
    rows: list[dict[str, Any]]
    summary: str
    plot: Path
    table: Path


# -- helpers -----------------------------------------------------------------------------------
def _format_value(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10000:
        return f"{value:,}"
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if value == 0.0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (floats to 4 significant digits)."""
    if not rows:
        return "(no rows)\n"
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_format_value(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _write_outputs(
    name: str, title: str, rows: list[dict[str, Any]], summary: str, out_dir: Path
) -> Path:
    """Write ``NAME.md`` (title, summary, table) and ``NAME.csv``; returns the Markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{name}.md"
    md.write_text(f"# {title}\n\n{summary}\n\n{format_table(rows)}", encoding="utf-8")
    with (out_dir / f"{name}.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return md


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


class PeakMemory(TorchDispatchMode):
    """Peak bytes of tensor storage allocated inside the ``with`` block and alive at once.

    Every tensor an operator returns (forward and backward alike) is remembered through a weak
    reference to its storage; after each operator the storages still alive are summed. Storages
    that existed before the block (inputs, parameters) are not counted, so this is the extra
    memory the computation needs, like ``torch.cuda.max_memory_allocated`` minus the baseline.
    """

    def __init__(self) -> None:
        super().__init__()
        self._inside: dict[int, tuple[Any, int]] = {}  # storage id -> (weak ref, bytes)
        self._outside: dict[int, Any] = {}  # storages first seen as inputs: not counted
        self.peak_bytes = 0

    def __enter__(self) -> PeakMemory:
        super().__enter__()
        return self

    def _seen(self, key: int) -> bool:
        """Whether ``key`` names a storage already tracked and still alive (ids are reused)."""
        inside = self._inside.get(key)
        if inside is not None and not inside[0].expired():
            return True
        outside = self._outside.get(key)
        return outside is not None and not outside.expired()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._pytree import tree_leaves

        for t in tree_leaves((args, kwargs)):
            if isinstance(t, Tensor):
                storage = t.untyped_storage()
                if not self._seen(storage._cdata):
                    self._outside[storage._cdata] = StorageWeakRef(storage)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                storage = t.untyped_storage()
                if not self._seen(storage._cdata):
                    self._inside[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
        for key in [k for k, (ref, _) in self._inside.items() if ref.expired()]:
            del self._inside[key]
        for key in [k for k, ref in self._outside.items() if ref.expired()]:
            del self._outside[key]
        self.peak_bytes = max(self.peak_bytes, sum(n for _, n in self._inside.values()))
        return out


def _peak_mib(fn: Callable[[], object]) -> float:
    with PeakMemory() as tracker:
        fn()
    return tracker.peak_bytes / 2**20


def _threads() -> str:
    """ "1 thread" / "2 threads": PyTorch's intra-op thread count, for the captions."""
    n = torch.get_num_threads()
    return f"{n} thread" if n == 1 else f"{n} threads"


def _log2_ticks(ax: Any, values: list[int]) -> None:
    """A base-2 log x axis with a tick (plain number) at each measured value."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.minorticks_off()


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save_figure(fig: Any, out_dir: Path, name: str) -> Path:
    """Write ``fig`` as ``NAME.png`` into ``out_dir`` (created if need be); returns the path."""
    plot = out_dir / f"{name}.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot, dpi=80)
    return plot


def _result(
    name: str, title: str, rows: list[dict[str, Any]], summary: str, plot: Path, out_dir: Path
) -> ExperimentResult:
    """Write the table (:func:`_write_outputs`) and return the experiment's result."""
    table = _write_outputs(name, title, rows, summary, out_dir)
    return ExperimentResult(name, title, rows, summary, plot, table)


# -- 1. scaling --------------------------------------------------------------------------------
def softmax_jacobian_norm(weights: Tensor) -> Tensor:
    """‖∂softmax(z)/∂z‖_F per row, from the softmax output p = softmax(z).

    The Jacobian is diag(p) − p pᵀ, so ‖J‖²_F = Σ p_i² − 2 Σ p_i³ + (Σ p_i²)²: near 0 when p is
    one-hot (a saturated softmax passes almost no gradient back), largest when p is uniform.

    Args:
        weights: (…, S) softmax outputs (rows sum to 1).

    Returns:
        (…,) Frobenius norms.
    """
    p2 = (weights**2).sum(-1)  # (…,)
    p3 = (weights**3).sum(-1)  # (…,)
    return (p2 - 2 * p3 + p2**2).clamp_min(0).sqrt()


def _scaling_row(dots: Tensor, d_k: int, scaled: bool) -> dict[str, Any]:
    """One row of :func:`scaling_experiment` from the (N, S) dot products q·k."""
    logits = dots / math.sqrt(d_k) if scaled else dots  # (N, S)
    weights = torch.softmax(logits, dim=-1)  # (N, S)
    entropy = -(weights * torch.log(weights.clamp_min(1e-30))).sum(-1)  # (N,)
    return {
        "d_k": d_k,
        "scaling": "1/√d_k" if scaled else "none",
        "score_std": float(logits.std()),
        "sqrt_d_k": math.sqrt(d_k),
        "entropy": float(entropy.mean()),
        "max_weight": float(weights.max(-1).values.mean()),
        "grad_norm": float(softmax_jacobian_norm(weights).mean()),
    }


def _scaling_rows(d_ks: tuple[int, ...], n: int, s: int, seed: int) -> list[dict[str, Any]]:
    """Unscaled then scaled rows for each d_k: N random queries, each against S fresh keys."""
    gen = torch.Generator().manual_seed(seed)
    rows: list[dict[str, Any]] = []
    for d_k in d_ks:
        q = torch.randn(n, d_k, generator=gen)  # (N, d_k)
        k = torch.randn(n, s, d_k, generator=gen)  # (N, S, d_k): fresh keys for every query
        dots = (k @ q.unsqueeze(-1)).squeeze(-1)  # (N, S, d_k) @ (N, d_k, 1) -> (N, S)
        for scaled in (False, True):
            rows.append(_scaling_row(dots, d_k, scaled))
    return rows


def _split_scaling(
    rows: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows without scaling, and those with 1/√d_k."""
    unscaled = [r for r in rows if r["scaling"] == "none"]
    scaled_rows = [r for r in rows if r["scaling"] != "none"]
    return unscaled, scaled_rows


def _plot_scaling(rows: list[dict[str, Any]], d_ks: tuple[int, ...], s: int, out_dir: Path) -> Path:
    """Score std, softmax entropy and gradient norm against d_k, unscaled and scaled."""
    unscaled, scaled_rows = _split_scaling(rows)
    fig = _new_figure(12, 3.6)
    axes = fig.subplots(1, 3)
    for subset, label, style in ((unscaled, "q·k", "o-"), (scaled_rows, "q·k / √d_k", "s-")):
        xs = [r["d_k"] for r in subset]
        axes[0].plot(xs, [r["score_std"] for r in subset], style, label=label)
        axes[1].plot(xs, [r["entropy"] for r in subset], style, label=label)
        axes[2].plot(xs, [r["grad_norm"] for r in subset], style, label=label)
    xs = [r["d_k"] for r in unscaled]
    axes[0].plot(xs, [math.sqrt(x) for x in xs], "k:", label="√d_k")
    axes[0].set(xscale="log", yscale="log", title="std of the scores", xlabel="d_k")
    axes[1].axhline(math.log(s), color="gray", ls=":", label=f"ln S (uniform, S={s})")
    axes[1].set(xscale="log", title="softmax entropy (nats)", xlabel="d_k")
    axes[2].set(xscale="log", yscale="log", title="‖∂softmax/∂scores‖_F", xlabel="d_k")
    for ax in axes:
        ax.legend(fontsize=8)
        _log2_ticks(ax, list(d_ks))
    fig.suptitle("§3.2.1: why scale by 1/√d_k (unit-variance random q, k)", fontsize=10)
    return _save_figure(fig, out_dir, "scaling")


def _scaling_summary(rows: list[dict[str, Any]], s: int) -> str:
    """What :func:`scaling_experiment`'s rows show, with their numbers."""
    unscaled, scaled_rows = _split_scaling(rows)
    first, last = unscaled[0], unscaled[-1]
    steepest = max(unscaled, key=lambda r: r["grad_norm"])
    flat = [r["entropy"] for r in scaled_rows]
    flat_grad = [r["grad_norm"] for r in scaled_rows]
    return (
        f"Without scaling the scores' std grows like √d_k ({first['score_std']:.2f} at "
        f"d_k={first['d_k']}, {last['score_std']:.1f} at d_k={last['d_k']}, √d_k = "
        f"{last['sqrt_d_k']:.1f}) and the softmax saturates: entropy {first['entropy']:.2f} → "
        f"{last['entropy']:.2f} nats (uniform = ln {s} = {math.log(s):.2f}), largest weight "
        f"{last['max_weight']:.2f} at d_k={last['d_k']}; the gradient norm, largest "
        f"({steepest['grad_norm']:.3f}) at d_k={steepest['d_k']}, falls to "
        f"{last['grad_norm']:.3f}. With 1/√d_k the std stays ≈ 1, the entropy within "
        f"[{min(flat):.2f}, {max(flat):.2f}] nats and the gradient norm within "
        f"[{min(flat_grad):.3f}, {max(flat_grad):.3f}] for every d_k."
    )


def scaling_experiment(out_dir: Path, *, quick: bool = False, seed: int = 0) -> ExperimentResult:
    """§3.2.1: dot products of unit-variance vectors have variance d_k; 1/√d_k undoes it.

    For each d_k, N queries each meet S keys, every component i.i.d. N(0, 1). Per row of S
    scores, with and without the 1/√d_k: the standard deviation of the scores, the softmax's
    entropy (ln S = uniform, 0 = one-hot), its largest weight, and the norm of its Jacobian
    with respect to the scores (:func:`softmax_jacobian_norm`), averaged over the N rows.
    """
    d_ks = (4, 16, 64, 256) if quick else (1, 4, 16, 64, 256, 1024)
    n, s = (128, 32) if quick else (256, 64)
    rows = _scaling_rows(d_ks, n, s, seed)
    plot = _plot_scaling(rows, d_ks, s, out_dir)
    summary = _scaling_summary(rows, s)
    title = "Why scale by √d_k (§3.2.1): score spread, softmax entropy and gradient against d_k"
    return _result("scaling", title, rows, summary, plot, out_dir)


# -- 2. additive versus dot-product ------------------------------------------------------------
def _costs(fn: Callable[[], Tensor], leaves: tuple[Tensor, ...], repeats: int) -> dict[str, float]:
    """Forward and forward + backward time (ms) and peak memory (MiB) of ``fn``."""

    def forward() -> None:
        with torch.no_grad():
            fn()

    def train() -> None:
        for tensor in leaves:
            tensor.grad = None  # every call allocates its gradients afresh
        fn().sum().backward()

    return {
        "forward_ms": _median_ms(forward, repeats),
        "fwd_bwd_ms": _median_ms(train, repeats),
        "fwd_peak_mib": _peak_mib(forward),
        "fwd_bwd_peak_mib": _peak_mib(train),
    }


def _attention_costs(
    query: Tensor, key: Tensor, value: Tensor, repeats: int
) -> list[dict[str, Any]]:
    """One row per implementation for (B, H, T, d_k) inputs: see :func:`additive_experiment`."""
    from aiayn.attention.additive import AdditiveAttention
    from aiayn.attention.scaled_dot_product import scaled_dot_product_attention

    q, k, v = (x.detach().requires_grad_() for x in (query, key, value))  # 3 × (B, H, T, d_k)
    additive = AdditiveAttention(q.size(-1))
    leaves = (q, k, v, *additive.parameters())
    kinds: dict[str, Callable[[], Tensor]] = {
        "dot": lambda: scaled_dot_product_attention(q, k, v, need_weights=True)[0],
        "dot_fused": lambda: scaled_dot_product_attention(q, k, v)[0],
        "additive": lambda: additive(q, k, v)[0],
    }
    return [
        {"kind": name, "T": q.size(2), "d_k": q.size(-1), **_costs(fn, leaves, repeats)}
        for name, fn in kinds.items()
    ]


def _additive_rows(
    grid: list[tuple[int, int]], batch: int, heads: int, repeats: int, seed: int
) -> list[dict[str, Any]]:
    """:func:`_attention_costs` at each (T, d_k) of ``grid``, on random (B, H, T, d_k) inputs."""
    gen = torch.Generator().manual_seed(seed)
    rows: list[dict[str, Any]] = []
    for t, d_k in grid:
        q, k, v = (torch.randn(batch, heads, t, d_k, generator=gen) for _ in range(3))
        rows += _attention_costs(q, k, v, repeats)
    return rows


def _plot_additive(
    rows: list[dict[str, Any]], grid: list[tuple[int, int]], title: str, out_dir: Path
) -> Path:
    """Forward + backward time and peak memory against T (first column) and d_k (second)."""
    fig = _new_figure(12, 7)
    axes = fig.subplots(2, 2)
    sweeps = (("T", "d_k", grid[0][1]), ("d_k", "T", grid[-1][0]))
    for col, (x_key, fixed_key, fixed) in enumerate(sweeps):
        for name, style in (("dot", "o-"), ("dot_fused", "^-"), ("additive", "s-")):
            subset = sorted(
                (r for r in rows if r["kind"] == name and r[fixed_key] == fixed),
                key=lambda r: r[x_key],
            )
            xs = [r[x_key] for r in subset]
            axes[0][col].plot(xs, [r["fwd_bwd_ms"] for r in subset], style, label=name)
            axes[1][col].plot(xs, [r["fwd_bwd_peak_mib"] for r in subset], style, label=name)
        axes[0][col].set(xscale="log", yscale="log", xlabel=x_key, ylabel="forward + backward (ms)")
        axes[0][col].set_title(f"time, {fixed_key} = {fixed}", fontsize=9)
        axes[1][col].set(xscale="log", yscale="log", xlabel=x_key, ylabel="peak memory (MiB)")
        axes[1][col].set_title(f"peak memory, {fixed_key} = {fixed}", fontsize=9)
        axes[0][col].legend(fontsize=8)
        axes[1][col].legend(fontsize=8)
        for ax in (axes[0][col], axes[1][col]):
            _log2_ticks(ax, sorted({r[x_key] for r in rows if r[fixed_key] == fixed}))
    fig.suptitle(title, fontsize=10)
    return _save_figure(fig, out_dir, "additive")


def _additive_ratio(rows: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """The smallest and largest additive / ``dot`` ratio of ``key`` at the same (T, d_k)
    (NaN, NaN if none)."""
    r = [
        a[key] / d[key]
        for a in rows
        if a["kind"] == "additive"
        for d in rows
        if d["kind"] == "dot" and d["T"] == a["T"] and d["d_k"] == a["d_k"] and d[key] > 0
    ]
    return (min(r), max(r)) if r else (float("nan"), float("nan"))


def additive_experiment(out_dir: Path, *, quick: bool = False, seed: int = 0) -> ExperimentResult:
    """§3.2.1: time and peak memory of dot-product versus additive attention.

    Three implementations on the same (B, H, T, d_k) queries, keys and values (self-attention
    shapes, T = S): ``dot`` = eq. (1) computed step by step (the scores and weights are
    materialised, as the paper's description implies), ``dot_fused`` = PyTorch's fused
    ``scaled_dot_product_attention`` kernel (what the model uses when no weights are asked
    for), ``additive`` = :class:`~aiayn.attention.additive.AdditiveAttention` with hidden size
    A = d_k. Swept: T at d_k = 64, then d_k at a fixed T. Measured: forward time, forward +
    backward time (median of a few runs) and the peak extra memory of forward + backward.
    """
    batch, heads = (1, 2) if quick else (1, 4)
    repeats = 1 if quick else 5
    if quick:
        grid = [(8, 8), (16, 8), (16, 16)]
    else:
        lengths, d_ks = (32, 64, 128, 256), (16, 32, 128, 256)
        grid = [(t, 64) for t in lengths] + [(128, d) for d in d_ks]
    rows = _additive_rows(grid, batch, heads, repeats, seed)
    suptitle = f"§3.2.1: dot-product vs additive attention (B={batch}, H={heads}, {_threads()})"
    plot = _plot_additive(rows, grid, suptitle, out_dir)
    time_lo, time_hi = _additive_ratio(rows, "fwd_bwd_ms")
    mem_lo, mem_hi = _additive_ratio(rows, "fwd_bwd_peak_mib")
    summary = (
        f"Additive / dot-product (eq. 1, step by step), forward + backward: time × "
        f"{time_lo:.1f}–{time_hi:.1f}, peak memory × {mem_lo:.1f}–{mem_hi:.1f} over the grid "
        f"(B={batch}, H={heads}, {_threads()}). Additive attention "
        "materialises a (B, H, T, S, A) hidden layer where eq. (1) holds (B, H, T, S) scores."
    )
    title = "Dot-product vs additive attention (§3.2.1): time and peak memory"
    return _result("additive", title, rows, summary, plot, out_dir)


# -- 3. multi-head cost ------------------------------------------------------------------------
def multihead_parameter_formula(m: int, head_size: int, num_heads: int, o: int) -> int:
    """3·m·h·n_h + n_h·h·o: W^Q, W^K, W^V (m → h per head) and W^O (n_h·h → o), no biases.

    Args:
        m: input size (d_model).
        head_size: h, the per-head size d_k = d_v.
        num_heads: n_h, the number of heads.
        o: output size (d_model).
    """
    return 3 * m * head_size * num_heads + num_heads * head_size * o


def _multihead_row(
    layer: SelfAttention, h: int, x: Tensor, with_bias: int, repeats: int
) -> dict[str, Any]:
    """One row of :func:`multihead_experiment`: ``layer`` (h heads, no biases) on ``x`` (B, T, D);
    ``with_bias``: the parameter count of the same layer with biases."""
    from aiayn.models import count_parameters

    batch, t, d_model = x.shape
    d_k = d_model // h

    def forward() -> None:
        with torch.no_grad():
            layer(x)

    def train() -> None:
        layer.zero_grad(set_to_none=True)  # every call allocates its gradients afresh
        layer(x).output.sum().backward()

    flops = 2 * batch * t * 4 * d_model**2 + 2 * 2 * batch * t * t * d_model
    return {
        "heads": h,
        "d_k": d_k,
        "params": count_parameters(layer),
        "formula": multihead_parameter_formula(d_model, d_k, h, d_model),
        "params_with_bias": with_bias,
        "fwd_mflops": flops / 1e6,
        "forward_ms": _median_ms(forward, repeats),
        "fwd_bwd_ms": _median_ms(train, repeats),
    }


def _multihead_rows(
    d_model: int, head_counts: tuple[int, ...], batch: int, t: int, repeats: int, seed: int
) -> list[dict[str, Any]]:
    """A row per head count, on one (B, T, D) input; the global RNG is seeded with ``seed``."""
    from aiayn.attention import SelfAttention
    from aiayn.models import count_parameters

    torch.manual_seed(seed)
    x = torch.randn(batch, t, d_model)  # (B, T, D)
    rows: list[dict[str, Any]] = []
    for h in head_counts:
        layer = SelfAttention(d_model, h, bias=False)
        with_bias = count_parameters(SelfAttention(d_model, h))
        rows.append(_multihead_row(layer, h, x, with_bias, repeats))
    return rows


def _plot_multihead(
    rows: list[dict[str, Any]], d_model: int, batch: int, t: int, out_dir: Path
) -> Path:
    """Parameters and times (forward, forward + backward) for each heads × d_k split."""
    fig = _new_figure(10, 3.6)
    ax_params, ax_time = fig.subplots(1, 2)
    labels = [f"{r['heads']}×{r['d_k']}" for r in rows]
    ax_params.bar(labels, [r["params"] for r in rows], color="C0")
    ax_params.axhline(rows[0]["formula"], color="k", ls=":", label="3·m·h·n_h + n_h·h·o")
    ax_params.set(title="parameters (no biases)", xlabel="heads × d_k")
    ax_params.legend(fontsize=8, loc="lower right")
    positions = range(len(rows))
    ax_time.bar([p - 0.2 for p in positions], [r["forward_ms"] for r in rows], 0.4, label="fwd")
    ax_time.bar([p + 0.2 for p in positions], [r["fwd_bwd_ms"] for r in rows], 0.4, label="f+b")
    ax_time.set_xticks(list(positions), labels)
    ax_time.set(title=f"time, B={batch}, T={t} (ms)", xlabel="heads × d_k")
    ax_time.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"§3.2.2: multi-head cost at d_model = {d_model}", fontsize=10)
    return _save_figure(fig, out_dir, "multihead")


def multihead_experiment(out_dir: Path, *, quick: bool = False, seed: int = 0) -> ExperimentResult:
    """§3.2.2: h heads of d_k = d_model / h cost about as much as one full-width head.

    For each head count: parameters of :class:`~aiayn.attention.SelfAttention` without biases
    (and with), the closed form :func:`multihead_parameter_formula`, the forward FLOPs
    (projections 2·B·T·4·D², scores and weighted sum 2·2·B·T²·D; no h anywhere) and the
    measured forward and forward + backward times of self-attention on (B, T, D) inputs.
    """
    d_model = 64 if quick else 512
    head_counts = (1, 8) if quick else (1, 2, 4, 8, 16)
    batch, t = (2, 8) if quick else (8, 64)
    repeats = 1 if quick else 7
    rows = _multihead_rows(d_model, head_counts, batch, t, repeats, seed)
    plot = _plot_multihead(rows, d_model, batch, t, out_dir)
    one = next(r for r in rows if r["heads"] == 1)
    many = rows[-1] if quick else next(r for r in rows if r["heads"] == 8)
    summary = (
        f"d_model = {d_model}: {many['heads']} heads of d_k = {many['d_k']} and 1 head of "
        f"d_k = {one['d_k']} both have {one['params']:,} weights (= 3·m·h·n_h + n_h·h·o = "
        f"4·d_model²; {one['params_with_bias']:,} with biases) and the same "
        f"{one['fwd_mflops']:.1f} MFLOPs forward; measured forward + backward "
        f"{many['fwd_bwd_ms']:.2f} ms vs {one['fwd_bwd_ms']:.2f} ms "
        f"(× {many['fwd_bwd_ms'] / one['fwd_bwd_ms']:.2f}) on {_threads()}."
    )
    title = "Multi-head cost (§3.2.2): parameters, FLOPs and time for h heads of d_model / h"
    return _result("multihead", title, rows, summary, plot, out_dir)


# -- 4. positional encoding --------------------------------------------------------------------
def _positional_rows(dots: Tensor, d_model: int) -> list[dict[str, Any]]:
    """For some offsets k: PE(p)·PE(p + k) averaged over p, its spread over p, the mean at −k,
    and the mean as a cosine (÷ D/2). ``dots`` is the (P, P) table PE(p)·PE(q)."""
    positions = dots.shape[0]
    rows: list[dict[str, Any]] = []
    for k in [k for k in (0, 1, 2, 3, 4, 8, 16, 32, 64) if k < positions]:
        forward = torch.diagonal(dots, offset=k)  # (P − k,): PE(p)·PE(p + k) for every p
        backward = torch.diagonal(dots, offset=-k)  # (P − k,): PE(p + k)·PE(p)
        rows.append(
            {
                "distance": k,
                "dot": float(forward.mean()),
                "spread_over_p": float(forward.max() - forward.min()),
                "dot_at_minus_k": float(backward.mean()),
                "cosine": float(forward.mean()) / (d_model / 2),
            }
        )
    return rows


def _plot_positional(pe: Tensor, dots: Tensor, out_dir: Path) -> Path:
    """The (P, D) table ``pe`` as an image, the (P, P) ``dots`` = PE(p)·PE(q), and
    PE(p)·PE(p + k) against k for two starts p."""
    positions, d_model = pe.shape
    fig = _new_figure(13, 3.8)
    ax_table, ax_dots, ax_curve = fig.subplots(1, 3)
    # Shown as [sin dimensions 0, 2, 4, … | cos dimensions 1, 3, 5, …]: interleaved columns
    # alias into false bands when 512 columns are drawn in a few hundred pixels.
    halves = torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)  # (P, D/2) ‖ (P, D/2) -> (P, D)
    image = ax_table.imshow(
        halves.numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest"
    )
    ax_table.axvline(d_model / 2 - 0.5, color="k", lw=0.8)
    ax_table.set(
        title="PE(position, dimension): sin(2i) | cos(2i+1)",
        xlabel="i (sin half, then cos half)",
        ylabel="position",
    )
    half = d_model // 2
    ticks = [0, half // 2, half, half + half // 2]
    ax_table.set_xticks(ticks, [str(t % half) for t in ticks])
    fig.colorbar(image, ax=ax_table, shrink=0.8)
    image = ax_dots.imshow(dots.numpy(), cmap="viridis", aspect="auto", interpolation="nearest")
    ax_dots.set(title="PE(p)·PE(q)", xlabel="q", ylabel="p")
    fig.colorbar(image, ax=ax_dots, shrink=0.8)
    for p0, style in ((positions // 2, "-"), (positions // 4, "--")):
        ks = range(-p0, positions - p0)
        ax_curve.plot(list(ks), [float(dots[p0, p0 + k]) for k in ks], style, label=f"p = {p0}")
    ax_curve.set(title="PE(p)·PE(p + k)", xlabel="offset k")
    ax_curve.legend(fontsize=8)
    fig.suptitle(f"§3.5: sinusoidal positional encoding, d_model = {d_model}", fontsize=10)
    return _save_figure(fig, out_dir, "positional")


def positional_experiment(out_dir: Path, *, quick: bool = False, seed: int = 0) -> ExperimentResult:
    """§3.5: the sinusoidal table, and PE(p)·PE(p + k) as a function of the offset k.

    PE(p)·PE(q) = Σ_i [sin(ω_i p) sin(ω_i q) + cos(ω_i p) cos(ω_i q)] = Σ_i cos(ω_i (q − p)):
    a function of the distance alone, even in k, largest (D / 2) at k = 0. The table lists, for
    some offsets k, that dot product averaged over every start p with p + k in range, its spread
    (max − min over p) and the value at −k. ``seed`` is unused (nothing is random).
    """
    from aiayn.layers import sinusoidal_encoding

    del seed
    d_model, positions = (32, 24) if quick else (512, 128)
    pe = sinusoidal_encoding(positions, d_model).double()  # (P, D)
    dots = pe @ pe.T  # (P, D) @ (D, P) -> (P, P)
    rows = _positional_rows(dots, d_model)
    plot = _plot_positional(pe, dots, out_dir)
    worst = max(r["spread_over_p"] for r in rows)
    asym = max(abs(r["dot"] - r["dot_at_minus_k"]) for r in rows)
    summary = (
        f"d_model = {d_model}, positions 0–{positions - 1}: PE(p)·PE(p + k) depends only on k "
        f"(largest spread over p: {worst:.2g}, float32 table) and is the same at −k (largest "
        f"difference {asym:.2g}); it is D/2 = {d_model // 2} at k = 0 and falls to "
        f"{rows[-1]['dot']:.1f} at k = {rows[-1]['distance']}."
    )
    title = "Sinusoidal positional encoding (§3.5): the table, and the dot product by distance"
    return _result("positional", title, rows, summary, plot, out_dir)


# -- registry ----------------------------------------------------------------------------------
ExperimentFunction = Callable[..., ExperimentResult]

EXPERIMENTS: dict[str, tuple[ExperimentFunction, str]] = {
    "scaling": (scaling_experiment, "why scale by √d_k: softmax entropy and gradient (§3.2.1)"),
    "additive": (additive_experiment, "dot-product vs additive attention: time, memory (§3.2.1)"),
    "multihead": (multihead_experiment, "8 heads of 64 vs 1 head of 512: params, time (§3.2.2)"),
    "positional": (positional_experiment, "sinusoidal encodings and their dot products (§3.5)"),
}
"""name -> (function, one-line description)."""


def run_experiment(
    name: str, out_dir: Path, *, quick: bool = False, seed: int = 0
) -> ExperimentResult:
    """Run the experiment ``name`` (a key of :data:`EXPERIMENTS`).

    Raises:
        UserError: an unknown name (the message lists the known ones).
    """
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {name!r}; choose from: {', '.join(EXPERIMENTS)}")
    function, _ = EXPERIMENTS[name]
    return function(Path(out_dir), quick=quick, seed=seed)
