"""Translate sentences with a trained encoder–decoder: batching by length, greedy or beam search,
results in input order.

Shape legend:  B sentences in a batch   S source length
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import torch
from torch import Tensor

from aiayn.data import TokenBatchSampler, normalize
from aiayn.data.pretrained_tokenizer import TranslationTokenizer
from aiayn.decoding.beam import Hypothesis, beam_search
from aiayn.decoding.fast_step import InferenceStep
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.step import DecoderState, StepFunction
from aiayn.errors import UserError
from aiayn.inference.packed import pack_for_inference
from aiayn.limits import MAX_BEAM_SIZE
from aiayn.models.transformer import EncoderDecoder
from aiayn.validation import (
    Bounds,
    Choice,
    NonNegativeInt,
    PenaltyAlpha,
    PositiveInt,
    validate,
    validated,
)


@validated(None)
@dataclass(frozen=True)
class DecodeOptions:
    """How to decode (§6.1 defaults: beam 4, α = 0.6, output ≤ input length + 50).

    Attributes:
        beam_size: K; 1 = greedy search.
        alpha: α of the length penalty (see :mod:`aiayn.decoding.beam`).
        length_penalty: the beam search's rules: ``"gnmt"`` (the paper's: GNMT penalty, EOS
            forced at the limit) or ``"hf"`` (Hugging Face ``generate``'s: log P / |Y|^α, the
            limit counts EOS, its ``early_stopping``); converted models use ``"hf"``.
        early_stopping: Hugging Face's stopping rule (``"hf"`` only): True, False or "never".
        forced_eos: Hugging Face's ``forced_eos_token_id`` (``"hf"`` only): EOS forced at the
            last position the limit allows.
        extra_len: maximum output length = source length + ``extra_len`` (tokens, EOS excluded
            for "gnmt", included for "hf").
        max_new_tokens: a cap on that maximum whatever the source length (Hugging Face's
            ``max_length`` − 1), or None.
        min_len: no EOS before this many output tokens.
        n_best: hypotheses returned per sentence (≤ beam_size).
        max_tokens: source-token budget of one batch.
        max_src_tokens: longer sources are truncated with a warning (None = the model's limit).
        banned: tokens never produced; None = the tokenizer's PAD and BOS (aiayn's own
            vocabularies; a converted model records its own, e.g. OPUS-MT bans its pad id).
        renormalize: log-softmax again after banning (Hugging Face's ``renormalize_logits``).
        pack: on CPU, decode with a copy of the model whose linear layers are packed for
            oneDNN (:func:`~aiayn.inference.packed.pack_for_inference`; same fp32 arithmetic up
            to summation order; its speed against PyTorch's linears is measured by
            ``benchmarks/decode_vs_hf.py``, docs/benchmarks.md). Ignored on GPU.
    """

    beam_size: Annotated[int, Bounds(ge=1, le=MAX_BEAM_SIZE)] = 4  # aiayn.limits
    alpha: PenaltyAlpha = 0.6
    length_penalty: Annotated[str, Choice(("gnmt", "hf"))] = "gnmt"
    early_stopping: Annotated[bool | str, Choice((True, False, "never"))] = True
    forced_eos: bool = False
    extra_len: NonNegativeInt = 50
    max_new_tokens: PositiveInt | None = None
    min_len: NonNegativeInt = 0
    n_best: PositiveInt = 1
    max_tokens: PositiveInt = 4096
    max_src_tokens: PositiveInt | None = None
    banned: tuple[NonNegativeInt, ...] | None = None
    renormalize: bool = False
    pack: bool = True

    def __post_init__(self) -> None:
        validate(self)
        if self.n_best > self.beam_size:
            raise UserError(
                f"n_best must be between 1 and {self.beam_size} (the beam size), got {self.n_best}"
            )
        if self.length_penalty == "gnmt" and (self.early_stopping is not True or self.forced_eos):
            raise UserError("early stopping and forced EOS are rules of the 'hf' length penalty")


def options_for_checkpoint(generation: Mapping[str, Any] | None, **given: Any) -> DecodeOptions:
    """Decoding options for a checkpoint: the values ``given`` (None = not given), else the
    converted model's recorded generation settings (Hugging Face's rules: ``"hf"`` length
    penalty, its beams, α, stopping rule, length cap, banned ids, forced EOS), else the paper's
    defaults (§6.1)."""
    chosen = {k: v for k, v in given.items() if v is not None}
    if generation is None:
        return DecodeOptions(**chosen)
    g = generation
    max_length, stopping = g.get("max_length"), g.get("early_stopping")
    recorded: dict[str, Any] = {
        "beam_size": g.get("num_beams") or 1,  # transformers' default: greedy
        "alpha": 1.0 if g.get("length_penalty") is None else g["length_penalty"],
        "length_penalty": "hf",
        "early_stopping": "never" if stopping == "never" else bool(stopping),
        "forced_eos": bool(g.get("forced_eos")),
        "max_new_tokens": None if max_length is None else max(1, max_length - 1),
        "banned": tuple(g.get("banned_ids") or ()),
        "renormalize": bool(g.get("renormalize_logits")),
    }
    if chosen.get("length_penalty") == "gnmt":  # the paper's rules: drop Hugging Face's
        recorded.update(early_stopping=True, forced_eos=False, alpha=0.6)
    return DecodeOptions(**{**recorded, **chosen})


def translate_ids(
    model: EncoderDecoder,
    sources: Sequence[Sequence[int] | np.ndarray],
    tokenizer: TranslationTokenizer,
    options: DecodeOptions = DecodeOptions(),
    *,
    progress: bool = False,
) -> list[list[Hypothesis]]:
    """Decode encoded sentences (ids without specials); n-best lists in input order.

    Decodes with :class:`~aiayn.decoding.fast_step.InferenceStep` (the model's decoder,
    flattened for inference), from the tokenizer's ``bos_id`` (a converted model's decoder start
    token) to its ``eos_id``; each source gets the tokenizer's EOS appended. Greedy hypotheses
    (beam 1) carry ``log_prob = score = nan``. Empty sources give one empty hypothesis without
    running the model. :func:`translate_stream` gives them one by one as they are ready.
    """
    return list(translate_stream(model, sources, tokenizer, options, progress=progress))


@torch.no_grad()
def translate_stream(
    model: EncoderDecoder,
    sources: Sequence[Sequence[int] | np.ndarray],
    tokenizer: TranslationTokenizer,
    options: DecodeOptions = DecodeOptions(),
    *,
    progress: bool = False,
) -> Iterator[list[Hypothesis]]:
    """:func:`translate_ids`'s n-best lists, in input order, each given as soon as it and every
    sentence before it are translated: batches go by length, so after each batch the longest
    finished prefix of the input is given. The results are :func:`translate_ids`'s exactly.
    The progress bar is closed before an error leaves (nothing is drawn after it)."""
    model.eval()
    device = next(model.parameters()).device
    if options.pack:
        model = pack_for_inference(model)  # the same model where packing does not apply
    banned = (tokenizer.pad_id, tokenizer.bos_id) if options.banned is None else options.banned
    step = InferenceStep(model, banned=banned, renormalize=options.renormalize)  # every batch's
    rows = _truncated(sources, options.max_src_tokens or model.config.max_len - 1)
    pending = {i: [Hypothesis([], 0.0, 0.0)] for i, r in enumerate(rows) if not r}  # not given
    todo = [i for i, r in enumerate(rows) if r]
    lengths = np.array([len(rows[i]) for i in todo], dtype=np.int64)  # the sampler adds EOS
    budget = max(1, options.max_tokens // options.beam_size)  # K rows per sentence
    sampler = TokenBatchSampler(lengths, lengths, budget, seed=0, shuffle=False)
    bar = _progress(len(todo), progress)
    done = 0  # sentences 0 .. done - 1 have been given
    try:
        batches: list[list[int]] = [[], *(sampler.batches(0) if todo else [])]  # [] first:
        for batch in batches:  # it gives the empty sentences that lead the input
            ids = [todo[j] for j in batch]
            if ids:
                batch_args = (model, step, rows, ids, tokenizer, options, device)
                pending.update(zip(ids, _translate_batch(*batch_args), strict=True))
            bar.update(len(ids))
            while done in pending:  # the finished prefix of the input, in order
                yield pending.pop(done)
                done += 1
    finally:
        bar.close()


def _translate_batch(
    model: EncoderDecoder,
    step: InferenceStep,
    rows: list[list[int]],
    ids: list[int],
    tokenizer: TranslationTokenizer,
    options: DecodeOptions,
    device: torch.device,
) -> list[list[Hypothesis]]:
    """The n-best lists of the sentences ``ids`` of ``rows``, one batch (no gradients: the
    caller, :func:`translate_stream`, runs under ``torch.no_grad``)."""
    src = source_batch([rows[i] for i in ids], tokenizer).to(device)  # (B, S)
    limits = output_limits(model, options, [len(rows[i]) for i in ids])
    state = step.initial_state(src, capacity=max(limits) + 1)  # positions incl. EOS's
    return search_batch(step, state, tokenizer, options, limits, device)


def _truncated(sources: Sequence[Sequence[int] | np.ndarray], limit: int) -> list[list[int]]:
    """The sources as lists, each cut to ``limit`` tokens with a warning naming it."""
    rows: list[list[int]] = []
    for i, source in enumerate(sources):
        ids = [int(x) for x in source]
        if len(ids) > limit:
            warnings.warn(
                f"sentence {i + 1} has {len(ids)} subword tokens; truncated to {limit}",
                stacklevel=3,
            )
            ids = ids[:limit]
        rows.append(ids)
    return rows


def source_batch(rows: list[list[int]], tokenizer: TranslationTokenizer) -> Tensor:
    """(B, S) source ids, each row followed by EOS and right-padded."""
    src = torch.full((len(rows), max(map(len, rows)) + 1), tokenizer.pad_id, dtype=torch.long)
    for r, ids in enumerate(rows):
        src[r, : len(ids) + 1] = torch.tensor([*ids, tokenizer.eos_id])
    return src


def output_limits(model: EncoderDecoder, options: DecodeOptions, lengths: list[int]) -> list[int]:
    """Each sentence's most output tokens: source length + ``extra_len``, within the learned
    positions and ``max_new_tokens``."""
    limits = [n + options.extra_len for n in lengths]
    positions = model.config.max_positions
    if positions is not None:
        limits = [min(m, positions - 1) for m in limits]
    if options.max_new_tokens is not None:
        limits = [min(m, options.max_new_tokens) for m in limits]
    return limits


def search_batch(
    step: StepFunction,
    state: DecoderState,
    tokenizer: TranslationTokenizer,
    options: DecodeOptions,
    limits: list[int],
    device: torch.device,
) -> list[list[Hypothesis]]:
    """Greedy (beam 1) or beam search of one batch."""
    ends: dict[str, Any] = {
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "batch_size": len(limits),
    }
    if options.beam_size == 1:
        # Hugging Face's forced EOS takes the last position the limit allows
        cut = 1 if options.forced_eos else 0
        max_len = torch.tensor([max(0, m - cut) for m in limits], device=device)
        outs = greedy_search(
            step, state, **ends, max_len=max_len, min_len=options.min_len, device=device
        )
        return [[Hypothesis(o, math.nan, math.nan)] for o in outs]
    return beam_search(
        step,
        state,
        **ends,
        max_len=torch.tensor(limits, device=device),
        device=device,
        **beam_arguments(options),
    )


def beam_arguments(options: DecodeOptions) -> dict[str, Any]:
    """The rules of the beam search that ``options`` ask for: the keyword arguments of
    :func:`~aiayn.decoding.beam.beam_search` and
    :class:`~aiayn.decoding.beam.SteppedBeamSearch` (``aiayn serve``'s)."""
    o = options
    return {
        "beam_size": o.beam_size,
        "min_len": o.min_len,
        "alpha": o.alpha,
        "n_best": o.n_best,
        "length_penalty": o.length_penalty,
        "early_stopping": o.early_stopping,
        "forced_eos": o.forced_eos,
    }


def translate_texts(
    model: EncoderDecoder,
    tokenizer: TranslationTokenizer,
    texts: Sequence[str],
    options: DecodeOptions = DecodeOptions(beam_size=1),
    *,
    prefix: str = "",
    progress: bool = False,
) -> list[str]:
    """Translate raw sentences (whitespace-normalised, after ``prefix``: T5's task prefix such as
    "translate English to German: "); the best hypothesis of each, detokenized."""
    ids = tokenizer.encode_batch([with_prefix(prefix, normalize(t)) for t in texts])
    best = [h[0].tokens for h in translate_ids(model, ids, tokenizer, options, progress=progress)]
    return tokenizer.decode_batch(best)


def with_prefix(prefix: str, text: str) -> str:
    """``prefix + text``, except that an empty line stays empty (it translates to nothing)."""
    return prefix + text if text else text


def _progress(total: int, enabled: bool):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit="sent", dynamic_ncols=True)
