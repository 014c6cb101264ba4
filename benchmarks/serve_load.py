"""Benchmark: `aiayn serve` under concurrent clients, against the same server with batching off
and against offline decoding of the same inputs.

    python benchmarks/serve_load.py [--translation CKPT] [--lm CKPT] [--clients 1,8,32,64]
                                    [--requests 400] [--max-new-tokens 32] [--name serve_load]
                                    [--decode-workers 2 | 1,2,3] [--worker-rows 64,0]
                                    [--device auto]

Scenarios: a translation model (default: the `small` preset, random weights, a tokenizer
trained on Multi30k's English side; or `--translation`, e.g. a trained checkpoint) decoding
Multi30k test sentences greedily and with beam 4, and a GPT-2-architecture LM (default: the
`gpt2-tiny` preset, random weights; or `--lm`) continuing prefixes of the same sentences
greedily. Each request carries one sentence; every output is capped at `--max-new-tokens`.

For each scenario and each number of concurrent clients (async httpx clients, each sending its
next request as soon as it has its answer), `--requests` requests go to a fresh `aiayn serve`
process, with batching (with each `--decode-workers` count given, default: the server's; and
with each `--worker-rows` given, the `serve_worker_rows` setting by which the decode workers fill
in order, 0 = any worker takes any request; default: the server's) and with `--no-batching`
(one request at a time). Reported: throughput
(sentences/s and output tokens/s), p50 and p99 latency, errors, and mismatches against the
offline answer of each input; and the offline throughput of the same inputs (`translate_ids` /
`generate_ids` in this process, all inputs at once: the ceiling; and, for each number of
clients N, N consecutive inputs per call: the ceiling with N requests in flight). The servers
and the offline decoding run on the same `--device` (`auto`: a GPU where there is one). Writes
docs/results/NAME.md and results/NAME.json.gz.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, write_report
from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer, save_checkpoint
from aiayn.config import preset
from aiayn.data import Tokenizer, normalize
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate_ids
from aiayn.decoding.generate import continuation
from aiayn.decoding.translate import options_for_checkpoint, translate_ids
from aiayn.models import Transformer
from aiayn.models.gpt2 import GPT2, GPT2_PRESETS
from aiayn.serving import ServeOptions
from aiayn.validation import device_flag, resolve_device

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def _lines(name: str) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def _build(folder: Path) -> tuple[Path, Path]:
    """Random-weight `small` translation model and `gpt2-tiny` LM with a Multi30k tokenizer."""
    tokenizer = Tokenizer.train(_lines("train.en.gz"), 8000)
    tokenizer.save(folder / "tok.json")
    torch.manual_seed(0)
    mt = Transformer(preset("small", vocab_size=tokenizer.vocab_size))
    base = GPT2_PRESETS["gpt2-tiny"]
    lm_config = type(base)(**{**base.__dict__, "vocab_size": tokenizer.vocab_size,
                              "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id,
                              "pad_id": tokenizer.pad_id})  # fmt: skip
    lm = GPT2(lm_config)
    return (
        save_checkpoint(folder / "mt", mt.eval(), {"step": 0}, folder / "tok.json"),
        save_checkpoint(folder / "lm", lm.eval(), {"step": 0}, folder / "tok.json"),
    )


def _best_of_two(run: Callable[[], list[Any]]) -> tuple[list[Any], float, float]:
    """(what ``run`` returns, the faster of two timed passes, that pass's CPU seconds over all
    of this process's threads): the first pass also pays first-call costs (allocations of new
    shapes, a kernel build), which are not throughput. No server runs while it is timed, so
    the CPU seconds are the decoding's own."""
    passes = []
    for _ in range(2):
        start, cpu = time.perf_counter(), time.process_time()
        found = run()
        passes.append((time.perf_counter() - start, time.process_time() - cpu))
    seconds, cpu_seconds = min(passes)
    return found, seconds, cpu_seconds


def _offline(
    kind: str, ckpt: Path, inputs: list[str], cap: int, device: str, at_a_time: int | None = None
) -> tuple[list[str], float, float, int]:
    """(each input's answer, seconds, CPU seconds, output tokens) on ``device``: all inputs at
    once (the library's own batching), or ``at_a_time`` consecutive inputs per call (what that
    many clients can have in flight)."""
    chunk = at_a_time or len(inputs)
    calls = [slice(i, i + chunk) for i in range(0, len(inputs), chunk)]
    if kind == "generate":
        c = load_checkpoint(ckpt, expect=GPT2)
        c.model.to(device)
        tok = load_lm_tokenizer(c.tokenizer_path)
        ids = [tok.encode(p) or [c.model.config.bos_id] for p in inputs]
        options = GenerateOptions(max_new_tokens=cap, batch_size=64)
        found, seconds, cpu = _best_of_two(lambda: [
            h for part in calls for h in generate_ids(c.model, ids[part], options)
        ])  # fmt: skip
        news = [h[0].tokens for h in found]
        texts = [continuation(tok, p, n) for p, n in zip(ids, news, strict=True)]
        return texts, seconds, cpu, sum(map(len, news))
    c = load_checkpoint(ckpt)
    c.model.to(device)
    tok = load_translation_tokenizer(c.path)
    beam = 4 if kind == "beam4" else 1
    o = options_for_checkpoint(c.state.get("generation"), beam_size=beam, max_new_tokens=cap)
    ids = tok.encode_batch([normalize(t) for t in inputs])
    found, seconds, cpu = _best_of_two(
        lambda: [h for part in calls for h in translate_ids(c.model, ids[part], tok, o)]
    )
    best = [h[0].tokens for h in found]
    return tok.decode_batch(best), seconds, cpu, sum(map(len, best))


def _request(kind: str, text: str, cap: int) -> tuple[str, dict[str, Any]]:
    if kind == "generate":
        return "/v1/completions", {"prompt": text, "max_tokens": cap}
    return "/v1/translate", {"texts": [text], "beam": 4 if kind == "beam4" else 1,
                             "max_new_tokens": cap}  # fmt: skip


def _answer(kind: str, body: dict[str, Any]) -> tuple[str, int]:
    """(the text, output tokens when the answer says)."""
    if kind == "generate":
        return body["choices"][0]["text"], body["usage"]["completion_tokens"]
    return body["translations"][0]["text"], 0


async def _load(base: str, kind: str, inputs: list[str], clients: int, cap: int) -> dict[str, Any]:
    """``len(inputs)`` requests from ``clients`` concurrent clients."""
    todo = list(enumerate(inputs))
    latencies: list[float] = []
    answers: dict[int, str] = {}
    errors, tokens = 0, 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal errors, tokens
        while todo:
            i, text = todo.pop()
            path, body = _request(kind, text, cap)
            start = time.perf_counter()
            try:
                r = await http.post(base + path, json=body)
            except httpx.HTTPError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - start)
            if r.status_code != 200:
                errors += 1
                continue
            answers[i], n = _answer(kind, r.json())
            tokens += n

    # each client its own connection pool of one, made before the clock starts: a shared pool
    # of N connections scans all of them for every request it assigns (httpcore), and at 64
    # clients that scan took the clients more CPU than the server spent
    async with contextlib.AsyncExitStack() as stack:
        one = httpx.Limits(max_connections=1)
        pools = [
            await stack.enter_async_context(httpx.AsyncClient(timeout=600, limits=one))
            for _ in range(clients)
        ]
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for http in pools))
        wall = time.perf_counter() - start
    return {"wall": wall, "latencies": latencies, "answers": answers, "errors": errors,
            "tokens": tokens}  # fmt: skip


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its threads so far (Linux /proc; None
    elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _timed_load(proc: subprocess.Popen[bytes], base: str, kind: str, inputs: list[str],
                clients: int, cap: int) -> dict[str, Any]:  # fmt: skip
    """:func:`_load`, with the CPU seconds the clients (this process) and the server spent."""
    server, client = _cpu_seconds(proc.pid), time.process_time()
    run = asyncio.run(_load(base, kind, inputs, clients, cap))
    run["client_cpu_s"] = time.process_time() - client
    after = _cpu_seconds(proc.pid)
    run["server_cpu_s"] = None if server is None or after is None else after - server
    return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(
    ckpt: Path,
    device: str,
    workers: int | None,
    threads: int | None = None,
    worker_rows: int | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """A server of ``ckpt`` on ``device`` with ``workers`` decode workers (None: batching
    off), on ``threads`` CPU threads (None: torch's default), its workers filling in order up
    to ``worker_rows`` rows (None: the setting's default)."""
    port = _free_port()
    argv = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(ckpt), "--port",
            str(port), "--queue-size", "4096", "--timeout-s", "3600",
            "--device", device]  # fmt: skip
    argv += ["--no-batching"] if workers is None else ["--decode-workers", str(workers)]
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if worker_rows is not None:
        env["AIAYN_SERVE_WORKER_ROWS"] = str(worker_rows)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("aiayn serve did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)


def _row(kind: str, clients: int, mode: str, run: dict[str, Any], expected: list[str],
         offline_tokens: int) -> dict[str, Any]:  # fmt: skip
    lat = np.array(run["latencies"]) if run["latencies"] else np.array([np.nan])
    n = len(expected)
    mismatches = sum(run["answers"].get(i) != t for i, t in enumerate(expected))
    tokens = run["tokens"] or offline_tokens  # translations: the offline count (same outputs)
    return {
        "scenario": kind, "clients": clients, "mode": mode, "requests": n,
        "sentences_per_s": n / run["wall"], "tokens_per_s": tokens / run["wall"],
        "p50_ms": float(np.percentile(lat, 50) * 1000),
        "p99_ms": float(np.percentile(lat, 99) * 1000),
        "errors": run["errors"], "mismatches": mismatches,
        "client_cpu_s": run["client_cpu_s"], "server_cpu_s": run["server_cpu_s"],
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--translation", type=Path)
    p.add_argument("--lm", type=Path)
    p.add_argument("--clients", default="1,8,32,64")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--scenarios", default="greedy,beam4,generate")
    p.add_argument("--name", default="serve_load")
    p.add_argument(
        "--decode-workers",
        default=str(ServeOptions().decode_workers),
        help="decode workers of the batched server; several (1,2) compare them",
    )
    p.add_argument(
        "--worker-rows",
        default="",
        help="serve_worker_rows of the batched server (several, e.g. 64,0, compare them; "
        "0: any decode worker takes any request); default: the setting's",
    )
    p.add_argument(
        "--device",
        type=device_flag,
        default="auto",
        help="where the servers and the offline decoding run: auto, cpu, cuda[:N]",
    )
    args = p.parse_args()
    args.device = str(resolve_device(args.device))
    args.decode_workers = [int(w) for w in args.decode_workers.split(",")]
    args.worker_rows = [int(r) for r in args.worker_rows.split(",")] if args.worker_rows else [None]
    args.load_start = os.getloadavg()[0]
    clients = [int(c) for c in args.clients.split(",")]
    inputs = _lines("test_2016_flickr.en.gz")
    inputs = (inputs * (args.requests // len(inputs) + 1))[: args.requests]
    with tempfile.TemporaryDirectory() as tmp:
        mt, lm = args.translation, args.lm
        if mt is None or lm is None:
            built_mt, built_lm = _build(Path(tmp))
            mt, lm = mt or built_mt, lm or built_lm
        rows = _measure(args, clients, inputs, {"greedy": mt, "beam4": mt, "generate": lm})
    _report(args, rows)


def _measure(args: argparse.Namespace, clients: list[int], inputs: list[str],
             ckpts: dict[str, Path]) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for kind in args.scenarios.split(","):
        prompts = [" ".join(t.split()[:4]) for t in inputs] if kind == "generate" else inputs
        expected, seconds, cpu, tokens = _offline(
            kind, ckpts[kind], prompts, args.max_new_tokens, args.device
        )
        rows.append(_offline_row(kind, 0, len(prompts), seconds, cpu, tokens))
        for n in clients:  # the ceiling at n requests in flight: n inputs per call
            found, at_n, cpu_n, n_tokens = _offline(
                kind, ckpts[kind], prompts, args.max_new_tokens, args.device, n
            )
            assert found == expected, "offline answers depend on the batch"
            rows.append(_offline_row(kind, n, len(prompts), at_n, cpu_n, n_tokens))
        # the unbatched baseline at its best: one request's small operations can run faster
        # on one thread than split over all of them, so it runs both ways
        batched = [(w, None, r) for w in args.decode_workers for r in args.worker_rows]
        for workers, threads, fill in [*batched, (None, None, None), (None, 1, None)]:
            proc, base = _serve(ckpts[kind], args.device, workers, threads, fill)
            try:  # a few requests first, not measured: first-call costs stay out of the rows
                asyncio.run(_load(base, kind, prompts[:8], 4, args.max_new_tokens))
                for n in clients:
                    run = _timed_load(proc, base, kind, prompts, n, args.max_new_tokens)
                    mode = _mode(args, workers, threads, fill)
                    rows.append(_row(kind, n, mode, run, expected, tokens))
                    print(rows[-1], flush=True)
            finally:
                _stop(proc)
    return rows


def _mode(args: argparse.Namespace, workers: int | None, threads: int | None = None,
          rows: int | None = None) -> str:  # fmt: skip
    """A served row's mode: batched (naming its decode workers and worker rows where several
    run), or unbatched (naming its threads when not torch's default)."""
    if workers is None:
        return "unbatched" if threads is None else f"unbatched, {threads} thread(s)"
    mode = "batched" if len(args.decode_workers) == 1 else f"batched, {workers} decode workers"
    return mode if len(args.worker_rows) == 1 else f"{mode}, worker rows {rows}"


def _offline_row(kind: str, at_a_time: int, n: int, seconds: float, cpu: float,
                 tokens: int) -> dict[str, Any]:  # fmt: skip
    """An offline row: no clients, and the decoding's own CPU seconds in the server's column
    (what a server would spend per request if serving cost nothing beyond decoding)."""
    mode = f"offline, {at_a_time} at a time" if at_a_time else "offline"
    return {"scenario": kind, "clients": 0, "mode": mode, "requests": n,
            "sentences_per_s": n / seconds, "tokens_per_s": tokens / seconds,
            "p50_ms": None, "p99_ms": None, "errors": 0, "mismatches": 0,
            "client_cpu_s": 0.0, "server_cpu_s": cpu}  # fmt: skip


def _cpu_text(row: dict[str, Any]) -> str:
    """The clients' share of the CPU seconds spent, and the server's CPU ms per request."""
    client, server = row.get("client_cpu_s"), row.get("server_cpu_s")
    if client is None or server is None or client + server <= 0:
        return " | "
    return f"{client / (client + server):.0%} | {server * 1000 / row['requests']:.1f}"


def _report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    info = machine()
    gpu = f", {info['gpu']}" if args.device.startswith("cuda") else ""
    md = [
        "# aiayn serve under load",
        "",
        f"Command: `{command_line()}`",
        "",
        f"Machine: {info['cpu']}, {os.cpu_count()} cores{gpu}; servers and "
        f"offline decoding on {args.device}; load average (1 min) at the start "
        f"{args.load_start:.1f}, at the end {os.getloadavg()[0]:.1f}.",
        "",
        "| scenario | clients | mode | sentences/s | tokens/s | p50 ms | p99 ms | errors "
        "| mismatches | clients' CPU share | server CPU ms per request (offline: decoding's) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p50 = "" if r["p50_ms"] is None else f"{r['p50_ms']:.0f}"
        p99 = "" if r["p99_ms"] is None else f"{r['p99_ms']:.0f}"
        md.append(f"| {r['scenario']} | {r['clients'] or ''} | {r['mode']} | "
                  f"{r['sentences_per_s']:.1f} | {r['tokens_per_s']:.0f} | {p50} | {p99} | "
                  f"{r['errors']} | {r['mismatches']} | {_cpu_text(r)} |")  # fmt: skip
    served = [r for r in rows if not r["mode"].startswith("offline")]
    total = {k: sum(r[k] for r in served) for k in ("requests", "errors", "mismatches")}
    md += ["", f"Requests served in this run: {total['requests']:,}; errors {total['errors']}, "
           f"mismatches {total['mismatches']}.", "",
           "The clients run in this benchmark's process, on the same cores as the server: "
           "their share of the CPU seconds spent during a load is CPU the server did not "
           "have."]  # fmt: skip
    data = {"command": command_line(), "machine": info, "device": args.device, "rows": rows}
    print(write_report(args.name, data, md))


if __name__ == "__main__":
    main()
