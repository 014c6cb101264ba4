"""Benchmark: decoding speed of aiayn against Hugging Face `MarianMTModel.generate`.

    python benchmarks/decode_vs_hf.py [--preset base] [--threads 2] [--out-len 64]

Same architecture (post-norm encoder–decoder, ReLU, sinusoidal positions, shared and tied
embeddings), same sizes and vocabulary, random weights, the same source batches, every output
forced to exactly `--out-len` tokens (EOS forbidden before, forced at the end) so both do the same
work. Reports output tokens/s, the ratio aiayn / HF, and aiayn's KV-cache speed-up over
recomputing the whole prefix at every step. Medians of `--repeats` runs, min and max kept; the
contenders of one configuration are timed in interleaved rounds, so all meet the same machine.
aiayn decodes as `aiayn translate` does on CPU: the flattened `InferenceStep` over
packed linear layers (aiayn's fp32 kernel for a few rows, oneDNN's beyond). It is also timed
with the step made of the model's modules (`encoder_decoder_step`, same packed layers: "module
step") and with PyTorch's own `F.linear` (MKL), the kernels HF uses.

At batch 1 (a decoding step reads every decoder weight for a few rows), three floors bound
what a decoder could reach: the time aiayn's decode spends inside its linear layers (timed in a
separate pass), the step's linear layers alone, called in step order with nothing between them
("linears only"), and a plain read of the same weights (`Tensor.sum`, "read only"). HF's time
per token over a floor is the highest ratio a decoder with no other cost could reach: with
these kernels as they run inside a decode, with these kernels back to back, or reading the
weights at that speed. Also at batch 1, aiayn is timed with the other
choice of `pack_for_inference`'s rule for small products (`dense_small`: products of up to
2^18 multiply–adds on PyTorch's kernel or on oneDNN's), against the automatic choice.

Both run in this one process with the same allocator setting (glibc keeps freed memory, as
`aiayn translate` sets it on CPU). A separate pass times every `F.linear` call of each (both
are made of them, aiayn here with PyTorch's linears): "in F.linear" is the share of the wall
time spent inside them, and "HF / aiayn's F.linear time" the HF time over that time, the
highest ratio an fp32 implementation with PyTorch's linear kernels could reach.
Writes docs/results/decode_vs_hf_PRESET.md and results/decode_vs_hf_PRESET.json.gz.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, spread, time_interleaved, write_report
from aiayn.config import preset
from aiayn.decoding import (
    beam_search,
    encoder_decoder_step,
    greedy_search,
    inference_step,
)
from aiayn.decoding.step import DecoderState
from aiayn.inference import pack_for_inference
from aiayn.inference.kernels import LinearKernel
from aiayn.inference.packed import step_weights_stay_in_cache
from aiayn.models import Transformer
from aiayn.performance import keep_freed_memory

PAD, BOS, EOS = 0, 1, 2


def hf_model(model: Transformer):  # type: ignore[no-untyped-def]
    """A MarianMTModel of the same configuration (weights random, not copied)."""
    from transformers import MarianConfig, MarianMTModel

    c = model.config
    config = MarianConfig(
        vocab_size=c.vocab_size,
        decoder_vocab_size=c.vocab_size,
        d_model=c.d_model,
        encoder_layers=c.num_encoder_layers,
        decoder_layers=c.num_decoder_layers,
        encoder_attention_heads=c.num_heads,
        decoder_attention_heads=c.num_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function="relu",
        max_position_embeddings=1024,
        scale_embedding=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    return MarianMTModel(config).eval()


def search_name(beam: int) -> str:
    """How the tables name a search: "greedy" or "beam K"."""
    return "greedy" if beam == 1 else f"beam {beam}"


def time_it(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall times of ``repeats`` calls after one warm-up call."""
    return time_interleaved({"": fn}, repeats)[""]


def share_inside(fn: Callable[[], object], owner: object, *names: str) -> float:
    """The share of one call of ``fn``'s wall time spent inside ``owner.name`` for the given
    names (functions of a module, or methods of a class), timed by wrapping them for that call."""
    spent = 0.0
    originals = {name: getattr(owner, name) for name in names}

    def timing(original: Callable) -> Callable:  # type: ignore[type-arg]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal spent
            start = time.perf_counter()
            out = original(*args, **kwargs)
            spent += time.perf_counter() - start
            return out

        return timed

    for name, original in originals.items():
        setattr(owner, name, timing(original))
    try:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    finally:
        for name, original in originals.items():
            setattr(owner, name, original)
    return spent / wall


def step_linears(
    packed: Transformer, plain: Transformer, rows: int
) -> list[tuple[Callable[[], object], Tensor]]:
    """The linear-layer calls of one decoding step over ``rows`` decoder rows, in step order,
    each with the weight it reads (from the unpacked model). The cross-attention keys/values are
    projected once per source, so they are not among them; the output projection is."""
    c = packed.config
    x = torch.randn(rows, 1, c.d_model)  # (rows, 1, D)
    h = torch.randn(rows, 1, c.d_ff)  # (rows, 1, d_ff)
    query = slice(0, c.d_model)
    calls: list[tuple[Callable[[], object], Tensor]] = []
    for ours, dense in zip(packed.decoder.layers, plain.decoder.layers, strict=True):
        sa, ca, ff = ours.self_attn, ours.cross_attn, ours.feed_forward
        w_sa, w_ca, w_ff = dense.self_attn, dense.cross_attn, dense.feed_forward
        calls += [
            (partial(sa.in_proj, x), w_sa.in_proj.weight),  # (rows, 1, D) -> (rows, 1, 3D)
            (partial(sa.out_proj, x), w_sa.out_proj.weight),
            (partial(ca._proj, x, query), w_ca.in_proj.weight[query]),  # queries only
            (partial(ca.out_proj, x), w_ca.out_proj.weight),
            (partial(ff.linear1, x), w_ff.linear1.weight),  # -> (rows, 1, d_ff)
            (partial(ff.linear2, h), w_ff.linear2.weight),  # (rows, 1, d_ff) -> (rows, 1, D)
        ]
    calls.append((partial(packed.output_proj, x), plain.output_proj.weight))  # -> (rows, 1, V)
    return [(call, weight.detach()) for call, weight in calls]


def no_cache_step(model: Transformer, src: torch.Tensor):  # type: ignore[no-untyped-def]
    """A step function that re-runs the decoder over the whole prefix (no KV cache)."""
    src_mask = model.source_mask(src)
    memory = model.encode(src).memory

    class Prefix:
        def __init__(self, tokens: torch.Tensor):
            self.tokens = tokens

        def index_select(self, index: torch.Tensor) -> Prefix:
            return Prefix(self.tokens.index_select(0, index))

        def repeat_interleave(self, repeats: int) -> Prefix:
            raise NotImplementedError("used for greedy search only")

    def step(tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        assert isinstance(state, Prefix)
        prefix = torch.cat([state.tokens, tokens], dim=1)  # (B, t + 1)
        hidden = model.decode(prefix, memory, src_mask).hidden  # (B, t + 1, D)
        return model.log_probs(hidden[:, -1]), Prefix(prefix)

    return step, Prefix(torch.zeros(src.size(0), 0, dtype=torch.long))


def add_floors(
    row: dict,
    packed: Transformer,
    plain: Transformer,
    decoder_rows: int,
    hf_s_per_token: float,
    decode: Callable[[], object],
) -> None:
    """Record the batch-1 floors (seconds per token) and the ratios over HF they allow: the
    time ``decode`` (one decode of ``row["out_len"]`` tokens) spends in its linear layers, the
    step's linear layers alone over ``decoder_rows`` rows (the beam size), and a plain read of
    their weights."""
    row["in_linears_share"] = share_inside(decode, LinearKernel, "__call__", "activated", "add")
    row["in_linears_s"] = row["in_linears_share"] / row["aiayn_tok_s"]  # batch 1
    calls, weights = zip(*step_linears(packed, plain, decoder_rows), strict=True)
    row["weight_mb"] = sum(w.numel() * w.element_size() for w in weights) / 1e6
    row["floor_linears_s"] = statistics.median(time_it(lambda: [c() for c in calls], 30))
    row["floor_read_s"] = statistics.median(time_it(lambda: [w.sum() for w in weights], 30))
    row["ceiling_in_linears"] = hf_s_per_token / row["in_linears_s"]
    row["ceiling_linears"] = hf_s_per_token / row["floor_linears_s"]
    row["ceiling_read"] = hf_s_per_token / row["floor_read_s"]


@torch.inference_mode()
def main() -> None:
    """Run every configuration and write the tables."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # for both: they share this process
    torch.manual_seed(0)
    plain = Transformer(preset(args.preset, vocab_size=args.vocab_size, dropout=0.0)).eval()
    ours = pack_for_inference(plain)  # as `aiayn translate` decodes on CPU
    dense_small = step_weights_stay_in_cache(plain)  # pack_for_inference's default
    other_rule = pack_for_inference(plain, dense_small=not dense_small)
    theirs = hf_model(plain)
    n = args.out_len
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        src = torch.randint(3, args.vocab_size, (batch, args.src_len))
        src[:, -1] = EOS
        for beam in (1, 4):
            run_ours, run_hf = decoders(ours, theirs, src, beam, n)
            out = run_ours()
            lengths = {len(x) if beam == 1 else len(x[0].tokens) for x in out}
            assert lengths == {n}, lengths  # forced length reached
            times = time_contenders(run_ours, run_hf, plain, other_rule, batch, args.repeats)
            row = speed_row(times, batch, beam, n)
            row.update(linear_shares(row, run_ours, run_hf, plain))
            if beam == 1:
                row["cache_speedup"] = no_cache_seconds(run_ours, src) / row["aiayn_s"]["median"]
            if batch == 1:
                add_floors(row, ours, plain, beam, row["hf_s"]["median"] / n, run_ours)
                other = statistics.median(times["other_rule"])
                row["dense_small"] = dense_small
                row["other_rule_tok_s"] = n / other
            rows.append(row)
            print(json.dumps(row), flush=True)
    import transformers

    report = {
        "command": command_line(),
        "machine": machine(),
        "transformers": transformers.__version__,
        "model": f"{args.preset} (d_model {ours.config.d_model}, "
        f"{ours.config.num_encoder_layers}+{ours.config.num_decoder_layers} layers), "
        f"vocab {args.vocab_size}, source length {args.src_len}",
        "allocator": "glibc keeps freed memory (both)",
        "rows": rows,
    }
    lines = speed_lines(rows) + floor_lines(rows)
    write_report(f"decode_vs_hf_{args.preset}", report, lines)
    print("\n".join(lines))


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--src-len", type=int, default=24)
    parser.add_argument("--out-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", default="1,32")
    return parser.parse_args()


def decoders(
    ours: Transformer, theirs: Any, src: Tensor, beam: int, n: int
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """aiayn's decode of ``src`` (parts swappable) and HF's, both forced to ``n`` tokens."""

    def run_ours(step_fn=inference_step, beam=beam, src=src, model=ours):  # type: ignore[no-untyped-def]
        step, state = step_fn(model, src)
        if beam == 1:
            return greedy_search(
                step,
                state,
                bos_id=BOS,
                eos_id=EOS,
                max_len=n,
                min_len=n,
                batch_size=src.size(0),
            )
        return beam_search(
            step,
            state,
            batch_size=src.size(0),
            beam_size=beam,
            bos_id=BOS,
            eos_id=EOS,
            max_len=n,
            min_len=n,
            alpha=0.6,
        )

    def run_hf(beam=beam, src=src):  # type: ignore[no-untyped-def]
        return theirs.generate(
            input_ids=src,
            attention_mask=(src != PAD).long(),
            num_beams=beam,
            do_sample=False,
            min_new_tokens=n + 1,
            max_new_tokens=n + 1,
            length_penalty=0.6,
            early_stopping=True,
            use_cache=True,
        )

    return run_ours, run_hf


def time_contenders(
    run_ours: Callable[..., Any],
    run_hf: Callable[..., Any],
    plain: Transformer,
    other_rule: Transformer,
    batch: int,
    repeats: int,
) -> dict[str, list[float]]:
    """Seconds per decode of each contender, timed in interleaved rounds."""
    contenders = {
        "ours": run_ours,
        "plain": lambda: run_ours(model=plain),
        "module": lambda: run_ours(encoder_decoder_step),
        "hf": run_hf,
    }
    if batch == 1:
        contenders["other_rule"] = lambda: run_ours(model=other_rule)
    return time_interleaved(contenders, repeats)  # seconds per decode


def speed_row(times: dict[str, list[float]], batch: int, beam: int, n: int) -> dict[str, Any]:
    """One configuration's row: tokens/s and times of each contender, and aiayn's ratios to HF."""
    ours_s, plain_s, module_s, hf_s = (spread(times[k]) for k in ("ours", "plain", "module", "hf"))
    row: dict[str, Any] = {
        "batch": batch,
        "beam": beam,
        "out_len": n,
        "aiayn_tok_s": batch * n / ours_s["median"],
        "hf_tok_s": batch * n / hf_s["median"],
        "aiayn_torch_linear_tok_s": batch * n / plain_s["median"],
        "aiayn_module_step_tok_s": batch * n / module_s["median"],
        "aiayn_s": ours_s,
        "aiayn_torch_linear_s": plain_s,
        "aiayn_module_step_s": module_s,
        "hf_s": hf_s,
    }
    row["ratio"] = row["aiayn_tok_s"] / row["hf_tok_s"]
    row["ratio_torch_linear"] = row["aiayn_torch_linear_tok_s"] / row["hf_tok_s"]
    row["ratio_module_step"] = row["aiayn_module_step_tok_s"] / row["hf_tok_s"]
    return row


def linear_shares(
    row: dict[str, Any],
    run_ours: Callable[..., Any],
    run_hf: Callable[..., Any],
    plain: Transformer,
) -> dict[str, float]:
    """The shares of time in `F.linear` of each side, and the ratio to HF that allows."""
    plain_share = share_inside(lambda: run_ours(model=plain), F, "linear")
    hf_share = share_inside(run_hf, F, "linear")
    return {
        "aiayn_torch_linear_matmul_share": plain_share,
        "hf_matmul_share": hf_share,
        "ratio_ceiling_torch_linear": row["hf_s"]["median"]
        / (plain_share * row["aiayn_torch_linear_s"]["median"]),
    }


def no_cache_seconds(run_ours: Callable[..., Any], src: Tensor) -> float:
    """One greedy decode of ``src`` re-running the decoder over the whole prefix at every step."""
    (no_cache,) = time_it(lambda: run_ours(no_cache_step, 1, src), 1)
    return no_cache


def speed_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table of tokens/s and ratios, one row per configuration."""
    lines = [
        "| batch | search | aiayn tok/s | HF generate tok/s | **ratio** | cache speed-up "
        "| aiayn, module step: tok/s, ratio | aiayn, PyTorch linears: tok/s, ratio "
        "| in F.linear (aiayn / HF) | HF / aiayn's F.linear time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        search = search_name(r["beam"])
        cache = f"{r['cache_speedup']:.1f}×" if "cache_speedup" in r else ""
        lines.append(
            f"| {r['batch']} | {search} | {r['aiayn_tok_s']:.0f} | {r['hf_tok_s']:.0f} "
            f"| **{r['ratio']:.2f}×** | {cache} | {r['aiayn_module_step_tok_s']:.0f}, "
            f"{r['ratio_module_step']:.2f}× | {r['aiayn_torch_linear_tok_s']:.0f}, "
            f"{r['ratio_torch_linear']:.2f}× | {r['aiayn_torch_linear_matmul_share']:.0%} / "
            f"{r['hf_matmul_share']:.0%} | {r['ratio_ceiling_torch_linear']:.2f}× |"
        )
    return lines


def floor_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The batch-1 floors table (nothing without batch-1 rows), after a blank line."""
    floors = [r for r in rows if "floor_linears_s" in r]
    if not floors:
        return []
    lines = [
        "",
        f"Batch 1: one step reads {floors[0]['weight_mb']:.0f} MB of weights. Floors per "
        "output token, and the most a decoder at that floor could reach over HF:",
        "",
        "| search | aiayn ms/token | HF ms/token | aiayn's time in its linears: ms, ceiling "
        "| linears only: ms, ceiling | read only: ms, ceiling "
        "| other small-product rule: tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in floors:
        search = search_name(r["beam"])
        other = ""
        if "other_rule_tok_s" in r:
            where = "oneDNN" if r["dense_small"] else "MKL"
            other = f"{r['other_rule_tok_s']:.0f} (small products on {where})"
        lines.append(
            f"| {search} | {1e3 / r['aiayn_tok_s']:.2f} | {1e3 / r['hf_tok_s']:.2f} "
            f"| {1e3 * r['in_linears_s']:.2f} ({r['in_linears_share']:.0%}), "
            f"{r['ceiling_in_linears']:.2f}× "
            f"| {1e3 * r['floor_linears_s']:.2f}, {r['ceiling_linears']:.2f}× "
            f"| {1e3 * r['floor_read_s']:.2f}, {r['ceiling_read']:.2f}× "
            f"| {other} |"
        )
    return lines


if __name__ == "__main__":
    main()
