"""Benchmark: greedy search's choice of the next token on CPU, and its loop's own cost.

    python benchmarks/greedy_argmax.py [--threads 2] [--repeats 300] [--chunks 128,256,512,1024]
    python benchmarks/greedy_argmax.py --loop-only [--steps 64] [--loop-baseline PATH]

Times, interleaved round by round (``_common.time_interleaved``), on rows of log-probabilities:

- the shapes of a greedy step (1, 4, 32 and 128 rows of OPUS-MT's 58,101 tokens; one row of
  T5's 32,128 and GPT-2's 50,257): ``torch.argmax(x, -1)``, ``torch.amax(x, -1)`` (a vectorised
  pass over the same elements, the floor), :func:`~aiayn.decoding.argmax.first_argmax` with the
  settings in force and :func:`~aiayn.decoding.argmax.chunked_argmax` at each of ``--chunks``:
  what sets :attr:`~aiayn.settings.PerformanceSettings.argmax_chunk`;
- shorter rows, ``torch.argmax`` against ``chunked_argmax``: the row length from which the
  chunked search wins sets :attr:`~aiayn.settings.PerformanceSettings.chunked_argmax_min_vocab`;
- :func:`~aiayn.decoding.greedy.greedy_search` over a step function that returns the same
  (B, 16) log-probabilities each time (no sentence ends before its limit of ``--steps``
  tokens), so that only the loop's own work is timed: µs per step; with ``--loop-baseline
  PATH``, also (interleaved) the ``greedy_search`` of another checkout's
  ``src/aiayn/decoding/greedy.py`` at PATH, loaded as a module of its own (it imports the rest
  of aiayn from this checkout). ``--loop-only`` times this part alone.

Medians in µs (min–max in brackets for the step shapes). Writes
docs/results/greedy_argmax.md and results/greedy_argmax.json.gz (not with ``--loop-only``, which
only prints).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, fmt, machine, spread, time_interleaved, write_report

STEP_SHAPES = ((1, 58101), (4, 58101), (32, 58101), (128, 58101), (1, 32128), (1, 50257))
SMALL_SHAPES = tuple((b, v) for v in (2048, 4096, 8192, 16384, 24576) for b in (1, 4, 32))
LOOP_ROWS = (1, 32)


def _log_probs(rows: int, vocab: int) -> Tensor:
    torch.manual_seed(0)
    return torch.randn(rows, vocab).log_softmax(dim=-1)


def _argmaxes(x: Tensor, chunks: list[int]) -> dict[str, Callable[[], object]]:
    """The calls timed on one input: argmax, amax, first_argmax, chunked_argmax per chunk."""
    from aiayn.decoding.argmax import chunked_argmax, first_argmax

    def chunked(c: int) -> Callable[[], object]:
        return lambda: chunked_argmax(x, c)

    return {
        "torch.argmax": lambda: torch.argmax(x, dim=-1),
        "torch.amax": lambda: torch.amax(x, dim=-1),
        "first_argmax": lambda: first_argmax(x),
        **{f"chunk {c}": chunked(c) for c in chunks},
    }


def step_shapes(chunks: list[int], repeats: int) -> tuple[list[dict[str, Any]], list[str]]:
    """argmax, amax, first_argmax and chunked_argmax per chunk at each step shape."""
    results, lines = [], []
    for rows, vocab in STEP_SHAPES:
        x = _log_probs(rows, vocab)
        fns = _argmaxes(x, chunks)
        for name, fn in fns.items():
            assert name == "torch.amax" or torch.equal(fn(), x.argmax(-1)), name  # type: ignore[arg-type]
        n = max(20, repeats // max(1, rows // 8))
        with torch.inference_mode():  # as greedy search runs
            stats = {k: spread(v) for k, v in time_interleaved(fns, n).items()}
        ratio = stats["torch.argmax"]["median"] / stats["first_argmax"]["median"]
        results.append({"rows": rows, "vocab": vocab, "repeats": n, **stats})
        cells = " | ".join(fmt(s, 1e6, 1) for s in stats.values())
        lines.append(f"| ({rows}, {vocab:,}) | {cells} | {ratio:.2f}× |")
        print(lines[-1], flush=True)
    return results, lines


def small_shapes(chunk: int, repeats: int) -> tuple[list[dict[str, Any]], list[str]]:
    """torch.argmax against chunked_argmax on rows of a few thousand elements."""
    results, lines = [], []
    for rows, vocab in SMALL_SHAPES:
        every = _argmaxes(_log_probs(rows, vocab), [chunk])
        fns = {"torch.argmax": every["torch.argmax"], "chunked": every[f"chunk {chunk}"]}
        with torch.inference_mode():
            med = {k: statistics.median(v) * 1e6 for k, v in time_interleaved(fns, repeats).items()}
        results.append({"rows": rows, "vocab": vocab, **med})
        lines.append(
            f"| ({rows}, {vocab:,}) | {rows * vocab:,} | {med['torch.argmax']:,.1f} | "
            f"{med['chunked']:,.1f} | {med['torch.argmax'] / med['chunked']:.2f}× |"
        )
        print(lines[-1], flush=True)
    return results, lines


def _load_greedy(path: str | None) -> Callable[..., list[list[int]]]:
    """greedy_search of this checkout, or of the greedy.py at ``path``."""
    if path is None:
        from aiayn.decoding import greedy_search

        return greedy_search
    spec = importlib.util.spec_from_file_location("baseline_greedy", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    greedy: Callable[..., list[list[int]]] = module.greedy_search
    return greedy


def _greedy(rows: int, steps: int, path: str | None) -> Callable[[], list[list[int]]]:
    """greedy_search (this checkout's, or the greedy.py at ``path``) of ``rows`` sentences over a
    step function that returns the same log-probabilities every time: token 7, never EOS, so
    every sentence runs to ``steps``."""
    greedy_search = _load_greedy(path)
    log_probs = torch.full((rows, 16), -5.0)  # (B, V)
    log_probs[:, 7] = -0.1

    def step(tokens: Tensor, state: Any) -> tuple[Tensor, Any]:
        return log_probs, state

    state: Any = None  # never looked at
    return lambda: greedy_search(step, state, bos_id=1, eos_id=2, max_len=steps, batch_size=rows)


def loop_cost(
    steps: int, repeats: int, baseline: str | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """µs per step of greedy_search's loop (and the baseline's) over a step that does nothing."""
    results, lines = [], []
    for rows in LOOP_ROWS:
        fns = {"this checkout": _greedy(rows, steps, None)}
        if baseline is not None:
            fns["baseline"] = _greedy(rows, steps, baseline)
        for run in fns.values():
            assert run() == [[7] * steps] * rows
        per_step = {
            k: statistics.median(v) / steps * 1e6
            for k, v in time_interleaved(fns, repeats).items()  # type: ignore[arg-type]
        }
        results.append({"rows": rows, "steps": steps, "us_per_step": per_step})
        cells = " | ".join(f"{v:.2f}" for v in per_step.values())
        lines.append(f"| {rows} | {steps} | {cells} |")
        print(lines[-1], flush=True)
    return results, lines


def _loads(loads: tuple[float, float, float]) -> str:
    return " ".join(f"{v:.2f}" for v in loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--chunks", default="128,256,512,1024")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--loop-only", action="store_true")
    parser.add_argument("--loop-baseline", help="another checkout's decoding/greedy.py")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()  # the machine may be shared: what else ran
    loop, loop_lines = loop_cost(args.steps, max(20, args.repeats // 10), args.loop_baseline)
    if args.loop_only:
        return
    from aiayn.settings import performance

    settings = performance()
    chunks = [int(c) for c in args.chunks.split(",")]
    steps, step_lines = step_shapes(chunks, args.repeats)
    small, small_lines = small_shapes(settings.argmax_chunk, args.repeats)
    info = machine()
    load = {"before": load_before, "after": os.getloadavg()}
    names = ["torch.argmax", "torch.amax", "first_argmax", *(f"chunk {c}" for c in chunks)]
    md = [
        "# Greedy search's argmax on CPU (µs per call: median (min–max))",
        "",
        f"`{command_line()}` — {info['cpu']}, {info['torch_threads']} threads, torch "
        f"{info['torch']}; first_argmax with argmax_chunk={settings.argmax_chunk}, "
        f"chunked_argmax_min_vocab={settings.chunked_argmax_min_vocab:,}; load average (1, 5, "
        f"15 min) {_loads(load['before'])} before, {_loads(load['after'])} after",
        "",
        f"| shape | {' | '.join(names)} | argmax ÷ first_argmax |",
        "|---|" + "---:|" * (len(names) + 1),
        *step_lines,
        "",
        f"Shorter rows (medians), chunked_argmax at chunk {settings.argmax_chunk}:",
        "",
        "| shape | elements | torch.argmax | chunked | argmax ÷ chunked |",
        "|---|---:|---:|---:|---:|",
        *small_lines,
        "",
        "greedy_search's loop over a step that does nothing (µs per step; baseline: "
        f"{args.loop_baseline or 'none'}):",
        "",
        "| rows | steps | µs per step |" + (" baseline |" if args.loop_baseline else ""),
        "|---:|---:|---:|" + ("---:|" if args.loop_baseline else ""),
        *loop_lines,
    ]
    data = {"machine": info, "load_average": load, "steps": steps, "small": small, "loop": loop}
    print(write_report("greedy_argmax", data, md))


if __name__ == "__main__":
    main()
