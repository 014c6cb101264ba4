"""Text generation with a decoder-only language model (GPT-2, Radford et al. 2019) through
aiayn's searches: greedy, beam search (GNMT length penalty) or sampling (temperature, top-k,
nucleus / top-p: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration").

Prompts are decoded in batches of similar length (sorted, to limit the left padding), each by
:func:`~aiayn.decoding.lm.decoder_only_step`; results come back in input order, and every
prompt gets the output it gets alone (sampling: each prompt draws from its own generator).

Shape legend:  B prompts in a batch   K beams   V vocabulary
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import torch

from aiayn.decoding.beam import Hypothesis, beam_search
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.lm import check_prompts, decoder_only_step
from aiayn.decoding.sampling import sample
from aiayn.errors import UserError
from aiayn.inference.packed import pack_for_inference
from aiayn.limits import MAX_BEAM_SIZE
from aiayn.models.gpt2 import GPT2
from aiayn.validation import (
    Bounds,
    Choice,
    NonNegativeInt,
    PenaltyAlpha,
    PositiveFloat,
    PositiveInt,
    validate,
    validated,
)

METHODS = ("greedy", "beam", "sample")


@validated(None)
@dataclass(frozen=True)
class GenerateOptions:
    """How to generate. Every value is checked on construction (:class:`UserError` naming it).

    Attributes:
        max_new_tokens: the most tokens generated per prompt (EOS excluded); generation stops
            earlier at EOS.
        min_new_tokens: EOS is not allowed before this many tokens.
        method: "greedy", "beam" or "sample".
        beam_size: K of beam search (1 = greedy search).
        alpha: α of beam search's GNMT length penalty (see :mod:`aiayn.decoding.beam`).
        n_best: hypotheses kept per prompt by :func:`generate_ids` (beam search only).
        temperature: sampling: p ∝ exp(logit / temperature).
        top_k: sampling: only the k most probable tokens; None = all.
        top_p: sampling: only the smallest set of most probable tokens whose probability
            reaches p (nucleus sampling); None = all.
        seed: sampling: each prompt draws from its own generator, seeded from ``seed`` and the
            prompt's ids, so its sample is the one it gets alone, whatever the batch, and
            different prompts draw independent streams (the same prompt twice gives the same
            text twice); None = torch's global generator, not reproducible.
        batch_size: prompts decoded together (beam search: K rows each).
        pack: on CPU, decode with a copy of the model whose linear layers are packed for
            oneDNN (:func:`~aiayn.inference.packed.pack_for_inference`: the same fp32
            arithmetic up to summation order, packed once per call). Ignored on GPU.
    """

    max_new_tokens: PositiveInt = 50
    min_new_tokens: NonNegativeInt = 0
    method: Annotated[str, Choice(METHODS)] = "greedy"
    beam_size: Annotated[int, Bounds(ge=1, le=MAX_BEAM_SIZE)] = 4  # aiayn.limits
    alpha: PenaltyAlpha = 0.6
    n_best: PositiveInt = 1
    temperature: PositiveFloat = 1.0
    top_k: PositiveInt | None = None
    top_p: Annotated[float, Bounds(gt=0, le=1)] | None = None
    seed: Annotated[int, Bounds(ge=0, lt=2**63)] | None = None
    batch_size: PositiveInt = 16
    pack: bool = True

    def __post_init__(self) -> None:
        validate(self)
        if self.min_new_tokens > self.max_new_tokens:
            raise UserError(
                f"min_new_tokens must be between 0 and {self.max_new_tokens} (max_new_tokens), "
                f"got {self.min_new_tokens}"
            )
        if self.n_best > self.beam_size:
            raise UserError(
                f"n_best must be between 1 and {self.beam_size} (the beam size), got {self.n_best}"
            )
        if self.n_best > 1 and self.method != "beam":
            raise UserError(f"n_best = {self.n_best} needs method 'beam', got {self.method!r}")


class TextCodec(Protocol):
    """What :func:`generate` needs of a tokenizer (:class:`~aiayn.data.TextTokenizer`, or
    aiayn's :class:`~aiayn.data.Tokenizer`): ids without specials, and back."""

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, no special tokens added."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        ...


def generate(
    model: GPT2,
    tokenizer: TextCodec,
    prompts: Sequence[str],
    options: GenerateOptions = GenerateOptions(),
) -> list[str]:
    """The continuation of each prompt (the new text only), in input order.

    An empty prompt starts from BOS: unconditional text, as GPT-2 samples it after
    ``<|endoftext|>``. The continuation is the decoded prompt + new tokens minus the decoded
    prompt, so a tokenizer that joins tokens with spaces still gives the space between them.

    Raises:
        UserError: a prompt needs more than ``config.max_len`` positions with
            ``max_new_tokens`` more, or encodes to an id outside the model's vocabulary.
    """
    ids = [tokenizer.encode(p) or [model.config.bos_id] for p in prompts]
    best = [hyps[0].tokens for hyps in generate_ids(model, ids, options)]
    return [continuation(tokenizer, p, new) for p, new in zip(ids, best, strict=True)]


def continuation(
    tokenizer: TextCodec, prompt: list[int], new: list[int], before: str | None = None
) -> str:
    """The text ``new`` adds after ``prompt``: decoded prompt + new minus the decoded prompt
    (a tokenizer that joins tokens with spaces still gives the space between them);
    ``before``: the decoded prompt, where the caller has it already."""
    before = tokenizer.decode(prompt) if before is None else before
    text = tokenizer.decode([*prompt, *new])
    return text[len(before) :] if text.startswith(before) else tokenizer.decode(new)


@torch.inference_mode()
def generate_ids(
    model: GPT2,
    prompts: Sequence[Sequence[int]],
    options: GenerateOptions = GenerateOptions(),
) -> list[list[Hypothesis]]:
    """Per prompt (non-empty id lists), its ``n_best`` outputs, best first, in input order:
    new ids without EOS. Greedy and sampled outputs carry ``log_prob = score = nan``.

    Decodes in eval mode (the model's mode is given back). Prompts are sorted by length and
    decoded ``batch_size`` at a time. No prompts give an empty list.
    """
    if not prompts:
        return []
    check_prompts(model, prompts, options.max_new_tokens)  # numbered in input order
    was_training = model.training
    model.eval()
    try:
        # a packed copy on CPU (pack_for_inference returns the model itself elsewhere)
        decoder = pack_for_inference(model) if options.pack else model
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[list[Hypothesis]] = [[] for _ in prompts]
        for start in range(0, len(order), options.batch_size):
            batch = order[start : start + options.batch_size]
            outputs = _generate_batch(decoder, [prompts[i] for i in batch], options)
            for i, hyps in zip(batch, outputs, strict=True):
                results[i] = hyps
        return results
    finally:
        model.train(was_training)


def _generate_batch(
    model: GPT2, prompts: list[Sequence[int]], o: GenerateOptions
) -> list[list[Hypothesis]]:
    """One batch of B prompts through the chosen search."""
    c, b = model.config, len(prompts)
    device = model.embedder.embedding.weight.device
    step, state = decoder_only_step(model, prompts, max_new_tokens=o.max_new_tokens)
    common: dict[str, Any] = {  # what every search takes alike
        "bos_id": c.bos_id,
        "eos_id": c.eos_id,
        "max_len": o.max_new_tokens,
        "min_len": o.min_new_tokens,
        "batch_size": b,
        "device": device,
    }
    if o.method == "beam":
        return beam_search(
            step, state, **common, beam_size=o.beam_size, alpha=o.alpha, n_best=o.n_best
        )
    if o.method == "sample":
        generators = None
        if o.seed is not None:
            generators = [prompt_generator(o.seed, p, device) for p in prompts]
        outputs = sample(
            step,
            state,
            **common,
            temperature=o.temperature,
            top_k=o.top_k,
            top_p=o.top_p,
            generator=generators,
        )
    else:
        outputs = greedy_search(step, state, **common)
    return [[Hypothesis(out, math.nan, math.nan)] for out in outputs]


def prompt_generator(seed: int, prompt: Sequence[int], device: torch.device) -> torch.Generator:
    """A generator seeded from ``seed`` and the prompt's ids (a stable 63-bit hash of both)."""
    text = f"{seed}:" + ",".join(str(int(t)) for t in prompt)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return torch.Generator(device).manual_seed(int.from_bytes(digest, "big") >> 1)
