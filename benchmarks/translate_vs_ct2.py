"""Benchmark: translation speed of aiayn against CTranslate2 on the same weights, fp32 and int8.

    python benchmarks/translate_vs_ct2.py [--threads 2] [--rounds 3] [--max-new-tokens 40]
        [--configs 1:1 32:1 32:4] [--sentences 8 32 32] [--ct2-types float32 int8 int8_float32]

One random-weight model of Helsinki-NLP/opus-mt-en-de's shape (`MarianMTModel`: d_model 512, 6 + 6
layers, 8 heads, d_ff 2048, vocabulary 58,101; 74M parameters), every parameter drawn as
`translate_vs_hf.build_marian` draws it, then two changes so that both engines decode the same
thing: the pad's embedding row is zero (as in the published checkpoints: CTranslate2 starts
the decoder from a zero embedding, Hugging Face and aiayn from the pad's row), and EOS's logit
bias is −100, so EOS never wins and every output is exactly `--max-new-tokens` tokens long on
both sides (aiayn: the limit, no forced EOS; CTranslate2: `max_decoding_length`). Saved with
`save_pretrained` together with a `MarianTokenizer` (SentencePiece models trained on the demo
corpus, a vocab.json of 58,101 made-up pieces: `</s>` 0, `<unk>` 1, `<pad>` last), then read by
both sides: aiayn through its converter (`aiayn.convert`), CTranslate2 through its own
`TransformersConverter` (float32; its int8 compute types quantise at load, as `ct2-transformers-
converter --quantization int8` would ahead of time).

Contenders, all timed in the same interleaved rounds (each round calls each once, after one
warm-up call of each; medians): aiayn fp32 (`translate_ids` over packed linears, as `aiayn
translate` runs on CPU: aiayn's fp32 kernel for a few rows, oneDNN's beyond), aiayn int8
(`aiayn.inference.quantize.quantize_model(model, mode="int8")` on a copy, packed as
`aiayn translate --quantize int8` runs it), and CTranslate2
`Translator(compute_type=T, inter_threads=1, intra_threads=--threads)` for each `--ct2-types`
T, in a child process of its own (:class:`Ct2Process`: one OpenMP runtime per engine, as each
runs for its users; the call's pipe round trip is inside its timing),
`translate_batch(max_batch_size=batch, beam_size=K, max_decoding_length=M)` on token strings
(each source followed by `</s>`, as the Marian tokenizer encodes it); a compute type that
CTranslate2 runs as an earlier one (on a CPU, `int8` runs as `int8_float32`) is timed once, and
the report records what each asked type ran as. PyTorch runs
`--threads` threads. The same random sources (`--min-len`..`--max-len` ids, no special id).
Configurations `batch:beam`: batch 1 (one sentence per call of the decoder: aiayn's token
budget is 1, CTranslate2's `max_batch_size` 1) and batch 32 (one batch of 32).

Checked in the same run: at fp32, aiayn's and CTranslate2's outputs token for token. A
mismatch is told apart by the score margin under aiayn's fp32 model (teacher-forced, pad
excluded from the softmax as both engines exclude it): greedy, the log-probability gap of the
two tokens at the first differing position; beam, the gap of the two sequences' total
log-probabilities. Below `--tie` nats it is a near-tie (both engines' arithmetic can tip it).
Also reported: the share of each engine's int8 outputs identical to its own fp32 outputs.

At batch 1, greedy, the weight-read floor: the time to read the weights one decoding step reads
(every decoder linear, cross-attention queries only, and the output projection), measured as
`translate_vs_hf.py` measures it (a `Tensor.sum` of each fp32 weight, timed in the same rounds),
which gives the memory bandwidth; the int8 floor is the bytes of those weights in int8 plus
one fp32 scale per output row, over that bandwidth; the share reached is floor / time per token.
The matmul peaks of fp32 and int8 (fastest kernel of each) are measured in the same run.
Writes docs/results/translate_vs_ct2.md and results/translate_vs_ct2.json.gz.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    CPU_CLASSES,
    add_cpu_class_flags,
    aiayn_kernels,
    command_line,
    fmt,
    machine,
    matmul_peaks,
    report_name,
    run_cpu_classes,
    spread,
    time_interleaved,
    without_cpu_classes,
    write_report,
)
from aiayn.convert.generation import Seq2SeqSpecials
from aiayn.data import demo_corpus_path, read_parallel
from aiayn.decoding.translate import options_for_checkpoint, translate_ids
from aiayn.inference import pack_for_inference
from aiayn.inference.quantize import quantize_model
from aiayn.performance import keep_freed_memory
from translate_vs_hf import build_marian, convert, decoder_weights, sources

AIAYN_FP32, AIAYN_INT8 = "aiayn fp32", "aiayn int8"
CT2 = "CTranslate2 "  # + compute type

GOALS: list[dict[str, Any]] = [
    {"config": (1, 1), "ours": AIAYN_INT8, "peer": AIAYN_FP32, "at_least": 2.0},
    {"config": (1, 1), "ours": AIAYN_INT8, "peer": "ct2 int8", "at_least": 1.2},
    {"config": (32, 1), "ours": AIAYN_INT8, "peer": "ct2 int8", "at_least": 1.0},
    {"config": (32, 4), "ours": AIAYN_INT8, "peer": "ct2 int8", "at_least": 1.0},
    {"config": (1, 1), "ours": AIAYN_FP32, "peer": "ct2 float32", "at_least": 1.2},
    {"config": (32, 1), "ours": AIAYN_FP32, "peer": "ct2 float32", "at_least": 1.2},
]
"""The issue's speed goals: tokens/s of ``ours`` ≥ ``at_least`` × those of ``peer`` at
``config`` (batch, beam). "ct2 int8": CTranslate2's fastest int8 compute type in that row (a
peer gets its best setting); "ct2 float32": its float32."""

FLOOR_GOAL = 0.70
"""The issue's goal: aiayn int8 at batch 1 reaches ≥ 70% of the int8 weight-read floor."""

AVX2_GOALS: list[dict[str, Any]] = [
    {"config": (1, 1), "ours": AIAYN_INT8, "peer": "ct2 int8", "at_least": 2.0},
    {"config": (32, 1), "ours": AIAYN_INT8, "peer": "ct2 int8", "at_least": 1.0},
    {"config": (32, 4), "ours": AIAYN_INT8, "peer": "ct2 int8", "at_least": 1.0},
    {"config": (1, 1), "ours": AIAYN_INT8, "peer": AIAYN_FP32, "at_least": 1.5},
    {"config": (1, 1), "ours": AIAYN_FP32, "peer": "ct2 float32", "at_least": 1.1},
    {"config": (32, 1), "ours": AIAYN_FP32, "peer": "ct2 float32", "at_least": 1.1},
]
"""The goals on an AVX2 CPU (issue 61), for the ``avx2`` class; its floor goal is 60%."""

GOALS_BY_CLASS = {"native": (GOALS, FLOOR_GOAL), "avx2": (AVX2_GOALS, 0.60)}
"""Each CPU class's speed goals and weight-read floor goal (another class: the native ones)."""


def goals_of(cpu_class: str | None) -> tuple[list[dict[str, Any]], float]:
    """The speed goals and the floor goal of a CPU class."""
    return GOALS_BY_CLASS.get(cpu_class or "native", GOALS_BY_CLASS["native"])


def ct2_variants(cpu_class: str | None, intel: bool) -> list[tuple[str, dict[str, str]]]:
    """CTranslate2's settings to time on a CPU class, each as (label, environment): as the wheel
    runs by default, and with the other GEMM backend (``CT2_USE_MKL``: MKL is its default on
    Intel, oneDNN elsewhere), both under ``CT2_FORCE_CPU_ISA=AVX2`` for the ``avx2`` class; the
    fastest of each compute type is the peer (a peer gets its best settings).

    E.g. ("avx2", False) -> [("", {ISA}), (" [CT2_USE_MKL=1]", {ISA, "CT2_USE_MKL": "1"})]
    where ISA is CT2_FORCE_CPU_ISA=AVX2.
    """
    base = {"CT2_FORCE_CPU_ISA": "AVX2"} if cpu_class == "avx2" else {}
    other = "0" if intel else "1"
    return [("", base), (f" [CT2_USE_MKL={other}]", {**base, "CT2_USE_MKL": other})]


# ------------------------------------------------------------------------------ pure helpers


def weight_read_bytes(shapes: list[tuple[int, int]], int8: list[bool]) -> int:
    """Bytes one decoding step reads for weights of ``shapes`` (rows, columns): 4 per fp32
    element; 1 per int8 element plus a 4-byte fp32 scale per row (per-output-channel)."""
    total = 0
    for (rows, cols), quantised in zip(shapes, int8, strict=True):
        total += rows * cols + 4 * rows if quantised else 4 * rows * cols
    return total


def read_floor(fp32_bytes: int, fp32_read_s: float, other_bytes: int) -> float:
    """Seconds to read ``other_bytes`` at the bandwidth measured by reading ``fp32_bytes`` in
    ``fp32_read_s`` seconds."""
    return other_bytes * fp32_read_s / fp32_bytes


def best_of(rates: dict[str, float], prefix: str) -> tuple[str, float]:
    """The highest tokens/s among the contenders whose name starts with ``prefix`` (e.g. the
    fastest of CTranslate2's int8 compute types), with its name."""
    found = {k: v for k, v in rates.items() if k.startswith(prefix)}
    if not found:
        raise KeyError(prefix)
    name = max(found, key=lambda k: found[k])
    return name, found[name]


def peer_name(peer: str) -> str:
    """A goal's peer ("ct2 int8", "ct2 float32", or a contender's name) as a contender prefix."""
    return {"ct2 int8": CT2 + "int8", "ct2 float32": CT2 + "float32"}.get(peer, peer)


def goal_verdicts(
    rows: list[dict[str, Any]], goals: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every goal of ``goals`` (:data:`GOALS` by default) with its measured ratio and whether it
    is met; a goal whose contenders did not run (no int8 path) gets ratio None and "not
    measured"."""
    out = []
    for goal in GOALS if goals is None else goals:
        row = next((r for r in rows if (r["batch"], r["beam"]) == goal["config"]), None)
        verdict = {**goal, "config": list(goal["config"]), "ratio": None, "peer_used": None}
        if row is not None and goal["ours"] in row["tok_s"]:
            try:
                used, peer_rate = best_of(row["tok_s"], peer_name(goal["peer"]))
            except KeyError:
                used = None
            if used is not None:
                verdict["ratio"] = row["tok_s"][goal["ours"]] / peer_rate
                verdict["peer_used"] = used
        ratio = verdict["ratio"]
        verdict["met"] = None if ratio is None else ratio >= goal["at_least"]
        out.append(verdict)
    return out


def first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length when one
    is a prefix of the other); −1 when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


# ------------------------------------------------------------------------- the model folder


def build_folder(folder: Path, seed: int) -> tuple[int, list[str]]:
    """Save the OPUS-MT-shaped model (see the module docstring) and a MarianTokenizer into
    ``folder``; its EOS id and its vocabulary (id -> piece)."""
    import sentencepiece as spm
    import transformers

    model, eos = build_marian(seed)
    vocab_size = model.config.vocab_size
    pad = model.config.pad_token_id
    with torch.no_grad():
        model.model.shared.weight[pad].zero_()  # tied: the encoder's, decoder's, output rows
        model.final_logits_bias[0, eos] = -100.0  # EOS never wins: every output is M tokens
    model.save_pretrained(folder)
    lines = [s for pair in read_parallel(demo_corpus_path())[::20] for s in pair]
    for side in ("source", "target"):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=str(folder / side), vocab_size=200,
            model_type="unigram", num_threads=1, minloglevel=2,
        )  # fmt: skip
        (folder / f"{side}.model").rename(folder / f"{side}.spm")
    pieces = ["</s>", "<unk>"] + [f"▁p{i}" for i in range(2, vocab_size - 1)] + ["<pad>"]
    vocab_json = json.dumps({p: i for i, p in enumerate(pieces)})
    (folder / "vocab.json").write_text(vocab_json, encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")
    )
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (eos, pad)
    tokenizer.save_pretrained(folder)
    return eos, pieces


def ct2_convert(folder: Path, out: Path) -> None:
    """CTranslate2's own converter, float32 (its int8 types quantise this at load)."""
    import ctranslate2

    ctranslate2.converters.TransformersConverter(str(folder)).convert(str(out), force=True)


# --------------------------------------------------------------------------- the contenders


def aiayn_runner(
    model: nn.Module,
    specials: Seq2SeqSpecials,
    srcs: list[list[int]],
    batch: int,
    beam: int,
    m: int,
) -> Callable[[], list[list[int]]]:
    """One call: translate every source with aiayn at this batch size and beam."""
    options = options_for_checkpoint(
        dataclasses.asdict(specials),
        beam_size=beam,
        max_new_tokens=m,
        extra_len=100_000,  # every sentence's limit is max_new_tokens
        forced_eos=False,  # CTranslate2 has none; EOS never wins here anyway
        max_tokens=1 if batch == 1 else 1 << 30,  # one batch per sentence, or all in one
        pack=False,  # both aiayn models are packed once beforehand
    )
    tokenizer = SimpleNamespace(
        pad_id=specials.pad_id, eos_id=specials.eos_id, bos_id=specials.decoder_start_id
    )
    return lambda: [h[0].tokens for h in translate_ids(model, srcs, tokenizer, options)]  # type: ignore[arg-type]


class Ct2Process:
    """CTranslate2's translators in a process of their own, one per compute type, called over a
    pipe: each engine keeps its own OpenMP runtime. In one process, once a CTranslate2 call has
    run, PyTorch's parallel regions start several times slower for the rest of the process
    (aiayn's int8 kernel on a 512→2048 product at one row: 17 µs before, 60–106 µs after, in a
    probe on this machine), which would time aiayn in a state no user of it runs in."""

    def __init__(
        self, ct2_dir: Path, types: list[str], threads: int, env: dict[str, str] | None = None
    ):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.proc = context.Process(
            target=_ct2_serve, args=(child, str(ct2_dir), types, threads, env or {}), daemon=True
        )
        self.proc.start()
        self.resolved: dict[str, str] = self.conn.recv()  # asked compute type -> what runs

    def translate(
        self, ct: str, tokens: list[list[str]], batch: int, beam: int, m: int
    ) -> list[list[str]]:
        """The best hypothesis of each source, by the translator of compute type ``ct``."""
        self.conn.send((ct, tokens, batch, beam, m))
        result: list[list[str]] = self.conn.recv()
        return result

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(60)


def _ct2_serve(
    conn: Any, ct2_dir: str, types: list[str], threads: int, env: dict[str, str]
) -> None:
    """The child's loop: set CTranslate2's environment ``env`` (read as it loads), load a
    translator per compute type, then translate until told to stop."""
    os.environ.update(env)
    import ctranslate2

    translators = {
        ct: ctranslate2.Translator(
            ct2_dir, device="cpu", compute_type=ct, inter_threads=1, intra_threads=threads
        )
        for ct in types
    }
    conn.send({ct: t.compute_type for ct, t in translators.items()})
    while (message := conn.recv()) is not None:
        ct, tokens, batch, beam, m = message
        results = translators[ct].translate_batch(
            tokens, max_batch_size=batch, beam_size=beam, max_decoding_length=m
        )
        conn.send([r.hypotheses[0] for r in results])


def ct2_runner(
    engine: Ct2Process,
    ct: str,
    pieces: list[str],
    srcs: list[list[int]],
    batch: int,
    beam: int,
    m: int,
) -> Callable[[], list[list[int]]]:
    """One call: translate every source with CTranslate2 (token strings in and out)."""
    ids = {p: i for i, p in enumerate(pieces)}
    tokens = [[pieces[i] for i in s] + ["</s>"] for s in srcs]

    def run() -> list[list[int]]:
        return [[ids[t] for t in hyp] for hyp in engine.translate(ct, tokens, batch, beam, m)]

    return run


# ---------------------------------------------------------------------------- near-ties


@torch.inference_mode()
def sequence_log_probs(
    model: nn.Module, specials: Seq2SeqSpecials, src: list[int], out: list[int]
) -> Tensor:
    """(T, V) log-probabilities of each next token of ``out`` under ``model`` (teacher-forced),
    the pad excluded from the softmax as both engines exclude it."""
    source = torch.tensor([[*src, specials.eos_id]])  # (1, S)
    target = torch.tensor([[specials.decoder_start_id, *out[:-1]]])  # (1, T)
    logp = model(source, target)[0]  # (T, V): log-probabilities over the whole vocabulary
    logp[:, specials.pad_id] = float("-inf")
    return torch.log_softmax(logp, dim=-1)  # renormalised without the pad


def mismatch_margin(
    model: nn.Module, specials: Seq2SeqSpecials, src: list[int], a: list[int], b: list[int],
    beam: int,
) -> float:  # fmt: skip
    """How far apart two different outputs are under ``model``: greedy, log p(a_i) − log p(b_i)
    at the first differing position i; beam, log P(a) − log P(b) of the whole sequences."""
    if beam == 1:
        i = first_difference(a, b)
        logp = sequence_log_probs(model, specials, src, a[: i + 1])[i]  # (V,)
        return float(logp[a[i]] - logp[b[i]])

    def total(out: list[int]) -> float:
        logp = sequence_log_probs(model, specials, src, out)  # (T, V)
        return float(logp.gather(1, torch.tensor(out)[:, None]).sum())

    return total(a) - total(b)


def compare_outputs(
    ours: list[list[int]], peer: list[list[int]], margin: Callable[[int], float], tie: float
) -> dict[str, Any]:
    """Identical outputs, and for the others their margins (``margin(i)``, nats) and how many
    are near-ties (|margin| < ``tie``)."""
    differ = [i for i, (a, b) in enumerate(zip(ours, peer, strict=True)) if a != b]
    margins = {i: margin(i) for i in differ}
    return {
        "identical": len(ours) - len(differ),
        "sentences": len(ours),
        "mismatch_margins": margins,
        "near_ties": sum(abs(v) < tie for v in margins.values()),
    }


# ------------------------------------------------------------------------------ the floor


def step_linears(model: nn.Module) -> list[tuple[str, int]]:
    """(module path, rows read) of each linear layer one decoding step reads: every decoder
    layer's (cross-attention: the query rows of its fused projection; its keys and values are
    projected once per source) and the output projection."""
    found: list[tuple[str, int]] = []
    for i, layer in enumerate(model.decoder.layers):  # type: ignore[union-attr]
        base = f"decoder.layers.{i}"
        names = ["self_attn.in_proj", "self_attn.out_proj", "cross_attn.in_proj"]
        names += ["cross_attn.out_proj", "feed_forward.linear1", "feed_forward.linear2"]
        if getattr(layer.feed_forward, "gate", None) is not None:
            names.append("feed_forward.gate")
        for name in names:
            module = model.get_submodule(f"{base}.{name}")
            rows = module.weight.shape[0]
            if name == "cross_attn.in_proj":
                rows = layer.cross_attn.inner_dim
            found.append((f"{base}.{name}", rows))
    found.append(("output_proj", model.get_submodule("output_proj").weight.shape[0]))
    return found


def holds_int8(model: nn.Module, path: str) -> bool:
    """Whether the module at ``path`` in ``model`` keeps an int8 tensor (a quantised linear)."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return False
    tensors = [*module.parameters(), *module.buffers()]
    return any(t.dtype == torch.int8 for t in tensors)


def floor_bytes(model: nn.Module, quantised: nn.Module | None) -> dict[str, Any]:
    """Bytes one step reads: fp32; int8 everywhere (every linear, with its scales); and as
    aiayn's quantised model holds them (int8 where it keeps int8, fp32 elsewhere)."""
    linears = step_linears(model)
    shapes = [(rows, model.get_submodule(p).weight.shape[1]) for p, rows in linears]
    out: dict[str, Any] = {
        "fp32": weight_read_bytes(shapes, [False] * len(shapes)),
        "int8": weight_read_bytes(shapes, [True] * len(shapes)),
    }
    if quantised is not None:
        kept = [holds_int8(quantised, p) for p, _ in linears]
        out["aiayn_int8_layout"] = weight_read_bytes(shapes, kept)
        out["aiayn_fp32_linears"] = [p for (p, _), q in zip(linears, kept, strict=True) if not q]
    return out


# ----------------------------------------------------------------------------- one config


def run_config(
    contenders: dict[str, Callable[..., Callable[[], list[list[int]]]]],
    srcs: list[list[int]],
    batch: int,
    beam: int,
    args: argparse.Namespace,
    margin: Callable[[list[int], list[int], list[int], int], float],
    weights: list[Tensor] | None,
) -> dict[str, Any]:
    """Time every contender at (batch, beam) over ``srcs`` in interleaved rounds; compare
    the outputs."""
    m = args.max_new_tokens
    calls = {name: make(srcs, batch, beam, m) for name, make in contenders.items()}
    outputs: dict[str, list[list[int]]] = {}

    def keep(name: str) -> Callable[[], None]:
        def run() -> None:
            outputs[name] = calls[name]()

        return run

    fns: dict[str, Callable[[], object]] = {name: keep(name) for name in calls}
    reads = 10
    if weights is not None:
        fns["read"] = lambda: [w.sum() for _ in range(reads) for w in weights]
    times = time_interleaved(fns, args.rounds)
    tokens = {name: sum(map(len, out)) for name, out in outputs.items()}
    row: dict[str, Any] = {
        "batch": batch,
        "beam": beam,
        "sentences": len(srcs),
        "tokens": tokens,
        "seconds": {name: spread(times[name]) for name in calls},
    }
    row["tok_s"] = {name: tokens[name] / row["seconds"][name]["median"] for name in calls}
    fp32_peer = CT2 + "float32"
    if AIAYN_FP32 in outputs and fp32_peer in outputs:
        row["fp32_vs_ct2"] = compare_outputs(
            outputs[AIAYN_FP32], outputs[fp32_peer],
            lambda i: margin(srcs[i], outputs[AIAYN_FP32][i], outputs[fp32_peer][i], beam),
            args.tie,
        )  # fmt: skip
    row["int8_same_as_own_fp32"] = {
        name: sum(a == b for a, b in zip(out, outputs[ref], strict=True)) / len(srcs)
        for name, out in outputs.items()
        for ref in [AIAYN_FP32 if name.startswith("aiayn") else fp32_peer]
        if "int8" in name and ref in outputs
    }
    if weights is not None:
        row["read_s"] = spread([t / reads for t in times["read"]])
    return row


def add_floor(row: dict[str, Any], floor: dict[str, Any]) -> None:
    """Batch 1, greedy: the fp32 and int8 floors per token and each contender's share."""
    read_s = row["read_s"]["median"]
    row["floor_s"] = {
        kind: read_floor(floor["fp32"], read_s, floor[kind])
        for kind in ("fp32", "int8", "aiayn_int8_layout")
        if kind in floor
    }
    row["bandwidth_gb_s"] = floor["fp32"] / read_s / 1e9
    row["s_per_token"] = {k: 1 / v for k, v in row["tok_s"].items()}
    row["floor_share"] = {
        name: row["floor_s"]["int8" if "int8" in name else "fp32"] / s
        for name, s in row["s_per_token"].items()
    }


# ------------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=40, help="M, on both sides")
    parser.add_argument("--configs", nargs="+", default=["1:1", "32:1", "32:4"],
                        help="batch:beam configurations")  # fmt: skip
    parser.add_argument("--sentences", type=int, nargs="+", default=[8, 32, 32],
                        help="sentences per configuration")  # fmt: skip
    parser.add_argument("--ct2-types", nargs="+", default=["float32", "int8", "int8_float32"],
                        help="CTranslate2 compute types")  # fmt: skip
    parser.add_argument("--min-len", type=int, default=8, help="shortest source (ids)")
    parser.add_argument("--max-len", type=int, default=40, help="longest source (ids)")
    parser.add_argument("--tie", type=float, default=1e-3, help="near-tie margin (nats)")
    parser.add_argument("--peak-size", type=int, default=2048, help="side of the peak GEMMs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-report", dest="report", action="store_false",
                        help="print the tables only; write no report")  # fmt: skip
    add_cpu_class_flags(parser)
    args = parser.parse_args()
    if len(args.sentences) != len(args.configs):
        parser.error("--sentences needs one count per configuration")
    args.pairs = [tuple(int(x) for x in c.split(":")) for c in args.configs]
    for (batch, _), count in zip(args.pairs, args.sentences, strict=True):
        if batch not in (1, count):  # aiayn batches by a token budget: one, or all at once
            parser.error(f"batch {batch} must be 1 or its sentence count ({count})")
    return args


def contenders(
    folder: Path, ct2_dir: Path, pieces: list[str], args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The contenders' factories (srcs, batch, beam, M) -> call, and what the report needs of
    the models: aiayn's unpacked model, its specials, the quantised model, the packing time."""
    ours, specials = convert(folder)
    start = time.perf_counter()
    packed = pack_for_inference(ours)
    info: dict[str, Any] = {"ours": ours, "specials": specials, "quantised": None}
    info["pack_s"] = time.perf_counter() - start
    made: dict[str, Any] = {
        AIAYN_FP32: lambda s, b, k, m: aiayn_runner(packed, specials, s, b, k, m),
    }
    start = time.perf_counter()
    # quantize_model swaps the layers in place: a copy, then packed as `aiayn translate
    # --quantize int8` packs it (the layers kept in fp32 and the embeddings' neighbours)
    quantised = pack_for_inference(quantize_model(copy.deepcopy(ours), mode="int8"))
    info["quantise_s"] = time.perf_counter() - start
    info["quantised"] = quantised
    made[AIAYN_INT8] = lambda s, b, k, m: aiayn_runner(quantised, specials, s, b, k, m)
    intel = "GenuineIntel" in Path("/proc/cpuinfo").read_text(errors="replace")
    info["ct2"], info["ct2_variants"] = [], {}
    for label, env in ct2_variants(args.cpu_class, intel):
        engine = Ct2Process(ct2_dir, args.ct2_types, args.threads, env)
        info["ct2"].append(engine)
        info["ct2_resolved"], info["ct2_variants"][label.strip() or "default"] = (
            engine.resolved,
            env,
        )
        first: dict[str, str] = {}  # what each compute type runs as -> the first type asked
        for ct in args.ct2_types:
            first.setdefault(engine.resolved[ct], ct)
        for ct in first.values():  # a type that runs as an earlier one (CPU: int8): once
            made[CT2 + ct + label] = lambda s, b, k, m, ct=ct, engine=engine: ct2_runner(
                engine, ct, pieces, s, b, k, m
            )
    return made, info


def main() -> None:
    args = parse_args()
    if args.cpu_class is None:  # the parent: each class in a process of its own, with its caps
        run_cpu_classes(args.cpu_classes, __file__, without_cpu_classes(sys.argv[1:]))
        return
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `aiayn translate` sets it on CPU
    load_before = os.getloadavg()
    import ctranslate2

    with tempfile.TemporaryDirectory() as tmp:
        folder, ct2_dir = Path(tmp) / "hf", Path(tmp) / "ct2"
        folder.mkdir()
        eos, pieces = build_folder(folder, args.seed)
        ct2_convert(folder, ct2_dir)
        made, info = contenders(folder, ct2_dir, pieces, args)
    ours, specials = info["ours"], info["specials"]
    assert specials.eos_id == eos
    floor = floor_bytes(ours, info["quantised"])
    weights = decoder_weights(ours)
    peaks = {kind: matmul_peaks(kind, n=args.peak_size) for kind in ("fp32", "int8")}
    srcs = sources(max(args.sentences), args.min_len, args.max_len, specials, len(pieces))

    def margin(src: list[int], a: list[int], b: list[int], beam: int) -> float:
        return mismatch_margin(ours, specials, src, a, b, beam)

    rows = measure(made, srcs, args, margin, (weights, floor))
    for engine in info["ct2"]:
        engine.close()
    goals, floor_goal = goals_of(args.cpu_class)
    report = {
        "cpu_class": args.cpu_class or "native",
        "cpu_class_caps": CPU_CLASSES.get(args.cpu_class or "native", {}),
        "floor_goal": floor_goal,
        "command": command_line(),
        "machine": machine(),
        "ctranslate2": ctranslate2.__version__,
        "ct2_compute_types": info["ct2_resolved"],  # asked -> what CTranslate2 runs
        "ct2_environment": {k: v for k, v in os.environ.items() if k.startswith("CT2_")},
        "ct2_variants": info["ct2_variants"],
        "parameters": sum(p.numel() for p in ours.parameters()),
        "pack_s": info["pack_s"],
        "quantise_s": info.get("quantise_s"),
        "floor_bytes": floor,
        "aiayn_kernels": aiayn_kernels(),
        "peaks": {k: p._asdict() for k, p in peaks.items()},
        "args": {k: v for k, v in vars(args).items() if k != "pairs"},
        "load_average_1_5_15_min": {"start": load_before, "end": os.getloadavg()},
        "rows": rows,
        "goals": goal_verdicts(rows, goals),
    }
    lines = markdown(report, peaks)
    print("\n".join(lines))
    if args.report:
        name = report_name("translate_vs_ct2", args.cpu_class)
        print(f"wrote {write_report(name, report, lines)} and results/{name}.json.gz")


def measure(
    made: dict[str, Callable[..., Callable[[], list[list[int]]]]],
    srcs: list[list[int]],
    args: argparse.Namespace,
    margin: Callable[[list[int], list[int], list[int], int], float],
    batch_one: tuple[list[Tensor], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each (batch, beam) pair's row (:func:`run_config`), printed as it is measured; batch 1
    greedy also times reading the decoder's weights and gets the floors (``batch_one``: those
    weights and :func:`floor_bytes`)."""
    weights, floor = batch_one
    rows = []
    for (batch, beam), count in zip(args.pairs, args.sentences, strict=True):
        read = weights if (batch, beam) == (1, 1) else None
        rows.append(run_config(made, srcs[:count], batch, beam, args, margin, read))
        if read is not None:
            add_floor(rows[-1], floor)
        print({k: v for k, v in rows[-1].items() if k != "seconds"}, flush=True)
    return rows


# -------------------------------------------------------------------------------- tables


def search_name(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def caption(report: dict[str, Any], peaks: dict[str, Any]) -> list[str]:
    """The lines above the tables: command, machine, kernels, method."""
    a, mach, load = report["args"], report["machine"], report["load_average_1_5_15_min"]
    env = ", ".join(f"{k}={v}" for k, v in report["ct2_environment"].items()) or "no CT2_ variable"
    types = ", ".join(f"{k} → {v}" for k, v in report["ct2_compute_types"].items())
    variants = "; ".join(
        f"{label}: {', '.join(f'{k}={v}' for k, v in e.items()) or 'as installed'}"
        for label, e in report.get("ct2_variants", {}).items()
    )
    cpu_class = report.get("cpu_class", "native")
    caps = ", ".join(f"{k}={v}" for k, v in report.get("cpu_class_caps", {}).items())
    return [
        "# Translation: aiayn vs CTranslate2 (`opus-mt-en-de`-shaped, same weights)"
        + ("" if cpu_class == "native" else f", CPU class {cpu_class}"),
        "",
        f"CPU class **{cpu_class}**"
        + (f" (this machine capped: {caps})" if caps else " (the machine as it is)")
        + f"; CTranslate2 settings timed (the fastest of each compute type is the peer): "
        f"{variants or 'as installed'}.",
        "",
        f"`{report['command']}` on {mach['cpu']} ({mach['cpu_count']} cores), "
        f"{a['threads']} threads on both sides (torch.set_num_threads; CTranslate2 "
        f"inter_threads 1, intra_threads {a['threads']}), torch {mach['torch']}, CTranslate2 "
        f"{report['ctranslate2']}. Random weights ({report['parameters'] / 1e6:.0f}M "
        "parameters) saved by transformers, converted by `aiayn.convert` and by CTranslate2's "
        f"`TransformersConverter`; random sources of {a['min_len']}–{a['max_len']} ids; "
        f"exactly {a['max_new_tokens']} new tokens per sentence on both sides (EOS's logit "
        f"bias −100: never chosen). Kernels: {report['aiayn_kernels']}; "
        "CTranslate2 on its own CPU backend as the wheel ships it (on AMD: oneDNN for its "
        "fp32 and int8 GEMMs, AVX2 for the rest, as `CT2_VERBOSE=1` logs; environment: "
        f"{env}); compute types asked → run (a type that runs as an earlier one is timed "
        f"once): {types}. "
        f"Medians of {a['rounds']} interleaved rounds (min–max). Load average (1 min) at "
        f"start and end: {load['start'][0]:.1f}, {load['end'][0]:.1f}.",
        "",
        f"Matmul peaks measured in the same run on {mach['cpu']}, fastest kernel of each: "
        f"fp32 {peaks['fp32'].describe()}; int8 {peaks['int8'].describe('GOP/s')}.",
    ]


def speed_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "| batch | search | engine | tokens | seconds | tok/s | aiayn fp32 / engine "
        "| aiayn int8 / engine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        rates = r["tok_s"]
        for name, rate in rates.items():
            vs = [
                f"{rates[ref] / rate:.2f}×" if ref in rates else "–"
                for ref in (AIAYN_FP32, AIAYN_INT8)
            ]
            lines.append(
                f"| {r['batch']} | {search_name(r['beam'])} | {name} | {r['tokens'][name]} "
                f"| {fmt(r['seconds'][name], 1, 2)} | {rate:,.0f} | {vs[0]} | {vs[1]} |"
            )
    return lines


def output_lines(report: dict[str, Any]) -> list[str]:
    """Identical outputs at fp32, near-ties, and int8 against each engine's fp32."""
    lines = ["", "Outputs:", ""]
    tie = report["args"]["tie"]
    for r in report["rows"]:
        head = f"- batch {r['batch']}, {search_name(r['beam'])}: "
        c = r.get("fp32_vs_ct2")
        if c is not None:
            head += f"fp32 aiayn = CTranslate2 on **{c['identical']}/{c['sentences']}**"
            if c["mismatch_margins"]:
                margins = ", ".join(f"{abs(v):.1e}" for v in c["mismatch_margins"].values())
                head += (
                    f"; the others differ by margins of {margins} nats under aiayn's fp32 "
                    f"model ({c['near_ties']} near-ties below {tie:g})"
                )
        same = "; ".join(
            f"{name} = its own fp32 on {share:.0%}"
            for name, share in r["int8_same_as_own_fp32"].items()
        )
        lines.append(head + (f"; {same}" if same else "") + ".")
    return lines


def floor_lines(report: dict[str, Any]) -> list[str]:
    """The batch-1 weight-read floors and the share each contender reaches."""
    lines: list[str] = []
    fb = report["floor_bytes"]
    for r in (r for r in report["rows"] if "floor_s" in r):
        f = r["floor_s"]
        shares = ", ".join(f"{name} {share:.0%}" for name, share in r["floor_share"].items())
        lines += [
            "",
            f"Batch 1, greedy: one step reads {fb['fp32'] / 1e6:.0f} MB of fp32 weights (every "
            "decoder linear, cross-attention queries only, and the output projection); reading "
            f"them once (`Tensor.sum`, same rounds) takes {fmt(r['read_s'], 1e3, 2)} ms "
            f"({r['bandwidth_gb_s']:.1f} GB/s): the fp32 floor. In int8 with one fp32 scale per "
            f"row they are {fb['int8'] / 1e6:.0f} MB: the int8 floor is "
            f"{1e3 * f['int8']:.2f} ms per token at that bandwidth.",
        ]
        if "aiayn_int8_layout" in f and not fb["aiayn_fp32_linears"]:
            lines[-1] += " aiayn's int8 model holds every one of them in int8."
        if "aiayn_int8_layout" in f and fb["aiayn_fp32_linears"]:
            kept = ", ".join(fb["aiayn_fp32_linears"]) or "none"
            lines[-1] += (
                f" As aiayn's int8 model holds them ({fb['aiayn_int8_layout'] / 1e6:.0f} MB; "
                f"kept fp32: {kept}) the floor is {1e3 * f['aiayn_int8_layout']:.2f} ms."
            )
        lines[-1] += (
            f" Share of the floor reached (int8 floor for int8 engines, fp32 floor for fp32 "
            f"ones; goal ≥ {report.get('floor_goal', FLOOR_GOAL):.0%} for aiayn int8): {shares}."
        )
    return lines


def goal_lines(report: dict[str, Any]) -> list[str]:
    lines = ["", "| goal | measured | verdict |", "|---|---|---|"]
    for g in report["goals"]:
        batch, beam = g["config"]
        what = f"batch {batch}, {search_name(beam)}: {g['ours']} ≥ {g['at_least']:.1f}× {g['peer']}"
        if g["ratio"] is None:
            lines.append(f"| {what} | – | not measured |")
            continue
        verdict = "met" if g["met"] else "**not met**"
        lines.append(f"| {what} | {g['ratio']:.2f}× (vs {g['peer_used']}) | {verdict} |")
    floor_goal = report.get("floor_goal", FLOOR_GOAL)
    for r in (r for r in report["rows"] if "floor_share" in r):
        share = r["floor_share"].get(AIAYN_INT8)
        what = f"batch 1, greedy: aiayn int8 ≥ {floor_goal:.0%} of the int8 read floor"
        if share is None:
            lines.append(f"| {what} | – | not measured |")
        else:
            verdict = "met" if share >= floor_goal else "**not met**"
            lines.append(f"| {what} | {share:.0%} | {verdict} |")
    return lines


def markdown(report: dict[str, Any], peaks: dict[str, Any]) -> list[str]:
    return [
        *caption(report, peaks),
        *speed_table(report),
        *output_lines(report),
        *floor_lines(report),
        *goal_lines(report),
    ]


if __name__ == "__main__":
    main()
