"""The peer system of the benchmarks: plain PyTorch neural machine translation around
``torch.nn.Transformer``, written here and not imported from aiayn, with the standard recipe of
Vaswani et al. (2017):

- a joint BPE from Hugging Face ``tokenizers`` trained the usual way
  (``SentencePieceBPETokenizer``: NFKC, "▁" word boundaries, so decoding restores the spacing);
- token-budget batches (§5.1): pairs sorted by length, cut so that a batch's padded tokens stay
  within the budget on each side, the batch order shuffled every epoch;
- :class:`TorchReference`: ``nn.Transformer`` with the embeddings ×√D, sinusoidal positions
  (§3.5) and the output layer tied to the shared embedding (§3.4);
- label-smoothed cross-entropy (ε_ls = 0.1, §5.4), Adam (0.9, 0.98, 1e-9) with the learning rate
  of eq. (3) (§5.3), each settable (:class:`TrainSettings`) so that the peer can be given another
  recipe;
- checkpoint averaging (§6.1) over the end of a time budget (:class:`Averaging`): ``n`` weight
  snapshots evenly spaced over the last ``window`` fraction of the budget, the last at its end,
  averaged; nothing from before the window;
- greedy search and beam search with GNMT's length penalty (§6.1: beam 4, α = 0.6, output at most
  the source length + 50);
- its weights, layer sizes and BPE saved in a run folder (:func:`save_weights`) and read back
  (:func:`load_weights`), so that a run can be decoded again without training it again.

``benchmarks/train_vs_torch.py`` times :class:`TorchReference` against aiayn's training step;
``benchmarks/train_multi30k.py`` trains this whole system against ``aiayn train``.

Shape legend:
    B sentences   S source length   T target length   D d_model   V vocabulary   K beam size
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
PAD, UNK, BOS, EOS = range(4)


@dataclass(frozen=True)
class PeerConfig:
    """Layer sizes of :class:`TorchReference` (the paper's names in Table 3)."""

    vocab_size: int
    d_model: int = 256
    num_heads: int = 4
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    norm_first: bool = False
    final_norm: bool = True
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    share_embeddings: bool = True
    tie_output: bool = True
    max_len: int = 1024
    pad_id: int = PAD


def sinusoids(length: int, d_model: int) -> Tensor:
    """(length, D): PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(…) (§3.5)."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (L, 1)
    rate = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * rate)  # (L, 1) * (D/2,) -> (L, D/2)
    table[:, 1::2] = torch.cos(position * rate)[:, : d_model // 2]
    return table


class TorchReference(nn.Module):
    """``torch.nn.Transformer`` with what it leaves out: embeddings ×√D, sinusoidal positions,
    the output layer (tied to the target embedding with ``tie_output``; one embedding for both
    sides with ``share_embeddings``). Attention-weight dropout is ``attention_dropout``.

    ``nn.Transformer`` always ends each stack with a LayerNorm; ``final_norm=False`` removes them
    (a post-norm stack as in the paper has none; a pre-norm one needs them)."""

    def __init__(self, c: PeerConfig):
        super().__init__()
        self.config = c
        self.embedding = self._embedding(c)
        self.tgt_embedding = self.embedding if c.share_embeddings else self._embedding(c)
        self.register_buffer("pe", sinusoids(c.max_len, c.d_model), persistent=False)
        self.transformer = nn.Transformer(
            c.d_model,
            c.num_heads,
            c.num_encoder_layers,
            c.num_decoder_layers,
            c.d_ff,
            c.dropout,
            activation=c.activation,
            layer_norm_eps=c.layer_norm_eps,
            batch_first=True,
            norm_first=c.norm_first,
        )
        if not c.final_norm:
            self.transformer.encoder.norm = None
            self.transformer.decoder.norm = None
        for module in self.modules():
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = c.attention_dropout
        self.output = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_output:
            self.output.weight = self.tgt_embedding.weight
        else:
            nn.init.normal_(self.output.weight, std=c.d_model**-0.5)

    @staticmethod
    def _embedding(c: PeerConfig) -> nn.Embedding:
        embedding = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        nn.init.normal_(embedding.weight, std=c.d_model**-0.5)
        return embedding

    def embed(self, tokens: Tensor, target: bool = False) -> Tensor:
        """(B, L) -> (B, L, D), with the source's or (``target``) the target's embedding."""
        table = self.tgt_embedding if target else self.embedding
        x = table(tokens) * math.sqrt(self.config.d_model) + self.pe[: tokens.size(1)]
        return F.dropout(x, self.config.dropout, self.training)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """(B, S), (B, T) -> (B, T, V) logits (teacher forcing)."""
        pad, t = self.config.pad_id, tgt_in.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=src.device).triu(1)  # True = blocked
        hidden = self.transformer(
            self.embed(src),
            self.embed(tgt_in, target=True),
            tgt_mask=causal,
            src_key_padding_mask=src == pad,
            tgt_key_padding_mask=tgt_in == pad,
            memory_key_padding_mask=src == pad,
            tgt_is_causal=True,
        )  # (B, T, D)
        return self.output(hidden)  # (B, T, D) @ (D, V) -> (B, T, V)

    def encode(self, src: Tensor) -> Tensor:
        """(B, S) -> (B, S, D) memory."""
        return self.transformer.encoder(
            self.embed(src), src_key_padding_mask=src == self.config.pad_id
        )

    def next_log_probs(self, prefix: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
        """Log-probabilities of the token after each prefix: (B, t), (B, S, D), (B, S) -> (B, V).
        The prefix is decoded again in full at every step (no cache: plain nn.Transformer)."""
        t = prefix.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=prefix.device).triu(1)
        hidden = self.transformer.decoder(
            self.embed(prefix, target=True),
            memory,
            tgt_mask=causal,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )  # (B, t, D)
        logits = self.output(hidden[:, -1])  # (B, D) @ (D, V) -> (B, V)
        logits[:, PAD] = logits[:, BOS] = -math.inf
        return logits.float().log_softmax(-1)


# -- data --------------------------------------------------------------------------------------
def train_bpe(texts: Sequence[str], vocab_size: int, min_frequency: int = 2) -> Any:
    """A joint BPE over both languages (``tokenizers.SentencePieceBPETokenizer``)."""
    from tokenizers import SentencePieceBPETokenizer

    tokenizer = SentencePieceBPETokenizer(unk_token="<unk>")
    tokenizer.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIALS),
        show_progress=False,
    )
    assert [tokenizer.token_to_id(s) for s in SPECIALS] == [PAD, UNK, BOS, EOS]
    return tokenizer


@dataclass
class Encoded:
    """Token ids of the pairs (no BOS/EOS); lengths for batching."""

    src: list[list[int]]
    tgt: list[list[int]]

    @classmethod
    def of(cls, tokenizer: Any, pairs: Sequence[tuple[str, str]], max_len: int) -> Encoded:
        """Encode; drop pairs longer than ``max_len`` subwords on a side."""
        src = [e.ids for e in tokenizer.encode_batch([s for s, _ in pairs])]
        tgt = [e.ids for e in tokenizer.encode_batch([t for _, t in pairs])]
        keep = [
            i
            for i, (s, t) in enumerate(zip(src, tgt, strict=True))
            if 0 < len(s) <= max_len and 0 < len(t) <= max_len
        ]
        return cls([src[i] for i in keep], [tgt[i] for i in keep])


def pad_batch(rows: Sequence[Sequence[int]]) -> Tensor:
    """(B, L) int64, right-padded with PAD."""
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def token_batches(data: Encoded, max_tokens: int, rng: np.random.Generator) -> list[list[int]]:
    """Pair indices in batches whose padded size, (longest + 1) × count, stays within
    ``max_tokens`` on each side (+1: the EOS/BOS each side gets); sorted by length with random
    ties, the batch order shuffled."""
    src_len = np.array([len(s) + 1 for s in data.src])
    tgt_len = np.array([len(t) + 1 for t in data.tgt])
    order = np.lexsort((rng.random(len(src_len)), src_len, tgt_len))
    batches = pack_by_tokens(order.tolist(), np.maximum(src_len, tgt_len).tolist(), max_tokens)
    rng.shuffle(batches)
    return batches


def pack_by_tokens(order: Iterable[int], need: Sequence[int], budget: int) -> list[list[int]]:
    """The indices of ``order``, in that order, cut into consecutive batches whose padded size,
    (the batch's largest ``need``) × count, stays within ``budget``; an index whose need alone
    exceeds it is a batch of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0  # of the current batch
    for i in order:
        if current and max(longest, need[i]) * (len(current) + 1) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, need[i])
    if current:
        batches.append(current)
    return batches


# -- training ----------------------------------------------------------------------------------
def transformer_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Eq. (3), times ``scale``: scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)."""
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@dataclass(frozen=True)
class TrainSettings:
    """The recipe of a timed training run (the defaults: the paper's, §5.3–5.4, no averaging).

    ``steps``: a budget in optimizer steps instead of ``minutes`` (the averaging window is then
    a fraction of the steps). ``average_last`` < 2 averages nothing (the last weights are the
    model)."""

    minutes: float
    max_tokens: int
    steps: int | None = None
    warmup: int = 4000
    lr_scale: float = 1.0
    label_smoothing: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float | None = None
    average_last: int = 0
    average_window: float = 0.1
    seed: int = 1


def averaging_points(budget: float, window: float, n: int) -> list[float]:
    """The ``n`` points evenly spaced over the last ``window`` fraction of ``budget``, the last at
    ``budget``, ascending: budget − k · window · budget / n for k = n−1 … 0 (§6.1: checkpoints
    "written at 10-minute intervals" at the end of the run)."""
    if not 0 < window <= 1 or n < 1:
        raise ValueError(f"averaging needs a window in (0, 1] and n >= 1, got {window}, {n}")
    interval = window * budget / n
    return [budget - k * interval for k in range(n - 1, -1, -1)]


def averaging_steps(budget: int, window: float, n: int) -> list[int]:
    """The points of a ``budget``-step run as whole steps: the first step at or past each of
    :func:`averaging_points` (its distance from the end rounded to 6 decimals first, so that
    float noise never moves one), ascending, without repeats."""
    points = averaging_points(budget, window, n)
    return sorted({budget - math.floor(round(budget - p, 6)) for p in points})


class Averaging:
    """The weight snapshots of a budgeted run (``budget`` in seconds or in steps, and the
    progress given to :meth:`due` in the same unit) that are averaged at its end.

    A snapshot is taken after the first step that ends at or past each of the points of
    :func:`averaging_points` but the last (several points passed by one step give one snapshot)
    and after the final step; the average is over the last ``n`` snapshots, all inside the window
    (none before the step that passed the first point)."""

    def __init__(self, budget: float, window: float, n: int, *, steps: bool = False):
        self.n = n
        if steps:
            points: list[float] = [float(p) for p in averaging_steps(int(budget), window, n)]
        else:
            points = averaging_points(budget, window, n)
        self.points = points[:-1]
        self.passed = 0  # points passed so far
        self.snapshots: list[tuple[int, dict[str, Tensor]]] = []

    def due(self, elapsed: float) -> bool:
        """Whether a step that ended ``elapsed`` (seconds or steps) into the run passes the next
        point (and then every point it passes is passed)."""
        if self.passed == len(self.points) or elapsed < self.points[self.passed]:
            return False
        while self.passed < len(self.points) and self.points[self.passed] <= elapsed:
            self.passed += 1
        return True

    def take(self, step: int, model: nn.Module) -> None:
        """Keep a copy of the weights after ``step`` (once per step)."""
        if not self.snapshots or self.snapshots[-1][0] != step:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.snapshots.append((step, state))

    def steps(self) -> list[int]:
        """The steps of the snapshots that are averaged: the last ``n``."""
        return [step for step, _ in self.snapshots[-self.n :]]

    def average(self) -> dict[str, Tensor] | None:
        """The mean of the last ``n`` snapshots (in float64, returned in each tensor's dtype);
        None with fewer than 2."""
        chosen = [state for _, state in self.snapshots[-self.n :]]
        if len(chosen) < 2:
            return None
        return {
            name: torch.stack([state[name].double() for state in chosen]).mean(0).to(tensor.dtype)
            for name, tensor in chosen[-1].items()
        }


@dataclass
class TrainLog:
    """What a timed training run did (``averaged``: the averaged weights, or None)."""

    steps: int = 0
    epochs: int = 0
    seconds: float = 0.0
    tgt_tokens: int = 0
    window_rates: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    averaged_steps: list[int] = field(default_factory=list)
    averaged: dict[str, Tensor] | None = None


def train_for(
    model: TorchReference,
    data: Encoded,
    settings: TrainSettings,
    *,
    device: torch.device,
    amp: torch.dtype | None = None,
    log_every: int = 100,
) -> TrainLog:
    """Train until ``settings.minutes`` of wall-clock time have passed (checked before each
    step), or for ``settings.steps`` steps; with averaging, the averaged weights are in the log
    (the model keeps its last)."""
    s = settings
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=0.0, betas=s.adam_betas, eps=s.adam_eps, weight_decay=s.weight_decay
    )  # weight decay 0: Adam
    rng, log = np.random.default_rng(s.seed), TrainLog()
    budget = s.steps if s.steps is not None else 60 * s.minutes  # in steps, else in seconds
    averaging = None
    if s.average_last >= 2:
        averaging = Averaging(budget, s.average_window, s.average_last, steps=s.steps is not None)
    model.train()
    started = window_start = time.perf_counter()
    window_tokens, window_loss = 0, torch.zeros((), device=device)

    def spent() -> float:  # of the budget, in its unit
        return log.steps if s.steps is not None else time.perf_counter() - started

    def over() -> bool:  # no further step: the steps are made, or the time has passed
        return spent() >= budget if s.steps is not None else spent() > budget

    while not over():
        for ids in token_batches(data, s.max_tokens, rng):
            if over():
                break
            log.steps += 1
            lr = transformer_lr(log.steps, model.config.d_model, s.warmup, s.lr_scale)
            tokens = sum(len(data.tgt[i]) + 1 for i in ids)  # + EOS
            batch = make_batch(data, ids, device)
            loss = train_step(model, optimizer, batch, tokens, lr, s, amp)
            log.tgt_tokens += tokens
            window_tokens, window_loss = window_tokens + tokens, window_loss + loss
            if averaging is not None and averaging.due(spent()):
                averaging.take(log.steps, model)
            if log.steps % log_every == 0:  # the one host sync of a window
                now = time.perf_counter()
                _log_window(log, window_tokens, window_loss, now - window_start)
                window_start, window_tokens, window_loss = now, 0, torch.zeros_like(loss)
        else:
            log.epochs += 1
    now = time.perf_counter()
    if window_tokens:  # the last, shorter window counts too
        log.window_rates.append(window_tokens / (now - window_start))
    log.seconds = now - started
    if averaging is not None:
        averaging.take(log.steps, model)  # the end of the budget: the window's last
        log.averaged, log.averaged_steps = averaging.average(), averaging.steps()
    return log


def _log_window(log: TrainLog, tokens: int, loss: Tensor, seconds: float) -> None:
    log.window_rates.append(tokens / seconds)
    log.losses.append(loss.item() / tokens)
    print(
        f"peer: step {log.steps} loss {log.losses[-1]:.3f} "
        f"{log.window_rates[-1]:,.0f} target tokens/s",
        flush=True,
    )


def make_batch(data: Encoded, ids: list[int], device: torch.device) -> tuple[Tensor, ...]:
    """(src + EOS, BOS + tgt, tgt + EOS): (B, S), (B, T), (B, T) on ``device``."""
    src = pad_batch([data.src[i] + [EOS] for i in ids])
    tgt_in = pad_batch([[BOS, *data.tgt[i]] for i in ids])
    tgt_out = pad_batch([[*data.tgt[i], EOS] for i in ids])
    return src.to(device), tgt_in.to(device), tgt_out.to(device)


def train_step(
    model: TorchReference,
    optimizer: torch.optim.Optimizer,
    batch: tuple[Tensor, ...],
    tokens: int,
    lr: float,
    settings: TrainSettings,
    amp: torch.dtype | None,
) -> Tensor:
    """One optimizer step on one batch of ``tokens`` targets (the loss per target token); the
    summed loss, detached (no host sync)."""
    src, tgt_in, tgt_out = batch
    device_type = src.device.type
    with torch.autocast(device_type, dtype=amp or torch.float32, enabled=amp is not None):
        logits = model(src, tgt_in)  # (B, T, V)
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(),  # (B·T, V)
        tgt_out.flatten(),
        ignore_index=PAD,
        label_smoothing=settings.label_smoothing,
        reduction="sum",
    )
    (loss / tokens).backward()
    if settings.clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_norm)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


# -- decoding ----------------------------------------------------------------------------------
def gnmt_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the EOS (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.inference_mode()
def translate(
    model: TorchReference,
    tokenizer: Any,
    sources: Sequence[str],
    *,
    beam_size: int = 1,
    alpha: float = 0.6,
    extra_len: int = 50,
    batch_sentences: int = 64,
    max_tokens: int | None = None,
    device: torch.device,
) -> list[str]:
    """Detokenized translations, greedy (``beam_size`` 1) or beam search, in input order: batches
    of ``batch_sentences`` sentences by length, or, given ``max_tokens``, aiayn's rule (padded
    source tokens × ``beam_size`` within ``max_tokens``)."""
    model.eval()
    ids = [e.ids[: model.config.max_len - extra_len - 2] for e in tokenizer.encode_batch(sources)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    outputs: list[list[int]] = [[] for _ in ids]
    if max_tokens is None:
        chunks = [order[i : i + batch_sentences] for i in range(0, len(order), batch_sentences)]
    else:  # + 1: the EOS each source row gets
        need = [len(row) + 1 for row in ids]
        chunks = pack_by_tokens(order, need, max(1, max_tokens // beam_size))
    for chunk in chunks:
        src = pad_batch([ids[i] + [EOS] for i in chunk]).to(device)  # (B, S)
        limits = [len(ids[i]) + extra_len for i in chunk]
        search = greedy if beam_size == 1 else _beam
        found = search(model, src, limits, beam_size=beam_size, alpha=alpha)
        for i, tokens in zip(chunk, found, strict=True):
            outputs[i] = tokens
    return list(tokenizer.decode_batch(outputs))


def greedy(model: TorchReference, src: Tensor, limits: list[int], **_: Any) -> list[list[int]]:
    """The most probable next token until EOS; EOS forced after ``limits[b]`` tokens. A row
    that has produced EOS leaves the batch."""
    memory, src_pad = model.encode(src), src == PAD  # (B, S, D), (B, S)
    b = src.size(0)
    prefix = torch.full((b, 1), BOS, dtype=torch.long, device=src.device)  # (N, 1), N rows left
    limit = torch.tensor(limits, device=src.device)  # (N,)
    alive, found = list(range(b)), [[] for _ in range(b)]
    for t in range(max(limits) + 1):  # at the last t every row is at its limit
        token = model.next_log_probs(prefix, memory, src_pad).argmax(-1)  # (N,)
        token = torch.where(limit <= t, torch.full_like(token, EOS), token)
        prefix = torch.cat([prefix, token[:, None]], dim=1)  # (N, t + 2)
        done = (token == EOS).tolist()
        if any(done):
            ended = [i for i, d in enumerate(done) if d]
            rows = prefix[torch.tensor(ended, device=src.device), 1:-1].tolist()  # no BOS, EOS
            for i, row in zip(ended, rows, strict=True):
                found[alive[i]] = row
            keep = [i for i, d in enumerate(done) if not d]
            if not keep:
                break
            at = torch.tensor(keep, device=src.device)  # (N',)
            prefix, memory, src_pad, limit = prefix[at], memory[at], src_pad[at], limit[at]
            alive = [alive[i] for i in keep]
    return found


def _beam(
    model: TorchReference, src: Tensor, limits: list[int], *, beam_size: int, alpha: float
) -> list[list[int]]:
    """Beam search, GNMT style: a candidate ending in EOS among a sentence's K best is finished
    (scored log P / lp); the K best others live on; a sentence is done with K finished, and its
    rows leave the batch; EOS is forced after ``limits[b]`` tokens."""
    b, k = src.size(0), beam_size
    state = _BeamRows(
        memory=model.encode(src).repeat_interleave(k, dim=0),  # (B·K, S, D)
        src_pad=(src == PAD).repeat_interleave(k, dim=0),  # (B·K, S)
        prefix=torch.full((b * k, 1), BOS, dtype=torch.long, device=src.device),  # (B·K, 1)
        scores=torch.full((b, k), -math.inf, device=src.device),
        limit=torch.tensor(limits, device=src.device),  # (B,)
        alive=list(range(b)),
    )
    state.scores[:, 0] = 0.0  # one live beam at the start
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    for t in range(1, max(limits) + 2):
        n = len(state.alive)
        logp = model.next_log_probs(state.prefix, state.memory, state.src_pad)  # (N·K, V)
        logp = logp.view(n, k, -1)  # (N, K, V)
        at_limit = state.limit < t  # (N,)
        forced = torch.full_like(logp, -math.inf)
        forced[..., EOS] = logp[..., EOS]
        logp = torch.where(at_limit[:, None, None], forced, logp)
        vocab = logp.size(-1)
        cand = (state.scores[:, :, None] + logp).view(n, k * vocab)  # (N, K·V)
        top, index = cand.topk(2 * k, dim=1)  # (N, 2K)
        alive_finished = [finished[s] for s in state.alive]
        rows, tokens, state.scores = _select(
            top, index, vocab, k, t, alpha, state.prefix, alive_finished
        )
        state.prefix = torch.cat([state.prefix[rows], tokens[:, None]], dim=1)  # (N·K, t + 1)
        keep = [i for i, f in enumerate(alive_finished) if len(f) < k]
        if not keep:
            break
        if len(keep) < n:
            state.keep(keep, k)
    return [max(f)[1] if f else [] for f in finished]


@dataclass
class _BeamRows:
    """The rows of the sentences still searching (``alive``, in batch order), K per sentence."""

    memory: Tensor  # (N·K, S, D)
    src_pad: Tensor  # (N·K, S)
    prefix: Tensor  # (N·K, t)
    scores: Tensor  # (N, K)
    limit: Tensor  # (N,)
    alive: list[int]

    def keep(self, positions: list[int], k: int) -> None:
        """Keep the sentences at ``positions`` of ``alive``: a done sentence's rows leave (its
        outcome cannot change: the search adds nothing to a sentence with K finished)."""
        at = torch.tensor(positions, device=self.prefix.device)  # (N',)
        rows = (at[:, None] * k + torch.arange(k, device=at.device)).flatten()  # (N'·K,)
        self.memory, self.src_pad = self.memory[rows], self.src_pad[rows]
        self.prefix, self.scores, self.limit = self.prefix[rows], self.scores[at], self.limit[at]
        self.alive = [self.alive[i] for i in positions]


def _select(
    top: Tensor,
    index: Tensor,
    vocab: int,
    k: int,
    t: int,
    alpha: float,
    prefix: Tensor,
    finished: list[list[tuple[float, list[int]]]],
) -> tuple[Tensor, Tensor, Tensor]:
    """Sort a step's 2K candidates per sentence into finished hypotheses and K live beams:
    (source rows (B·K,), next tokens (B·K,), live scores (B, K))."""
    b = top.size(0)
    rows, tokens = [], []
    host: list[list[int]] | None = None  # the prefixes on the host, copied when one finishes
    scores = torch.full((b, k), -math.inf, device=top.device)
    for s, (values, ids) in enumerate(zip(top.tolist(), index.tolist(), strict=True)):
        live = 0
        for rank, (value, flat) in enumerate(zip(values, ids, strict=True)):
            if value == -math.inf or live == k or len(finished[s]) >= k:
                break
            beam, token = divmod(flat, vocab)
            if token == EOS:
                if rank < k:
                    host = prefix.tolist() if host is None else host  # one copy per step
                    path = host[s * k + beam][1:]
                    finished[s].append((value / gnmt_penalty(t, alpha), path))
                continue
            rows.append(s * k + beam)
            tokens.append(token)
            scores[s, live] = value
            live += 1
        rows += [s * k] * (k - live)  # empty slots: any row, score -inf
        tokens += [PAD] * (k - live)
    device = prefix.device
    return torch.tensor(rows, device=device), torch.tensor(tokens, device=device), scores


# -- saved weights -----------------------------------------------------------------------------
WEIGHTS_FILE = "peer_weights.pt"
TOKENIZER_FILE = "tokenizer.json"


def save_weights(
    folder: Path, config: PeerConfig, tokenizer: Any, weights: dict[str, dict[str, Tensor]]
) -> None:
    """``folder``/peer_weights.pt (the layer sizes and each of ``weights``, a state dict by label:
    "last", "averaged") and ``folder``/tokenizer.json (the BPE): what :func:`load_weights`
    needs to decode them again. Files already there are replaced: the folder is the run's own."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / TOKENIZER_FILE))
    states = {
        label: {name: tensor.detach().cpu() for name, tensor in state.items()}
        for label, state in weights.items()
    }
    torch.save({"config": asdict(config), "weights": states}, folder / WEIGHTS_FILE)


def load_weights(folder: Path, label: str, device: torch.device) -> tuple[TorchReference, Any]:
    """The model with the weights saved under ``label`` (in eval mode, on ``device``) and its BPE
    (a ``tokenizers.Tokenizer``), from a folder :func:`save_weights` wrote."""
    from tokenizers import Tokenizer

    saved = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    if label not in saved["weights"]:
        raise ValueError(
            f"{folder / WEIGHTS_FILE} has no {label!r} weights: {list(saved['weights'])}"
        )
    model = TorchReference(PeerConfig(**saved["config"]))
    model.load_state_dict(saved["weights"][label])
    return model.to(device).eval(), Tokenizer.from_file(str(folder / TOKENIZER_FILE))
