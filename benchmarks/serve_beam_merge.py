"""Benchmark: how far `aiayn serve` should merge beam-search groups (the
``beam_merge_max_tokens`` setting), measured on the worker alone.

    python benchmarks/serve_beam_merge.py --translation CKPT [--clients 32,64] [--requests 384]
                                          [--bounds 0,2048,3072,4096,none] [--rounds 2]
                                          [--malloc kept|default]

Closed-loop clients in this process (each submits its next Multi30k test sentence as soon as
its answer comes; beam 4, at most 32 new tokens) feed the translation worker of a served
checkpoint (`aiayn.serving.DecodeEngine`, no HTTP: the worker's own throughput). For each
bound on the tokens merged beam groups may hold (0: no merging; none: as many as the worker's
budget allows) and each number of clients, sentences per second; the bounds interleaved within
each round. Every answer is checked against the first run's answer for its sentence. Writes
docs/results/serve_beam_merge.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, write_report
from aiayn.performance import keep_freed_memory
from aiayn.serving import ServeOptions, load_served_model
from aiayn.serving.metrics import Metrics
from aiayn.serving.schemas import TranslateRequest
from aiayn.settings import performance_settings
from serve_load import _lines


def _run(ckpt: Path, texts: list[str], clients: int, bound: int | None) -> tuple[float, list[str]]:
    """(sentences/s, each sentence's translation) with merges bounded by ``bound`` tokens."""
    cap = 1 << 40 if bound is None else bound  # 0: no two groups fit together
    with performance_settings(beam_merge_max_tokens=cap):
        task = load_served_model("mt", ckpt, ServeOptions(), Metrics()).tasks["translate"]
        answers: dict[int, str] = {}

        async def main() -> float:
            engine = task.engine
            engine.start()
            todo = list(enumerate(texts))

            async def client() -> None:
                while todo:
                    i, text = todo.pop(0)
                    job = task.prepare(TranslateRequest(texts=[text], beam=4, max_new_tokens=32))  # type: ignore[attr-defined]
                    engine.submit(job)
                    answers[i] = (await job.future).translations[0].text

            start = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            seconds = time.perf_counter() - start
            engine.stop()
            return seconds

        seconds = asyncio.run(main())
    return len(texts) / seconds, [answers[i] for i in range(len(texts))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--translation", type=Path, required=True)
    p.add_argument("--clients", default="32,64")
    p.add_argument("--requests", type=int, default=384)
    p.add_argument("--bounds", default="0,2048,3072,4096,none")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--name", default="serve_beam_merge")
    p.add_argument("--malloc", choices=("kept", "default"), default="kept",
                   help="kept: freed memory stays mapped (as aiayn serve sets it)")  # fmt: skip
    args = p.parse_args()
    if args.malloc == "kept":
        keep_freed_memory()
    load_start = os.getloadavg()[0]
    bounds = [None if b == "none" else int(b) for b in args.bounds.split(",")]
    texts = _lines("test_2016_flickr.en.gz")[: args.requests]
    rows: list[dict[str, Any]] = []
    expected: list[str] | None = None
    for r in range(args.rounds):
        for clients in (int(c) for c in args.clients.split(",")):
            for bound in bounds:
                rate, found = _run(args.translation, texts, clients, bound)
                expected = expected or found
                wrong = sum(a != b for a, b in zip(found, expected, strict=True))
                rows.append({"round": r + 1, "clients": clients, "bound": bound,
                             "sentences_per_s": rate, "load": os.getloadavg()[0],
                             "mismatches": wrong})  # fmt: skip
                print(rows[-1], flush=True)
    _report(args, rows, load_start)


def _report(args: argparse.Namespace, rows: list[dict[str, Any]], load_start: float) -> None:
    md = ["# aiayn serve: merging beam-search groups, the worker alone", "",
          f"Command: `{command_line()}`", "",
          f"Machine: {machine()['cpu']}, {os.cpu_count()} cores; load average (1 min) at the "
          f"start {load_start:.1f}, at the end {os.getloadavg()[0]:.1f}. Beam 4, "
          f"{args.requests} Multi30k test sentences per run, sentences/s; freed memory "
          f"{args.malloc} ({'kept mapped' if args.malloc == 'kept' else 'glibc default'}).", "",
          "| round | clients | merge bound (tokens) | sentences/s | load | mismatches |",
          "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        named = {None: "none (the worker's budget)", 0: "0 (no merging)"}
        bound = named.get(r["bound"], r["bound"])
        md.append(f"| {r['round']} | {r['clients']} | {bound} | {r['sentences_per_s']:.1f} | "
                  f"{r['load']:.2f} | {r['mismatches']} |")  # fmt: skip
    data = {"command": command_line(), "machine": machine(), "rows": rows}
    print(write_report(args.name, data, md))


if __name__ == "__main__":
    main()
