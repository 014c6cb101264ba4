"""Translate sentences with a trained encoder–decoder: batching by length, greedy or beam search,
results in input order.

Shape legend:  B sentences in a batch   S source length
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from aiayn.data import TokenBatchSampler, Tokenizer, normalize
from aiayn.decoding.beam import Hypothesis, beam_search
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.inference import InferenceStep
from aiayn.decoding.packed import pack_for_inference
from aiayn.errors import UserError
from aiayn.models import Transformer


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode (§6.1 defaults: beam 4, α = 0.6, output ≤ input length + 50).

    Attributes:
        beam_size: K; 1 = greedy search.
        alpha: α of the GNMT length penalty (see :mod:`aiayn.decoding.beam`).
        extra_len: maximum output length = source length + ``extra_len``.
        min_len: no EOS before this many output tokens.
        n_best: hypotheses returned per sentence (≤ beam_size).
        max_tokens: source-token budget of one batch.
        max_src_tokens: longer sources are truncated with a warning (None = the model's limit).
        pack: on CPU, decode with a copy of the model whose linear layers are packed for
            oneDNN (:func:`~aiayn.decoding.packed.pack_for_inference`; same fp32 arithmetic up
            to summation order; its speed against PyTorch's linears is measured by
            ``benchmarks/decode_vs_hf.py``, docs/benchmarks.md). Ignored on GPU.
    """

    beam_size: int = 4
    alpha: float = 0.6
    extra_len: int = 50
    min_len: int = 0
    n_best: int = 1
    max_tokens: int = 4096
    max_src_tokens: int | None = None
    pack: bool = True

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise UserError(f"beam size must be >= 1, got {self.beam_size}")
        if not 1 <= self.n_best <= self.beam_size:
            raise UserError(f"n-best must be between 1 and the beam size, got {self.n_best}")
        if self.max_tokens < 1:
            raise UserError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.alpha < 0:
            raise UserError(f"alpha must be >= 0, got {self.alpha}")


@torch.no_grad()
def translate_ids(
    model: Transformer,
    sources: Sequence[Sequence[int] | np.ndarray],
    tokenizer: Tokenizer,
    options: DecodeOptions = DecodeOptions(),
    *,
    progress: bool = False,
) -> list[list[Hypothesis]]:
    """Decode encoded sentences (ids without specials); n-best lists in input order.

    Decodes with :class:`~aiayn.decoding.inference.InferenceStep` (the model's decoder,
    flattened for inference). Greedy hypotheses (beam 1) carry ``log_prob = score = nan``.
    Empty sources give one empty hypothesis without running the model.
    """
    model.eval()
    device = next(model.parameters()).device
    if options.pack:
        model = pack_for_inference(model)  # the same model where packing does not apply
    step = InferenceStep(model)  # once: every batch decodes with it
    limit = options.max_src_tokens or model.config.max_len - 1
    rows: list[list[int]] = []
    for i, source in enumerate(sources):
        ids = [int(x) for x in source]
        if len(ids) > limit:
            warnings.warn(
                f"sentence {i + 1} has {len(ids)} subword tokens; truncated to {limit}",
                stacklevel=2,
            )
            ids = ids[:limit]
        rows.append(ids)
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in rows]
    todo = [i for i, r in enumerate(rows) if r]
    lengths = np.array([len(rows[i]) for i in todo], dtype=np.int64)  # the sampler adds EOS
    budget = max(1, options.max_tokens // options.beam_size)  # K rows per sentence
    sampler = TokenBatchSampler(lengths, lengths, budget, seed=0, shuffle=False)
    batches = sampler.batches(0) if todo else []
    bar = _progress(len(todo), progress)
    for batch in batches:
        ids = [todo[j] for j in batch]
        width = max(len(rows[i]) for i in ids) + 1
        src = torch.full((len(ids), width), tokenizer.pad_id, dtype=torch.long)  # (B, S)
        for r, i in enumerate(ids):
            src[r, : len(rows[i]) + 1] = torch.tensor([*rows[i], tokenizer.eos_id])
        src = src.to(device)
        max_len = [len(rows[i]) + options.extra_len for i in ids]
        if model.config.positional == "learned":
            max_len = [min(m, model.config.max_len - 1) for m in max_len]
        state = step.initial_state(src, capacity=max(max_len) + 1)  # positions incl. EOS's
        if options.beam_size == 1:
            outs = greedy_search(
                step,
                state,
                bos_id=tokenizer.bos_id,
                eos_id=tokenizer.eos_id,
                max_len=torch.tensor(max_len, device=device),
                batch_size=len(ids),
                min_len=options.min_len,
                device=device,
            )
            hyps = [[Hypothesis(o, math.nan, math.nan)] for o in outs]
        else:
            hyps = beam_search(
                step,
                state,
                batch_size=len(ids),
                beam_size=options.beam_size,
                bos_id=tokenizer.bos_id,
                eos_id=tokenizer.eos_id,
                max_len=torch.tensor(max_len, device=device),
                min_len=options.min_len,
                alpha=options.alpha,
                n_best=options.n_best,
                device=device,
            )
        for i, h in zip(ids, hyps, strict=True):
            results[i] = h
        bar.update(len(ids))
    bar.close()
    return results


def translate_texts(
    model: Transformer,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    options: DecodeOptions = DecodeOptions(beam_size=1),
    *,
    progress: bool = False,
) -> list[str]:
    """Translate raw sentences (whitespace-normalised); the best hypothesis of each, detokenized."""
    ids = tokenizer.encode_batch([normalize(t) for t in texts])
    best = [h[0].tokens for h in translate_ids(model, ids, tokenizer, options, progress=progress)]
    return tokenizer.decode_batch(best)


def _progress(total: int, enabled: bool):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit="sent", dynamic_ncols=True)
