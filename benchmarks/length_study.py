"""Why are a translation model's outputs short? A length study of one checkpoint on one set.

    python benchmarks/length_study.py CHECKPOINT SRC REF [--alphas 0,0.6,1,1.5] [--beam 4]
        [--sentences N] [--skip-beam] [--out study.json]

Use the validation set (``../shared/data/multi30k/val.de.gz`` / ``val.en.gz``), not the test
set. It prints, as JSON lines:

- whether every reference survives the BPE round trip (encode → decode gives it back exactly:
  if not, detokenization loses words);
- greedy and beam (one row per α) decodes: sacreBLEU BLEU, brevity penalty, hypothesis /
  reference length ratio (13a tokens), the same ratio in BPE tokens, how many outputs reached
  the length cap (source + 50 tokens), end with a period, or are empty;
- greedy's ratio per reference-length bucket and its per-sentence ratio quantiles;
- teacher forcing on the references (the model reads the reference prefix): how often EOS is the
  argmax before the reference ends (premature EOS), and EOS's probability and rank at the true
  end. A model whose EOS is well placed under teacher forcing but whose free-running outputs are
  short drops content while decoding (under-translation); one with premature EOS ends too soon;
- the eight greedy outputs shortest against their reference.

docs/quality.md has the figures and the commands that made them.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import sacrebleu
import torch

from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer
from aiayn.data import normalize
from aiayn.data.corpus import read_lines
from aiayn.decoding.translate import DecodeOptions, translate_ids
from aiayn.models.transformer import EncoderDecoder

CAP = 50  # aiayn's output limit: source length + 50 tokens


def decode_row(name: str, hyp_ids: list[list[int]], study: dict[str, Any]) -> dict[str, Any]:
    """The length figures of one decode of the whole set."""
    tok, refs, src_ids, ref_ids = study["tok"], study["refs"], study["src_ids"], study["ref_ids"]
    hyps = tok.decode_batch(hyp_ids)
    bleu = sacrebleu.BLEU().corpus_score(hyps, [refs])
    return {
        "name": name,
        "bleu": round(bleu.score, 2),
        "bp": round(bleu.bp, 4),
        "ratio": round(bleu.sys_len / bleu.ref_len, 4),
        "bpe_ratio": round(sum(map(len, hyp_ids)) / sum(map(len, ref_ids)), 4),
        "at_cap": sum(len(h) >= len(s) + CAP for h, s in zip(hyp_ids, src_ids, strict=True)),
        "ends_with_period": round(sum(h.rstrip().endswith(".") for h in hyps) / len(hyps), 3),
        "empty": sum(not h.strip() for h in hyps),
    }


def greedy_shape(hyp_ids: list[list[int]], study: dict[str, Any]) -> dict[str, Any]:
    """Greedy's BPE length ratio per reference-length bucket, per-sentence quantiles, and the
    eight outputs shortest against their reference."""
    ref_ids, refs, srcs = study["ref_ids"], study["refs"], study["srcs"]
    buckets: dict[int, list[int]] = {}
    for h, r in zip(hyp_ids, ref_ids, strict=True):
        b = buckets.setdefault(min(len(r) // 10, 4), [0, 0, 0])
        b[0], b[1], b[2] = b[0] + len(h), b[1] + len(r), b[2] + 1
    ratios = np.array([len(h) / max(1, len(r)) for h, r in zip(hyp_ids, ref_ids, strict=True)])
    hyps = study["tok"].decode_batch(hyp_ids)
    return {
        "ratio_by_reference_bpe_length": {
            f"{10 * k}-{10 * k + 9 if k < 4 else 'more'}": [round(v[0] / v[1], 3), v[2]]
            for k, v in sorted(buckets.items())
        },
        "sentence_ratio_quantiles_5_25_50_75_95": [
            round(float(q), 3) for q in np.quantile(ratios, [0.05, 0.25, 0.5, 0.75, 0.95])
        ],
        "sentences_below_0.8": int((ratios < 0.8).sum()),
        "shortest": [
            {"src": srcs[i], "ref": refs[i], "greedy": hyps[i]} for i in np.argsort(ratios)[:8]
        ],
    }


@torch.no_grad()
def teacher_forced_eos(model: EncoderDecoder, study: dict[str, Any]) -> dict[str, Any]:
    """Where EOS stands when the model reads the reference prefix (batches of 64)."""
    tok, src_ids, ref_ids = study["tok"], study["src_ids"], study["ref_ids"]
    eos, premature, end_prob, end_argmax = tok.eos_id, 0, [], 0
    for i in range(0, len(src_ids), 64):
        srcs, refs = src_ids[i : i + 64], ref_ids[i : i + 64]
        src = torch.full((len(srcs), max(map(len, srcs)) + 1), tok.pad_id)  # (B, S)
        tgt = torch.full((len(srcs), max(map(len, refs)) + 1), tok.pad_id)  # (B, T)
        for j, (s, r) in enumerate(zip(srcs, refs, strict=True)):
            src[j, : len(s) + 1] = torch.tensor([*s, eos])
            tgt[j, : len(r) + 1] = torch.tensor([tok.bos_id, *r])
        logp = model(src, tgt).float()  # (B, T, V) log-probabilities
        logp[..., [tok.pad_id, tok.bos_id]] = -torch.inf
        for j, r in enumerate(refs):
            rows = logp[j, : len(r) + 1]  # (n + 1, V): rows 0..n-1 predict r, row n predicts EOS
            premature += bool((rows[: len(r)].argmax(-1) == eos).any())
            end_prob.append(float(rows[len(r), eos].exp()))
            end_argmax += int(rows[len(r)].argmax() == eos)
    return {
        "references": len(ref_ids),
        "premature_eos_argmax": premature,
        "eos_argmax_at_true_end": end_argmax,
        "eos_probability_at_true_end_median": round(float(np.median(end_prob)), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("src", help="validation sources")
    p.add_argument("ref", help="validation references")
    p.add_argument("--sentences", type=int, help="the first N only")
    p.add_argument("--alphas", default="0,0.6,1,1.5")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--skip-beam", action="store_true")
    p.add_argument("--out", help="also write everything as one JSON file")
    args = p.parse_args()
    ckpt = load_checkpoint(args.checkpoint, expect=EncoderDecoder)
    model, tok = ckpt.model.eval(), load_translation_tokenizer(ckpt.path)
    srcs = [normalize(x) for x in read_lines(args.src)][: args.sentences]
    refs = [normalize(x) for x in read_lines(args.ref)][: args.sentences]
    study = {"tok": tok, "srcs": srcs, "refs": refs}
    study["src_ids"], study["ref_ids"] = tok.encode_batch(srcs), tok.encode_batch(refs)
    report: dict[str, Any] = {"checkpoint": args.checkpoint, "step": ckpt.state.get("step")}
    report["references_round_trip_exact"] = sum(tok.decode(tok.encode(r)) == r for r in refs)
    report["sentences"] = len(refs)
    print(json.dumps(report), flush=True)
    searches = [("greedy", 1, 0.0)]
    if not args.skip_beam:
        searches += [
            (f"beam {args.beam}, α {a}", args.beam, float(a)) for a in args.alphas.split(",")
        ]
    report["decodes"] = []
    for name, beam, alpha in searches:
        started = time.perf_counter()
        found = translate_ids(
            model, study["src_ids"], tok, DecodeOptions(beam_size=beam, alpha=alpha)
        )
        hyp_ids = [h[0].tokens for h in found]
        row = {**decode_row(name, hyp_ids, study), "seconds": round(time.perf_counter() - started)}
        report["decodes"].append(row)
        print(json.dumps(row), flush=True)
        if beam == 1:
            report["greedy"] = greedy_shape(hyp_ids, study)
            print(json.dumps(report["greedy"], ensure_ascii=False), flush=True)
    report["teacher_forced"] = teacher_forced_eos(model, study)
    print(json.dumps(report["teacher_forced"]), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
