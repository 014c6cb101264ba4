"""Fingerprint short training runs of every trainable family: a refactor must not change them.

Runs ``aiayn train`` for a few dozen steps on each task (translation, language model, masked LM,
text classification, image classification), each on shipped or generated data, and prints one
line per run: the SHA-256 of its last checkpoint's weights and of its ``metrics.jsonl`` with the
wall-clock fields removed. Run it before and after a change; the lines must be equal::

    python scripts/train_fingerprint.py --out /tmp/fp_before.txt
    # … change the code …
    python scripts/train_fingerprint.py --out /tmp/fp_after.txt
    diff /tmp/fp_before.txt /tmp/fp_after.txt
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "src" / "aiayn" / "data" / "demo" / "tatoeba_en_de.tsv.gz"
TIME_KEYS = {"tgt_tokens_per_s", "seconds", "elapsed", "time"}  # wall-clock fields of metrics.jsonl
COMMON = ["train.max_minutes=null", "train.progress=false", "train.log_every=5"]


def _pairs(limit: int) -> list[tuple[str, str]]:
    with gzip.open(DEMO, "rt", encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t")[:2] for line in f]
    return [(en, de) for en, de in rows[:limit]]


def _write_text_data(root: Path) -> dict[str, Path]:
    """MLM lines and a two-label classification set, from the shipped Tatoeba subset."""
    pairs = _pairs(1200)
    mlm = root / "mlm"
    mlm.mkdir()
    (mlm / "train.txt").write_text("\n".join(en for en, _ in pairs[:1000]) + "\n", "utf-8")
    (mlm / "valid.txt").write_text("\n".join(en for en, _ in pairs[1000:]) + "\n", "utf-8")
    cls = root / "cls"
    cls.mkdir()
    rows = [f"{'question' if en.endswith('?') else 'other'}\t{en}" for en, _ in pairs]
    (cls / "train.tsv").write_text("\n".join(rows[:1000]) + "\n", "utf-8")
    (cls / "valid.tsv").write_text("\n".join(rows[1000:]) + "\n", "utf-8")
    return {"mlm": mlm, "cls": cls}


def _runs(root: Path, data: dict[str, Path]) -> dict[str, list[str]]:
    mlm, cls = data["mlm"], data["cls"]
    return {
        "translation": ["--config", str(REPO / "configs/demo.yaml"), "--set", "train.max_steps=30",
                        "--set", "train.eval_every=15", "--set", "train.save_every=15",
                        "--set", "data.valid_size=50", "--set", "data.bleu_sentences=20"],
        "lm": ["--config", str(REPO / "configs/lm_demo.yaml"), "--set", "train.max_steps=30",
               "--set", "train.eval_every=15", "--set", "train.save_every=15"],
        "masked-lm": ["--config", str(REPO / "configs/bert_mlm.yaml"),
                      "--set", f"data.train={mlm / 'train.txt'}",
                      "--set", f"data.valid={mlm / 'valid.txt'}", "--set", "train.max_steps=30",
                      "--set", "train.eval_every=15", "--set", "train.save_every=15"],
        "classification": ["--config", str(REPO / "configs/bert_classify.yaml"),
                           "--set", f"data.train={cls / 'train.tsv'}",
                           "--set", f"data.valid={cls / 'valid.tsv'}", "--set", "data.test=null",
                           "--set", "train.max_steps=30", "--set", "train.eval_every=15",
                           "--set", "train.save_every=15"],
        "vit": ["--config", str(REPO / "configs/vit_digits.yaml"), "--set", "train.max_steps=40",
                "--set", "train.eval_every=20", "--set", "train.save_every=20"],
    }


def _strip_times(value: object) -> object:
    if isinstance(value, dict):
        return {k: _strip_times(v) for k, v in value.items() if k not in TIME_KEYS}
    if isinstance(value, list):
        return [_strip_times(v) for v in value]
    return value


def _tensors_hash(file: Path) -> str:
    """SHA-256 of the tensors by sorted name (not of the file: safetensors may record tied
    tensors' aliases in either order)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(load_file(file).items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _fingerprint(run_dir: Path) -> str:
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics_hash = hashlib.sha256(json.dumps(_strip_times(metrics)).encode()).hexdigest()[:16]
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    weights = _tensors_hash(last / "model.safetensors")
    return f"{last.name} weights {weights} metrics {metrics_hash}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the lines here")
    parser.add_argument("--only", nargs="*", help="run only these tasks")
    args = parser.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for task, argv in _runs(root, _write_text_data(root)).items():
            if args.only and task not in args.only:
                continue
            run_dir = root / f"run_{task}"
            sets = [x for s in COMMON for x in ("--set", s)]
            cmd = [sys.executable, "-m", "aiayn", "train", *argv, *sets, "--set",
                   f"run_dir={run_dir}"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{task}: exit {done.returncode}\n{done.stderr[-2000:]}")
            lines.append(f"{task}: {_fingerprint(run_dir)}")
            print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
