"""Train a small T5 from scratch on Multi30k EN→DE for a few minutes, so that
``aiayn attention --bias`` has a *trained* relative position bias to draw (no pretrained T5
weights are reachable offline). aiayn's trainer does not train T5 (the family registers no
training task), so this is a plain teacher-forced loop: Adam with a linear warm-up and 1/√step
decay (§5.3), label smoothing 0.1 (§5.4), batches of sentences sorted by length. The two
relative position biases start at 0 (T5 draws them at random), so that what the picture shows
was learned.

    python benchmarks/train_t5_bias.py --data-dir ../shared/data/multi30k --out /tmp/t5_m30k \\
        --minutes 8
    aiayn attention --checkpoint /tmp/t5_m30k --bias docs/images/t5_bias_trained.png

The tokenizer is a SentencePiece unigram model of 4,000 pieces trained here on the training
sentences (pad 0, EOS 1, unk 2, as T5's), saved in the checkpoint as a T5 tokenizer
(``spiece.model``), so that ``aiayn translate --prefix "translate English to German: "`` and
``aiayn explain --checkpoint`` read it. Prints the loss as it goes and a few greedy translations.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from aiayn.checkpoint import save_checkpoint
from aiayn.convert.t5 import t5_tokenizer_from_hf
from aiayn.models.t5 import T5, T5Config

PREFIX = "translate English to German: "
VOCAB = 4000


def read_pairs(data_dir: Path, split: str) -> list[tuple[str, str]]:
    """The (English, German) sentence pairs of a Multi30k split."""
    sides = []
    for lang in ("en", "de"):
        with gzip.open(data_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
            sides.append(handle.read().splitlines())
    return list(zip(*sides, strict=True))


def train_tokenizer(pairs: list[tuple[str, str]], folder: Path) -> object:
    """A T5-style SentencePiece model of the training sentences, as a T5 tokenizer."""
    import sentencepiece as spm

    lines = [PREFIX + en for en, _ in pairs] + [de for _, de in pairs]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(folder / "spiece"), vocab_size=VOCAB,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, num_threads=1,
        minloglevel=2,
    )  # fmt: skip
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "extra_ids": 0}
    (folder / "tokenizer_config.json").write_text(json.dumps(special))
    tokenizer = t5_tokenizer_from_hf(folder)
    assert tokenizer is not None
    return tokenizer


def batches(ids: list[tuple[list[int], list[int]]], size: int, rng: random.Random) -> list:
    """Sentences sorted by length, cut into batches of ``size``, in random order."""
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i][0]), rng.random()))
    chunks = [order[i : i + size] for i in range(0, len(order), size)]
    rng.shuffle(chunks)
    return chunks


def pad(rows: list[list[int]]) -> torch.Tensor:
    """Right-padded (B, L) ids (pad 0)."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    pairs = read_pairs(args.data_dir, "train")
    folder = Path(tempfile.mkdtemp(prefix="t5_tokenizer_"))
    tokenizer = train_tokenizer(pairs, folder)
    eos = tokenizer.eos_id  # type: ignore[attr-defined]
    src = tokenizer.encode_batch([PREFIX + en for en, _ in pairs])  # type: ignore[attr-defined]
    tgt = tokenizer.encode_batch([de for _, de in pairs])  # type: ignore[attr-defined]
    data = [([*s[:60], eos], [*t[:60], eos]) for s, t in zip(src, tgt, strict=True)]
    config = T5Config(
        vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=512, num_heads=4, num_encoder_layers=3,
        num_decoder_layers=3, dropout=0.1,
    )  # fmt: skip
    model = T5(config)
    with torch.no_grad():  # the bias starts at 0: all the picture shows is learned
        for stack in (model.encoder, model.decoder):
            assert stack.position_bias is not None
            stack.position_bias.embedding.weight.zero_()
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    warmup = 400
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 2e-3 * min((s + 1) / warmup, math.sqrt(warmup / (s + 1)))
    )
    rng, step, start = random.Random(0), 0, time.monotonic()
    model.train()
    while time.monotonic() - start < 60 * args.minutes:
        for chunk in batches(data, args.batch, rng):
            sources = pad([data[i][0] for i in chunk])  # (B, S)
            targets = pad([data[i][1] for i in chunk])  # (B, T)
            decoder_in = F.pad(targets[:, :-1], (1, 0), value=config.pad_id)  # start: pad
            log_probs = model(sources, decoder_in)  # (B, T, V)
            loss = (
                F.nll_loss(log_probs.transpose(1, 2), targets, ignore_index=config.pad_id) * 0.9
                - 0.1 * log_probs.mean(-1)[targets != config.pad_id].mean()
            )
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step % 50 == 0:
                minutes = (time.monotonic() - start) / 60
                print(f"step {step}: loss {loss.item():.3f} ({minutes:.1f} min)", flush=True)
            if time.monotonic() - start >= 60 * args.minutes:
                break
    model.eval()
    save_checkpoint(args.out, model, {"step": step, "minutes": args.minutes}, tokenizer)  # type: ignore[arg-type]
    print(f"wrote {args.out} after {step} steps")


if __name__ == "__main__":
    main()
