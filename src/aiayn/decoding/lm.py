"""The decoding step of a decoder-only language model (GPT-2, Radford et al. 2019): the prompt
runs once, then one new token per step through the cached keys/values.

    step(tokens (B, 1), state) -> (log_probs (B, V), state)      (see aiayn.decoding.step)

The searches feed BOS as their first token: here the first step ignores it and returns the
log-probabilities of the token after the prompt, computed with the prompt (the "prefill"). Later
steps run the newest token. Prompts of different lengths are left-padded, so every row's next
token sits in the same column; each row's positions count from its first real token (as Hugging
Face ``generate`` counts them from its attention mask), so a padded prompt gets exactly the
positions it has alone.

Kept cheap per step: nothing padded (always at batch 1) means no mask at all (the new token sees
every cached key); with padding, the key-padding mask is preallocated for the whole decode and
sliced per step (a view), and each row's position is its column minus its number of pad
columns. The keys/values live in buffers preallocated for the whole decode
(:meth:`~aiayn.attention.KVCache.reserve`). The step runs the model's own ``forward``.

Shape legend:
    B rows (prompts × beams)   P padded prompt length   L cached positions   C capacity
    D d_model   H heads   d_k = D / H   V vocabulary
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from aiayn.attention import KVCache
from aiayn.decoding.step import DecoderState, StepFunction
from aiayn.errors import UserError
from aiayn.models.gpt2 import GPT2


@dataclass(frozen=True)
class Padding:
    """The left padding of a batch of prompts, for the whole decode (never written after).

    Attributes:
        key_padding: (B, C) boolean, True = a real token; the columns past the prompts are the
            generated tokens (True).
        pads: (B, 1) the number of pad columns of each row (position = column - pads).
    """

    key_padding: Tensor
    pads: Tensor

    @staticmethod
    def of(key_padding: Tensor, capacity: int) -> Padding:
        """From the prompts' (B, P) mask, for ``capacity`` ≥ P key columns."""
        b, p = key_padding.shape
        mask = key_padding.new_ones(b, max(capacity, p))  # (B, C)
        mask[:, :p] = key_padding
        pads = (~key_padding).sum(dim=1, keepdim=True)  # (B, 1)
        return Padding(mask, pads)

    @property
    def capacity(self) -> int:
        """C, the key columns covered."""
        return self.key_padding.size(1)

    def widened(self, columns: int) -> Padding:
        """Covering at least ``columns`` key columns (doubling; the new ones are real tokens)."""
        if columns <= self.capacity:
            return self
        return Padding.of(self.key_padding, max(columns, 2 * self.capacity))

    def index_select(self, index: Tensor) -> Padding:
        """Rows ``index`` (B',) of B."""
        return Padding(self.key_padding.index_select(0, index), self.pads.index_select(0, index))


@dataclass(frozen=True)
class LMState:
    """Incremental state of :func:`decoder_only_step`.

    Attributes:
        cache: per layer, the keys/values (B, H, L, d_k) of the prompt and the tokens so far.
        padding: the prompts' left padding, or None when no prompt is padded (causal, no mask).
        pending: (B, V) log-probabilities of the token after the prompt, which the first step
            returns; None after it.
    """

    cache: tuple[KVCache, ...]
    padding: Padding | None
    pending: Tensor | None

    @property
    def length(self) -> int:
        """L, the key columns cached (padding included)."""
        return self.cache[0].length

    @property
    def key_padding(self) -> Tensor | None:
        """(B, L) boolean, True = a real token; None when no prompt is padded."""
        return None if self.padding is None else self.padding.key_padding[:, : self.length]

    def index_select(self, index: Tensor) -> LMState:
        """Reorder/select rows (e.g. surviving beams): index is (B',) into B."""
        return LMState(
            tuple(c.index_select(index) for c in self.cache),
            None if self.padding is None else self.padding.index_select(index),
            None if self.pending is None else self.pending.index_select(0, index),
        )

    def repeat_interleave(self, repeats: int) -> LMState:
        """Each row becomes ``repeats`` consecutive rows (the beams): B -> B·repeats."""
        rows = self.cache[0].key.size(0)
        index = torch.arange(rows, device=self.cache[0].key.device).repeat_interleave(repeats)
        return self.index_select(index)  # (B·repeats,)

    def real(self) -> Tensor:
        """(B, L) boolean, True = a real token (all True without padding)."""
        if self.padding is None:
            rows = self.cache[0].key.size(0)
            return torch.ones(rows, self.length, dtype=torch.bool, device=self.cache[0].key.device)
        return self.padding.key_padding[:, : self.length]

    def compacted(self) -> LMState:
        """The same rows without the leading key columns that are padding in every row (after
        rows have left): the positions, counted from each row's first real token, stay."""
        if self.padding is None or self.padding.pads.numel() == 0:
            return self
        cut = int(self.padding.pads.min())
        if cut == 0:
            return self
        real = self.real()[:, cut:]  # (B, L - cut)
        cache = tuple(KVCache(c.key[:, :, cut:], c.value[:, :, cut:]) for c in self.cache)
        return LMState(cache, Padding.of(real, self.padding.capacity - cut), self.pending)


def merge_lm_states(a: LMState, b: LMState) -> LMState:
    """The rows of ``a`` then those of ``b`` (both past their first step), in one state: their
    key columns right-aligned at L = max(L_a, L_b), the shorter state's rows padded on the left
    (masked; each row keeps its positions, counted from its first real token). This is how a
    decoding run takes in rows that started later, at the next step (``aiayn serve``)."""
    if a.pending is not None or b.pending is not None:
        raise ValueError("merge states after their first step (the prompt's log-probs)")
    length = max(a.length, b.length)
    real = torch.cat([_left_padded(s.real(), length) for s in (a, b)])  # (B_a + B_b, L)
    cache = []
    for ca, cb in zip(a.cache, b.cache, strict=True):
        key, value = (
            torch.cat([_left_padded(x, length, dim=2) for x in pair])  # (B_a + B_b, H, L, d)
            for pair in ((ca.key, cb.key), (ca.value, cb.value))
        )
        cache.append(KVCache(key, value))
    return LMState(tuple(cache), Padding.of(real, length), None)


def _left_padded(x: Tensor, length: int, dim: int = 1) -> Tensor:
    """``x`` with zeros (False) before its columns along ``dim``, up to ``length`` of them."""
    missing = length - x.size(dim)
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def decoder_only_step(
    model: GPT2,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | None = None,
    banned: tuple[int, ...] | None = None,
) -> tuple[StepFunction, LMState]:
    """Run the prompts once (prefill) and return the step function and its initial state.

    Same contract as :func:`~aiayn.decoding.step.encoder_decoder_step`; the first step ignores
    its token (the search's BOS) and returns the log-probabilities of the token after each
    prompt. They are the model's own, except for the ``banned`` tokens (default: PAD and BOS
    where they are not EOS; none for GPT-2, whose one special token is all three), at −inf.

    Args:
        model: the language model, in eval mode.
        prompts: B token-id lists, each non-empty.
        max_new_tokens: the most tokens the search will produce per prompt (EOS excluded):
            checked against the model's positions, and the cache is sized for it. None =
            unknown (the cache grows as needed).
        banned: tokens never produced.

    Raises:
        UserError: a prompt is empty, has an id outside the vocabulary, or needs more than
            ``config.max_len`` positions with ``max_new_tokens`` more.
    """
    if model.training:
        raise ValueError("decoder_only_step decodes without dropout: call model.eval() first")
    check_prompts(model, prompts, max_new_tokens)
    device = model.embedder.embedding.weight.device
    ban = _banned_ids(model, banned, device)
    tokens, key_padding = left_pad(prompts, model.config.pad_id, device)  # (B, P), (B, P)
    capacity = tokens.size(1) + (64 if max_new_tokens is None else max_new_tokens)
    state = _prefill(model, tokens, key_padding, capacity, ban)

    @torch.inference_mode()
    def step(tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        assert isinstance(state, LMState)
        if state.pending is not None:  # the first step: the prompt's log-probs, BOS unread
            return state.pending.clone(), replace(state, pending=None)
        hidden, cache, padding = _decode(model, tokens, state)  # (B, D)
        log_probs = model.log_probs(hidden)  # (B, D) -> (B, V)
        if ban is not None:
            log_probs.index_fill_(1, ban, -torch.inf)
        return log_probs, LMState(cache, padding, None)

    return step, state


def check_prompts(
    model: GPT2, prompts: Sequence[Sequence[int]], max_new_tokens: int | None
) -> None:
    """Refuse (:class:`UserError`, naming the numbers) no prompts, an empty prompt, an id outside
    the vocabulary, or a prompt whose length + ``max_new_tokens`` exceeds ``config.max_len``."""
    config = model.config
    if not prompts:
        raise UserError("no prompts to decode")
    if max_new_tokens is not None and max_new_tokens < 0:
        raise UserError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise UserError(f"prompt {i} is empty: a prompt needs at least one token")
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= config.vocab_size:
            bad = low if low < 0 else high
            raise UserError(
                f"prompt {i} has id {bad}, outside the vocabulary 0..{config.vocab_size - 1}"
            )
        if max_new_tokens is not None and len(prompt) + max_new_tokens > config.max_len:
            raise UserError(
                f"prompt {i} has {len(prompt)} tokens: with {max_new_tokens} new tokens it needs "
                f"{len(prompt) + max_new_tokens} positions, more than max_len = {config.max_len} "
                "(shorten the prompt or ask for fewer new tokens)"
            )


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor | None]:
    """Prompts padded on the left to one (B, P) id tensor, and the (B, P) key-padding mask
    (True = a real token), or None when every prompt has length P."""
    width = max(len(p) for p in prompts)
    rows = [[pad_id] * (width - len(p)) + [int(t) for t in p] for p in prompts]
    tokens = torch.tensor(rows, dtype=torch.long).to(device)  # (B, P)
    if all(len(p) == width for p in prompts):
        return tokens, None
    real = [[False] * (width - len(p)) + [True] * len(p) for p in prompts]
    return tokens, torch.tensor(real, dtype=torch.bool).to(device)  # (B, P)


def _banned_ids(model: GPT2, banned: tuple[int, ...] | None, device: torch.device) -> Tensor | None:
    """(n,) ids a step never produces: ``banned``, by default PAD and BOS unless they are EOS;
    None when there are none."""
    c = model.config
    if banned is None:
        banned = tuple(sorted({c.pad_id, c.bos_id} - {c.eos_id}))
    return torch.tensor(banned, dtype=torch.long, device=device) if banned else None


@torch.inference_mode()
def _prefill(
    model: GPT2, tokens: Tensor, key_padding: Tensor | None, capacity: int, ban: Tensor | None
) -> LMState:
    """Run the (B, P) prompts once: the state holding their keys/values, sized for ``capacity``
    key columns, and the log-probabilities of the token after them."""
    out = model(tokens, key_padding=key_padding)  # (B, P, D)
    pending = model.log_probs(out.hidden[:, -1])  # (B, D) -> (B, V): every row ends at column P
    if ban is not None:
        pending.index_fill_(1, ban, -torch.inf)
    cache = tuple(c.reserve(capacity) for c in out.cache)  # (B, H, P, d_k) in (B, H, C, d_k)
    padding = None if key_padding is None else Padding.of(key_padding, capacity)
    return LMState(cache, padding, pending)


def _decode(
    model: GPT2, tokens: Tensor, state: LMState
) -> tuple[Tensor, tuple[KVCache, ...], Padding | None]:
    """The newest token of each row, (B, 1) ids, through the blocks after the cached columns:
    its (B, D) final state, the caches holding it, and the padding covering it."""
    length = state.length  # the new token's column
    if length >= model.config.max_len:
        raise UserError(
            f"decoding reached {length + 1} key columns (padding included), more than "
            f"max_len = {model.config.max_len}"
        )
    padding, positions, key_padding = state.padding, None, None
    if padding is not None:
        padding = padding.widened(length + 1)
        key_padding = padding.key_padding[:, : length + 1]  # (B, L + 1), a view
        positions = length - padding.pads  # (B, 1): column L minus the row's pad columns
    out = model(tokens, key_padding=key_padding, positions=positions, cache=state.cache)
    return out.hidden[:, 0], tuple(out.cache), padding  # (B, 1, D) -> (B, D)
