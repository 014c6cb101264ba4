"""Helpers shared by the benchmarks: machine description, matmul peak, statistics, reports."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def matmul_peak(device: str = "cpu", dtype: torch.dtype = torch.float32, repeats: int = 7) -> float:
    """Measured matmul throughput in FLOP/s: the median of ``repeats`` square products.

    n = 2048 on CPU (fp32), 8192 on CUDA; 2·n³ FLOPs per product.
    """
    n = 8192 if device.startswith("cuda") else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    times = []
    for i in range(repeats + 2):
        sync(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        sync(device)
        if i >= 2:  # two warm-up products
            times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def sync(device: str | torch.device) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Wall times of ``repeats`` calls of each function, taken in rounds (one call of each per
    round, after one warm-up call of each), so that all of them meet the same machine: this
    VM's memory bandwidth drifts by tens of percent over minutes."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def fmt(s: dict[str, float], scale: float = 1.0, digits: int = 0) -> str:
    """ "median (min–max)" of :func:`spread`, scaled."""
    m, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    return f"{m:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def command_line() -> str:
    """The command that is running, as one would type it again."""
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):  # a script outside the repository: keep its path
        script = script.resolve().relative_to(ROOT)
    return " ".join(["python", shlex.quote(str(script)), *map(shlex.quote, sys.argv[1:])])


def write_report(name: str, data: dict[str, Any], markdown: list[str]) -> Path:
    """docs/results/NAME.json and NAME.md; returns the Markdown path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(markdown) + "\n", encoding="utf-8")
    return path
