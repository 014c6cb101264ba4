"""The decoding step of a decoder-only language model (GPT-2, Radford et al. 2019): the prompt
runs once, then one new token per step through the cached keys/values.

    step(tokens (B, 1), state) -> (log_probs (B, V), state)      (see aiayn.decoding.step)

The searches feed BOS as their first token: here the first step ignores it and returns the
log-probabilities of the token after the prompt, computed with the prompt (the "prefill"). Later
steps run the newest token. Prompts of different lengths are left-padded for the prefill, each
row's positions counted from its first real token (as Hugging Face ``generate`` counts them
from its attention mask), so a padded prompt gets exactly the positions it has alone.

The keys/values live in a slot pool (:class:`~aiayn.attention.SlotPool`): after the prefill,
each row's real positions are copied to the start of its own slot, and every step appends one
position per row and attends over that row's own length, through the model's own ``forward``
(:class:`~aiayn.attention.SlotCache`). No row carries another's padding, rows of different
lengths step together (:meth:`LMState.concat`), and a row that leaves frees its slot.

Shape legend:
    B rows (prompts × beams)   P padded prompt length   N layers   H heads   d_k = D / H
    D d_model   V vocabulary
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.attention import KVCache, MultiHeadAttention, SlotCache, SlotPool, SlotRows
from aiayn.decoding.step import DecoderState
from aiayn.errors import UserError
from aiayn.models.gpt2 import GPT2


@dataclass(frozen=True)
class LMState:
    """Incremental state of :class:`LMStep`.

    Attributes:
        slots: the rows' keys/values in the pool, each row's length its positions so far.
        pending: (B, V) log-probabilities of the token after the prompt, which the first step
            returns; None after it.
    """

    slots: SlotRows
    pending: Tensor | None

    @property
    def length(self) -> int:
        """The longest row's positions."""
        return self.slots.longest

    def index_select(self, index: Tensor) -> LMState:
        """Rows ``index`` (B',) of B (e.g. surviving beams; a row picked twice gets its own
        copy); the slots of rows not picked are freed."""
        pending = None if self.pending is None else self.pending.index_select(0, index)
        return LMState(self.slots.select(index), pending)

    def repeat_interleave(self, repeats: int) -> LMState:
        """Each row becomes ``repeats`` consecutive rows (the beams): B -> B·repeats."""
        rows = self.slots.rows.numel()
        index = torch.arange(rows, device=self.slots.rows.device).repeat_interleave(repeats)
        return self.index_select(index)  # (B·repeats,)

    def advanced(self) -> LMState:
        """The state after a step wrote one position per row."""
        return LMState(self.slots.advanced(), None)

    def release(self) -> None:
        """Free every row's slot (the decode has ended)."""
        self.slots.release()

    @staticmethod
    def concat(states: Sequence[LMState]) -> LMState:
        """The rows of ``states`` (past their first step, one pool) as one batch."""
        if any(s.pending is not None for s in states):
            raise ValueError("join states after their first step (the prompt's log-probs)")
        return LMState(SlotRows.concat([s.slots for s in states]), None)


class LMStep:
    """The step of :func:`decoder_only_step` for one model: :meth:`prefill` starts rows in a
    pool, ``__call__`` advances them (rows of any prefills of the same pool together)."""

    def __init__(self, model: GPT2, banned: tuple[int, ...] | None = None):
        if model.training:
            raise ValueError("decoder_only_step decodes without dropout: call model.eval() first")
        self.model = model
        self.ban = _banned_ids(model, banned, model.embedder.embedding.weight.device)

    def pool(self, slots: int = 8, capacity: int = 64) -> SlotPool:
        """An empty pool for the model's keys/values."""
        attn = self.model.layers[0].self_attn
        assert isinstance(attn, MultiHeadAttention)
        like = self.model.embedder.embedding.weight
        layers = len(self.model.layers)
        return SlotPool(layers, attn.num_heads, attn.d_k, like, slots=slots, capacity=capacity)

    @torch.inference_mode()
    def prefill(
        self, prompts: Sequence[Sequence[int]], capacity: int, pool: SlotPool | None = None
    ) -> LMState:
        """Run the prompts once (left-padded): their rows in free slots of ``pool`` (a new one
        when None) with room for ``capacity`` positions, and the log-probs after each prompt."""
        model = self.model
        device = model.embedder.embedding.weight.device
        tokens, key_padding = left_pad(prompts, model.config.pad_id, device)  # (B, P), (B, P)
        out = model(tokens, key_padding=key_padding)  # (B, P, D)
        pending = model.log_probs(out.hidden[:, -1])  # (B, D) -> (B, V): rows end at column P
        if self.ban is not None:
            pending.index_fill_(1, self.ban, -torch.inf)
        pool = pool if pool is not None else self.pool(len(prompts), capacity)
        slots = SlotRows.taken(pool, [len(p) for p in prompts], capacity)
        _write_prompts(pool, slots, out.cache, tokens.size(1))
        return LMState(slots, pending)

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """(B, 1) newest tokens -> (B, V) log-probs of the next ones, and the next state."""
        assert isinstance(state, LMState)
        if state.pending is not None:  # the first step: the prompt's log-probs, BOS unread
            return state.pending.clone(), LMState(state.slots, None)
        model, rows = self.model, state.slots
        if rows.longest >= model.config.max_len:
            raise UserError(
                f"decoding reached {rows.longest + 1} positions, more than "
                f"max_len = {model.config.max_len}"
            )
        rows.pool.reserve(rows.longest + 1)
        at = rows.write_index()  # (B·H,) the same in every layer
        caches = [rows.cache(i, at) for i in range(len(model.layers))]
        out = model(tokens, positions=rows.lengths[:, None], cache=caches)  # (B, 1, D)
        log_probs = model.log_probs(out.hidden[:, 0])  # (B, D) -> (B, V)
        if self.ban is not None:
            log_probs.index_fill_(1, self.ban, -torch.inf)
        return log_probs, state.advanced()


def _write_prompts(
    pool: SlotPool, slots: SlotRows, cache: Sequence[KVCache | SlotCache], width: int
) -> None:
    """Each prompt's real columns of the prefill's per-layer (B, H, P, d_k) keys/values
    (left-padded to P = ``width``) to columns 0 .. P_i − 1 of the row's slot."""
    keys = torch.stack([c.key for c in cache])  # (N, B, H, P, d_k)
    values = torch.stack([c.value for c in cache])
    lengths = slots.lengths.tolist()
    if all(n == width for n in lengths):  # nothing padded: one copy
        pool.buffer[:, 0, slots.rows, :, :width] = keys  # (N, B, H, P, d_k)
        pool.buffer[:, 1, slots.rows, :, :width] = values
        return
    for i, (slot, n) in enumerate(zip(slots.rows.tolist(), lengths, strict=True)):
        pool.buffer[:, 0, slot, :, :n] = keys[:, i, :, width - n :]  # (N, H, P_i, d_k)
        pool.buffer[:, 1, slot, :, :n] = values[:, i, :, width - n :]


def decoder_only_step(
    model: GPT2,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | None = None,
    banned: tuple[int, ...] | None = None,
    pool: SlotPool | None = None,
) -> tuple[LMStep, LMState]:
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
        pool: the slot pool the rows take (a new one when None).

    Raises:
        UserError: a prompt is empty, has an id outside the vocabulary, or needs more than
            ``config.max_len`` positions with ``max_new_tokens`` more.
    """
    step = LMStep(model, banned)
    check_prompts(model, prompts, max_new_tokens)
    longest = max(len(p) for p in prompts)
    capacity = longest + (64 if max_new_tokens is None else max_new_tokens)
    return step, step.prefill(prompts, capacity, pool)


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
