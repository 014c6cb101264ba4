"""Benchmark: what ``--quantize int8`` costs in accuracy, against fp32, row by row of the gates
in docs/quantization.md. Each row runs when its checkpoint is given:

    python benchmarks/quantize_accuracy.py \\
        --bert DIR          # a BERT sentence-embedding checkpoint (e.g. all-MiniLM-L6-v2,
                            #   converted): cosine of int8 to fp32 embeddings (gate: >= 0.99)
        --lm DIR --lm-text FILE     # a GPT-2 checkpoint (aiayn train --demo lm): perplexity
                                    #   on FILE (gate: within 1%)
        --translation DIR   # a model of configs/multi30k_small.yaml: BLEU on test_2016_flickr,
                            #   greedy and beam 4 (gate: at most 0.3 lower)
        --seq2seq DIR ...   # converted T5 / Marian checkpoints: share of outputs identical to
                            #   fp32 (greedy) on the source sentences
        --vit DIR           # a ViT digits checkpoint (aiayn train --config
                            #   configs/vit_digits.yaml): accuracy on the test split its
                            #   training held out (gate: within 0.5 points), and the share of
                            #   test images given the same label in int8 and fp32
        [--data ../shared/data/multi30k] [--sentences 1000] [--threads 2]

Sentences: Multi30k's test_2016_flickr (English side for the BERT and seq2seq rows, with its
German references for BLEU). The ViT row takes the digits' test split and its accuracy from the
training's own code (:mod:`aiayn.training.images`, as ``aiayn train`` reports it at the end), with
the split settings the checkpoint's ``run_config`` records. Both sides load the same checkpoint:
fp32 as stored, int8 quantised as it loads (``load_checkpoint(quantize="int8")``). Writes
docs/results/quantize_accuracy.md and results/quantize_accuracy.json.gz (``--name``: another
report name).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, command_line, machine, write_report
from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint, load_translation_tokenizer
from aiayn.data.digits import ImageSet
from aiayn.data.lm import TextBlocks, read_documents, token_stream
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding.translate import options_for_checkpoint, translate_texts
from aiayn.errors import UserError
from aiayn.evaluation.bleu import corpus_bleu
from aiayn.evaluation.perplexity import block_metrics
from aiayn.inference.encoder_tasks import sentence_embeddings
from aiayn.models import BERT, GPT2
from aiayn.models.transformer import EncoderDecoder
from aiayn.models.vit import ViT
from aiayn.training.config import run_config_from_dict
from aiayn.training.images import ImageClassificationTask, ImageData, image_metrics

MODES = ("none", "int8")


def _lines(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def bert_row(folder: str, sentences: list[str]) -> dict[str, Any]:
    """Cosine of each sentence's int8 embedding to its fp32 one (both L2-normalised)."""
    vectors = []
    for mode in MODES:
        ckpt = load_checkpoint(folder, expect=BERT, command="embed", quantize=mode)
        tokenizer = checkpoint_tokenizer(ckpt.path)
        vectors.append(sentence_embeddings(ckpt.model, tokenizer, sentences))  # (N, D)
    cosine = (vectors[0] * vectors[1]).sum(dim=1)  # (N,)
    return {
        "row": "BERT sentence embeddings: cosine int8 to fp32",
        "checkpoint": folder,
        "sentences": len(sentences),
        "mean": cosine.mean().item(),
        "min": cosine.min().item(),
        "gate": "min >= 0.99",
        "met": bool(cosine.min().item() >= 0.99),
    }


def lm_row(folder: str, text: str) -> dict[str, Any]:
    """Perplexity of the language model on ``text``, fp32 and int8."""
    ppl = {}
    for mode in MODES:
        ckpt = load_checkpoint(folder, expect=GPT2, command="generate", quantize=mode)
        tokenizer = load_lm_tokenizer(ckpt.path)
        config = ckpt.model.config
        stream = token_stream(read_documents(text), tokenizer, config.eos_id)
        blocks = TextBlocks(stream, config.max_len, keep_tail=True)
        ppl[mode] = block_metrics(ckpt.model, blocks, 4096)["ppl"]
    change = ppl["int8"] / ppl["none"] - 1
    return {
        "row": "LM demo perplexity",
        "checkpoint": folder,
        "text": text,
        "fp32": ppl["none"],
        "int8": ppl["int8"],
        "relative change": change,
        "gate": "abs(change) <= 1%",
        "met": bool(abs(change) <= 0.01),
    }


def _decode(folder: str, mode: str, sources: list[str], beam: int) -> list[str]:
    ckpt = load_checkpoint(folder, expect=EncoderDecoder, command="translate", quantize=mode)
    options = options_for_checkpoint(ckpt.state.get("generation"), beam_size=beam)
    tokenizer = load_translation_tokenizer(ckpt.path)
    return translate_texts(ckpt.model, tokenizer, sources, options)


def translation_rows(folder: str, sources: list[str], refs: list[str]) -> list[dict[str, Any]]:
    """BLEU (sacreBLEU, detokenized, cased) of fp32 and int8, greedy and beam 4."""
    rows = []
    for beam in (1, 4):
        hyps = {mode: _decode(folder, mode, sources, beam) for mode in MODES}
        bleu = {mode: corpus_bleu(hyps[mode], refs).score for mode in MODES}
        same = sum(a == b for a, b in zip(hyps["none"], hyps["int8"], strict=True))
        rows.append(
            {
                "row": f"Multi30k test_2016_flickr BLEU, {'greedy' if beam == 1 else 'beam 4'}",
                "checkpoint": folder,
                "sentences": len(sources),
                "fp32": bleu["none"],
                "int8": bleu["int8"],
                "loss": bleu["none"] - bleu["int8"],
                "identical outputs": same / len(sources),
                "gate": "loss <= 0.3 BLEU",
                "met": bool(bleu["none"] - bleu["int8"] <= 0.3),
            }
        )
    return rows


def seq2seq_row(folder: str, sources: list[str]) -> dict[str, Any]:
    """Share of greedy outputs of a converted T5 / Marian identical in int8 and fp32."""
    hyps = {mode: _decode(folder, mode, sources, 1) for mode in MODES}
    same = sum(a == b for a, b in zip(hyps["none"], hyps["int8"], strict=True))
    family = load_checkpoint(folder, expect=nn.Module).family
    return {
        "row": f"converted {family}: greedy outputs identical to fp32",
        "checkpoint": folder,
        "sentences": len(sources),
        "identical": same / len(sources),
        "gate": "reported",
        "met": True,
    }


def digits_test_split(folder: str) -> tuple[ImageData, int]:
    """The digits split a ViT checkpoint's training built (from the ``run_config`` its
    ``state.json`` records, by :meth:`ImageClassificationTask.prepare_data`), and the batch size
    (images) its final test ran with.

    Raises:
        UserError: the checkpoint records no run config or no test split, or its preprocessing
            is not the one the split's training images give (not trained on this split).
    """
    ckpt = load_checkpoint(folder, expect=ViT, command="classify-image")
    saved = ckpt.state.get("run_config")
    if not isinstance(saved, dict):
        raise UserError(f"{ckpt.path} records no run_config: not a checkpoint of aiayn train")
    run = run_config_from_dict(saved)
    data = ImageClassificationTask(run, log=lambda line: None).prepare_data(
        ckpt.path, reuse_tokenizer=True
    )
    assert isinstance(data, ImageData)
    if data.test is None:
        raise UserError(f"{ckpt.path} was trained without a test split (data.test_size 0)")
    if checkpoint_tokenizer(ckpt.path) != data.preprocessor:
        raise UserError(f"{ckpt.path}'s preprocessing is not that of its run's training split")
    return data, run.train.max_tokens


def predicted_labels(model: ViT, images: ImageSet, max_tokens: int) -> torch.Tensor:
    """(N,) the top label of each image, in the batches of ``max_tokens`` images that
    :func:`image_metrics` runs."""
    labels = []
    with torch.no_grad():
        for pixels in images.pixels.split(max_tokens):  # (B, C, H, W)
            logits = model(pixels).logits  # (B, K)
            assert logits is not None  # a digits model has its classifier
            labels.append(logits.argmax(dim=-1))  # (B,)
    return torch.cat(labels)  # (N,)


def vit_row(folder: str) -> dict[str, Any]:
    """Test-split accuracy (%) of a ViT digits checkpoint, fp32 and int8, by the training's
    final test (:func:`image_metrics`), and the share of images whose label is the same in both.
    """
    data, max_tokens = digits_test_split(folder)
    assert data.test is not None
    accuracy, labels = {}, {}
    for mode in MODES:
        model = load_checkpoint(folder, expect=ViT, command="classify-image", quantize=mode).model
        accuracy[mode] = image_metrics(model, data.test, max_tokens)["accuracy"]
        labels[mode] = predicted_labels(model, data.test, max_tokens)
        right = (labels[mode] == data.test.labels).sum().item()
        if abs(100 * right / len(data.test) - accuracy[mode]) > 1e-9:  # the same forward twice
            raise RuntimeError(f"{mode}: {right} right labels, accuracy {accuracy[mode]}%")
    change = accuracy["int8"] - accuracy["none"]
    return {
        "row": "ViT digits test accuracy (%)",
        "checkpoint": folder,
        "images": len(data.test),
        "fp32": accuracy["none"],
        "int8": accuracy["int8"],
        "change (points)": change,
        "same label": (labels["none"] == labels["int8"]).float().mean().item(),
        "gate": "abs(change) <= 0.5 points",
        "met": bool(abs(change) <= 0.5),
    }


def _markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    def cell(row: dict[str, Any]) -> str:
        shown = {k: v for k, v in row.items() if k not in ("row", "checkpoint", "gate", "met")}
        return ", ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items()
        )

    return [
        "# Int8 quantisation: accuracy against fp32",
        "",
        f"`{command_line()}` — {info['cpu']}, {info['torch_threads']} threads, torch "
        f"{info['torch']}; load average (1 min) {info['load'][0]:.2f} at the start, "
        f"{info['load'][1]:.2f} at the end",
        "",
        "| gate | checkpoint | measured | goal | met |",
        "|---|---|---|---|---|",
        *(
            f"| {r['row']} | {r['checkpoint']} | {cell(r)} | {r['gate']} | "
            f"{'yes' if r['met'] else 'no'} |"
            for r in rows
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bert")
    parser.add_argument("--lm")
    parser.add_argument("--lm-text")
    parser.add_argument("--translation")
    parser.add_argument("--seq2seq", nargs="*", default=[])
    parser.add_argument("--vit")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--name", default="quantize_accuracy", help="report name (NAME.md, NAME.json.gz)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = Path(args.data)
    english = _lines(data / "test_2016_flickr.en.gz", args.sentences)
    rows: list[dict[str, Any]] = []
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    if args.bert:
        rows.append(bert_row(args.bert, english))
    if args.lm:
        if not args.lm_text:
            parser.error("--lm needs --lm-text")
        rows.append(lm_row(args.lm, args.lm_text))
    if args.translation:
        german = _lines(data / "test_2016_flickr.de.gz", args.sentences)
        rows.extend(translation_rows(args.translation, english, german))
    rows.extend(seq2seq_row(folder, english) for folder in args.seq2seq)
    if args.vit:
        rows.append(vit_row(args.vit))
    for row in rows:
        print(row, flush=True)
    info = {**machine(), "load": [load_start, os.getloadavg()[0]]}
    data_out = {"machine": info, "seconds": time.perf_counter() - start, "rows": rows}
    print(write_report(args.name, data_out, _markdown(rows, info)))


if __name__ == "__main__":
    main()
