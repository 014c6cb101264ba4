"""Benchmark: train `multi30k_small` for a wall-clock budget, report test_2016_flickr BLEU.

    python benchmarks/train_multi30k.py --data-dir ../shared/data/multi30k --minutes 60

Reports detokenized, cased sacreBLEU (greedy and beam 4) of the last checkpoint and of the
average of the last 5, the wall time and target tokens/s, next to the peer's figure: a plain
torch.nn.Transformer of the same size (d_model 256, 4 heads, d_ff 1024, 3+3 layers, shared 8k
BPE, the paper's recipe with warmup 4000) trained 60 minutes on a 2-core CPU: 34.6 BLEU greedy.
Writes docs/results/multi30k_small.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, command_line, machine, write_report
from aiayn.data import Tokenizer
from aiayn.decoding.translate import DecodeOptions, translate_texts
from aiayn.evaluation import corpus_bleu, corpus_chrf
from aiayn.training.checkpoint import load_checkpoint
from aiayn.training.config import load_run_config
from aiayn.training.trainer import train

PEER_BLEU = 34.6  # torch.nn.Transformer, same size, 60 min on this 2-core CPU (issue #3)


def main() -> None:
    """Train, score, and write the results table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", required=True, help="folder with the Multi30k .gz files")
    parser.add_argument("--minutes", type=float, default=60.0, help="training wall-clock budget")
    parser.add_argument("--run-dir", default="runs/bench_multi30k_small")
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi30k_small.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    d = Path(args.data_dir)
    overrides = [
        f"run_dir={args.run_dir}",
        f"train.max_minutes={args.minutes}",
        f"data.train_src={d / 'train.en.gz'}",
        f"data.train_tgt={d / 'train.de.gz'}",
        f"data.valid_src={d / 'val.en.gz'}",
        f"data.valid_tgt={d / 'val.de.gz'}",
        f"data.test_src={d / 'test_2016_flickr.en.gz'}",
        f"data.test_tgt={d / 'test_2016_flickr.de.gz'}",
        *args.overrides,
    ]
    config = load_run_config(args.config, overrides)
    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started

    from aiayn.data import read_parallel

    test = read_parallel(d / "test_2016_flickr.en.gz", d / "test_2016_flickr.de.gz")
    sources, refs = [s for s, _ in test], [t for _, t in test]
    rows = {}
    for label, path in (
        ("last checkpoint", result.final_checkpoint),
        ("average of last 5", result.averaged_checkpoint),
    ):
        if path is None:
            continue
        ckpt = load_checkpoint(path)
        tokenizer = Tokenizer.load(ckpt.tokenizer_path)
        for search, options in (
            ("greedy", DecodeOptions(beam_size=1)),
            ("beam 4, α 0.6", DecodeOptions(beam_size=4, alpha=0.6)),
        ):
            hyps = translate_texts(ckpt.model, tokenizer, sources, options)
            rows[f"{label}, {search}"] = {
                "bleu": corpus_bleu(hyps, refs).score,
                "chrf": corpus_chrf(hyps, refs).score,
            }
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    rates = [m["tgt_tokens_per_s"] for m in metrics if m["kind"] == "train"]
    report = {
        "command": command_line(),
        "machine": machine(),
        "training_minutes": result.minutes,
        "wall_minutes_incl_data_and_eval": wall / 60,
        "steps": result.steps,
        "median_tgt_tokens_per_s": statistics.median(rates) if rates else None,
        "test_2016_flickr": rows,
        "signature": corpus_bleu(["a"], ["a"]).signature,
        "peer_bleu_greedy": PEER_BLEU,
    }
    lines = [
        "| aiayn small (60 min) | BLEU | chrF | vs. peer's 34.6 (greedy) |",
        "|---|---|---|---|",
        *(
            f"| {k} | {v['bleu']:.1f} | {v['chrf']:.1f} | {v['bleu'] - PEER_BLEU:+.1f} |"
            for k, v in rows.items()
        ),
    ]
    write_report("multi30k_small", report, [f"`{report['command']}`", "", *lines])
    print(json.dumps(report, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
