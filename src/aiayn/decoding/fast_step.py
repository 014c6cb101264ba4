"""The encoder–decoder's decoding step, flattened for inference: the paper's model, Marian
(sinusoidal halves, SiLU, a logits bias) and T5 (RMSNorm, unscaled attention with the decoder's
relative position bias, gated feed-forward, scaled output) alike.

:func:`inference_step` is :func:`~aiayn.decoding.step.encoder_decoder_step` with the same
decoder and the same arithmetic (up to summation order), written for speed at small batches,
where the small operations around a step's matmuls take a large share of it (measured in
docs/benchmarks.md). It runs on any device; the packed kernels are CPU-only. Where the model
holds a part of a kind this step does not compute (a subclass, another norm, a forward hook on
the decoder), it runs :func:`~aiayn.decoding.step.encoder_decoder_step` instead, the reference,
and says so once per model at debug level (logger ``aiayn.decoding.fast_step``).

- the source is encoded once by :class:`~aiayn.inference.encoder.EncoderInference`
  (the encoder on the real tokens only; by the encoder's module where it holds a part or a
  hook that path refuses);
- the decoder's weights are gathered once into :class:`~aiayn.inference.kernels.LinearKernel`\\ s
  (oneDNN-packed when the model came through
  :func:`~aiayn.inference.packed.pack_for_inference`), and each sub-layer is one short function
  over them: no module calls and no per-layer objects per step;
- the feed-forward network's activation and every residual addition are fused into the matmul
  before them (oneDNN post-ops): the kernels of :mod:`aiayn.inference.kernels`, which the
  encoder's flattened path shares;
- T5's relative position bias is one (H, P) table over relative positions, computed once: the
  bias of a step's query is a slice of it;
- the keys/values live in slot pools (:class:`~aiayn.attention.SlotPool`): each row's
  self-attention keys/values in its own slot, written one position per step at the row's own
  length, and each sentence's source keys/values (its real tokens only), computed once, in a
  slot of the source pool that its beams share. Rows of different lengths, and rows that
  started at other steps, step together (:meth:`InferenceState.concat`), each attending over
  exactly its own positions (:func:`~aiayn.attention.attend_slots`), so a row gets what it gets
  alone; a beam reorder copies only the columns of the beams two survivors continue, and a row
  that leaves frees its slots.

The model's modules stay the reference: tests check that both steps give the same
log-probabilities at every position, with and without padding and beams, and for rows joined
at different steps against each row's module step alone.

Shape legend:
    B decoder rows (sentences × beams)   b source rows   S source length   D d_model   H heads
    d_k size per head   N layers   P positions of the precomputed tables
    L the longest row's positions decoded so far   V vocabulary
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import (
    CrossAttention,
    SelfAttention,
    SlotCache,
    SlotPool,
    SlotRows,
    attend_slots,
)
from aiayn.decoding.step import (
    DecoderState,
    StepFunction,
    banned_ids,
    banned_log_probs,
    encode_source,
    encoder_decoder_step,
)
from aiayn.inference.encoder import EncoderInference
from aiayn.inference.kernels import (
    FeedForwardKernel,
    LinearKernel,
    NormKernel,
    UnsupportedPart,
    check_kind,
    check_norm,
    linear_kernel,
    refuse_hooks,
    residual,
)
from aiayn.layers import CrossAttentionBlock
from aiayn.layers.relative_position import RelativePositionBias
from aiayn.models.transformer import Decoder, EncoderDecoder

_WHO = "inference_step"  # how messages name this step
_log = logging.getLogger(__name__)
_told: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models whose fallback was logged


def _decoder_layers(model: EncoderDecoder) -> list[CrossAttentionBlock]:
    """The decoder's layers, checked to be built of the parts this step knows how to run (see
    :class:`_Parts`); anything else is :class:`~aiayn.inference.kernels.UnsupportedPart`,
    naming it: the module step runs such a model, never this one differently."""
    check_kind(model.decoder, (Decoder,), _WHO, "aiayn's Decoder")
    refuse_hooks(model.decoder, _WHO, prefix="decoder")  # no decoder module is called
    refuse_hooks(model.output_proj, _WHO, prefix="output_proj")
    embedder = model.decoder.embedder
    if embedder.token_types is not None or embedder.norm is not None:
        raise UnsupportedPart(f"{_WHO} runs an embedder without token types or norm")
    bias = model.decoder.position_bias
    if bias is not None:
        check_kind(bias, (RelativePositionBias,), _WHO, "T5's position bias")
    layers = []
    for layer in model.decoder.layers:
        check_kind(layer, (CrossAttentionBlock,), _WHO, "aiayn's CrossAttentionBlock")
        assert isinstance(layer, CrossAttentionBlock)
        layers.append(layer)
    return layers


@dataclass(frozen=True)
class _Parts:
    """What every decoder layer must share for the step to run it: attention of H heads of size
    d_k with one score scale (None = 1/√d_k, the paper; 1 for T5), the norm placement, and parts
    of the known kinds — SelfAttention/CrossAttention, LayerNorm or RMSNorm (the feed-forward
    network: :meth:`FeedForwardKernel.of <aiayn.inference.kernels.FeedForwardKernel.of>`)."""

    heads: int
    d_k: int
    scale: float | None
    norm_first: bool

    @staticmethod
    def of(layers: list[CrossAttentionBlock]) -> _Parts:
        """The first layer's parts, every layer checked against them."""
        if not layers:
            return _Parts(1, 1, None, False)  # nothing to run
        first = layers[0]
        parts = _Parts(
            first.self_attn.num_heads,
            first.self_attn.d_k,
            first.self_attn.scale,
            first.self_sublayer.norm_first,
        )
        for layer in layers:
            parts.check(layer)
        return parts

    def check(self, layer: CrossAttentionBlock) -> None:
        for attn in (layer.self_attn, layer.cross_attn):
            check_kind(attn, (SelfAttention, CrossAttention), _WHO, "aiayn's attention")
            if (attn.num_heads, attn.d_k, attn.scale) != (self.heads, self.d_k, self.scale):
                raise UnsupportedPart(
                    f"{_WHO} runs one attention shape: {self.heads} heads of size "
                    f"{self.d_k}, scale {self.scale}; got {attn.num_heads} of size {attn.d_k}, "
                    f"scale {attn.scale}"
                )
        for sub in (layer.self_sublayer, layer.cross_sublayer, layer.ff_sublayer):
            check_norm(sub.norm, _WHO)
            if sub.norm_first != self.norm_first:
                placement = f"norm_first={self.norm_first}"
                raise UnsupportedPart(f"{_WHO} runs one norm placement ({placement})")


@dataclass(frozen=True, slots=True)
class _Layer:
    """The weights of one decoder layer (§3.1) as the step uses them."""

    qkv: LinearKernel  # self-attention [W^Q; W^K; W^V]: (D,) -> (3D,)
    self_out: LinearKernel  # self-attention W^O
    cross_query: LinearKernel  # encoder–decoder attention W^Q
    cross_out: LinearKernel  # encoder–decoder attention W^O
    self_norm: NormKernel
    cross_norm: NormKernel
    ff: FeedForwardKernel  # the feed-forward sub-layer, its norm and residual connection

    @staticmethod
    def of(layer: CrossAttentionBlock, norm_first: bool) -> _Layer:
        d = layer.cross_attn.inner_dim  # the query rows of [W^Q; W^K; W^V]
        return _Layer(
            linear_kernel(layer.self_attn.in_proj),
            linear_kernel(layer.self_attn.out_proj),
            linear_kernel(layer.cross_attn.in_proj, slice(0, d)),
            linear_kernel(layer.cross_attn.out_proj),
            NormKernel(layer.self_sublayer.norm),
            NormKernel(layer.cross_sublayer.norm),
            FeedForwardKernel.of(layer.feed_forward, layer.ff_sublayer.norm, norm_first, _WHO),
        )


@dataclass(frozen=True)
class InferenceState:
    """Incremental state of :func:`inference_step`: a state is used once (a step or a selection
    hands its slots on).

    Attributes:
        slots: each row's self-attention keys/values in the step's pool; its length is the
            number of target positions it has decoded (rows that started at other steps have
            other lengths, each at its own positions).
        sources: each row's source keys/values, per layer, in the source pool: the rows of one
            sentence (its beams) share its slot; the length is the source's real tokens.
    """

    slots: SlotRows
    sources: SlotRows

    def repeat_interleave(self, repeats: int) -> InferenceState:
        """Each decoder row becomes ``repeats`` rows (the beams); the source side is shared."""
        rows = self.slots.rows.numel()
        index = torch.arange(rows, device=self.slots.rows.device).repeat_interleave(repeats)
        return self.index_select(index)

    def index_select(self, index: Tensor) -> InferenceState:
        """Rows ``index`` (B',) of B (sentences or beams; a row picked twice gets its own copy
        of its keys/values); the slots no row picks are freed."""
        return InferenceState(self.slots.select(index), self.sources.select_shared(index))

    def advanced(self) -> InferenceState:
        """The state after a step wrote one position per row."""
        return InferenceState(self.slots.advanced(), self.sources)

    def release(self) -> None:
        """Free every row's slots (the decode has ended)."""
        self.slots.release()
        self.sources.release()

    @staticmethod
    def concat(states: list[InferenceState]) -> InferenceState:
        """The rows of ``states`` (one pair of pools) as one batch, each at its own positions."""
        slots = SlotRows.concat([s.slots for s in states])
        return InferenceState(slots, SlotRows.concat([s.sources for s in states]))


@dataclass(frozen=True)
class _ModuleStepState:
    """A state of the module step (:func:`~aiayn.decoding.step.encoder_decoder_step`), which
    :class:`InferenceStep` runs for a model with a part it does not compute, with the step
    function made for its source batch."""

    state: DecoderState
    step: StepFunction

    def repeat_interleave(self, repeats: int) -> _ModuleStepState:
        return _ModuleStepState(self.state.repeat_interleave(repeats), self.step)

    def index_select(self, index: Tensor) -> _ModuleStepState:
        return _ModuleStepState(self.state.index_select(index), self.step)


def inference_step(
    model: EncoderDecoder,
    src: Tensor,
    *,
    banned: tuple[int, ...] | None = None,
    renormalize: bool = False,
    capacity: int = 64,
) -> tuple[InferenceStep, DecoderState]:
    """Encode ``src`` (b, S) once; return the flattened step function and its initial state.

    Same contract as :func:`~aiayn.decoding.step.encoder_decoder_step`: (B, 1) newest tokens
    and a state in, (B, V) log-probabilities (``banned`` tokens, default PAD and BOS, at −inf)
    and the next state out. To decode many source batches with one model, build the
    :class:`InferenceStep` once and call its :meth:`~InferenceStep.initial_state` per batch.
    A model with a part the flattened step does not compute is run by the module step.

    Args:
        model: the model in eval mode, e.g. :func:`~aiayn.inference.packed.pack_for_inference`'s
            copy.
        src: (b, S) source ids.
        banned: tokens never produced.
        renormalize: the distribution over the allowed tokens alone
            (:func:`~aiayn.decoding.step.banned_log_probs`).
        capacity: target positions the cache holds before it first grows.
    """
    step = InferenceStep(model, banned=banned, renormalize=renormalize)
    return step, step.initial_state(src, capacity=capacity)


def _encoder_runner(model: EncoderDecoder) -> EncoderInference | None:
    """The model's encoder run on the real tokens only (:class:`EncoderInference`, held equal
    to the module by its tests), or None where the encoder holds a part or a forward hook that
    path refuses: its module then encodes, the reference arithmetic, and the hooks run."""
    try:
        return EncoderInference(model.encoder)
    except UnsupportedPart:
        return None


class InferenceStep:
    """The decoding step of an encoder–decoder (the paper's, Marian, T5), flattened: (B, 1)
    tokens, state -> (B, V) log-probs, state. Built once per model; inference only (eval mode,
    no gradient flows through it).

    Where the model holds a part this step does not compute, every state and step is the module
    step's (:func:`~aiayn.decoding.step.encoder_decoder_step`), ``fallback`` says why, and the
    reason is logged once per model at debug level.

    Args:
        model: the model in eval mode (its current weights are used, not copied).
        banned: tokens never produced (default PAD and BOS).
        renormalize: the distribution over the allowed tokens alone
            (:func:`~aiayn.decoding.step.banned_log_probs`).
    """

    def __init__(
        self,
        model: EncoderDecoder,
        *,
        banned: tuple[int, ...] | None = None,
        renormalize: bool = False,
    ):
        if model.training:
            raise ValueError("inference_step decodes without dropout: call model.eval() first")
        self.model, self.banned_given, self.renormalize = model, banned, renormalize
        self.encoder: EncoderInference | None = None
        self.fallback: str | None = None  # why the module step runs, or None
        try:
            self._gather(model)
        except UnsupportedPart as part:
            self.fallback = str(part)
            if model not in _told:
                _told.add(model)
                _log.debug("%s runs the module step (encoder_decoder_step): %s", _WHO, part)
        device = model.decoder.embedder.embedding.weight.device
        self.banned = banned_ids(model, banned, device)  # (n,) ids, or None

    def _gather(self, model: EncoderDecoder) -> None:
        """Check the model's parts and gather its decoder's weights (see :class:`_Parts`)."""
        config, decoder = model.config, model.decoder
        self.decoder_layers = _decoder_layers(model)  # checked once: cross K/V come from them
        parts = _Parts.of(self.decoder_layers)
        self.layers = tuple(_Layer.of(layer, parts.norm_first) for layer in self.decoder_layers)
        self.positional = decoder.embedder.positional
        self.embedding = decoder.embedder.embedding.weight.detach()  # (V, D)
        self.scale = decoder.embedder.embedding.scale  # √d_model (the paper), or 1
        with torch.no_grad():  # what the positional encoding adds at positions 0 .. max_len - 1
            zeros = self.embedding.new_zeros(1, config.max_len, self.embedding.size(1))  # (1, P, D)
            self.positions = self.positional(zeros)[0].detach()  # (P, D)
        self.position_bias = decoder.position_bias  # T5's, or None
        self.bias_table = self._bias_table(config.max_len)  # (H, P), or None
        self.final_norm = None if decoder.final_norm is None else NormKernel(decoder.final_norm)
        self.output = linear_kernel(model.output_proj)
        self.output_scale = model.output_scale
        self.norm_first = parts.norm_first
        self.heads, self.d_k, self.attention_scale = parts.heads, parts.d_k, parts.scale
        self.encoder = _encoder_runner(model)

    def _bias_table(self, length: int) -> Tensor | None:
        """T5's decoder bias for query positions < ``length`` (see
        :meth:`~aiayn.layers.relative_position.RelativePositionBias.causal_table`)."""
        if self.position_bias is None:
            return None
        with torch.no_grad():
            return self.position_bias.causal_table(length).detach()  # (H, length)

    def pools(
        self, rows: int, capacity: int, sources: int, length: int
    ) -> tuple[SlotPool, SlotPool]:
        """Empty pools: ``rows`` slots of ``capacity`` target positions, and ``sources`` slots of
        ``length`` source positions (both grow when a decode needs more)."""
        like, n = self.embedding, len(self.layers)
        own = SlotPool(n, self.heads, self.d_k, like, slots=rows, capacity=capacity)
        return own, SlotPool(n, self.heads, self.d_k, like, slots=sources, capacity=length)

    @torch.inference_mode()
    def initial_state(
        self, src: Tensor, *, capacity: int = 64, pools: tuple[SlotPool, SlotPool] | None = None
    ) -> DecoderState:
        """Encode ``src`` (b, S) once: the state before the first step, its rows in free slots
        of ``pools`` (the target's and the source's; new ones when None).

        ``capacity``: target positions the cache holds before it first grows.
        """
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if self.fallback is not None:
            step, state = encoder_decoder_step(
                self.model, src, banned=self.banned_given, renormalize=self.renormalize
            )
            return _ModuleStepState(state, step)
        memory, src_mask, padded = encode_source(self.model, src, self.encoder)  # (b, S, D), ...
        b, s = src.shape
        lengths = src_mask[:, 0, 0, :].sum(dim=1).tolist() if padded else [s] * b  # real tokens
        own, source_pool = pools if pools is not None else self.pools(b, capacity, b, s)
        sources = SlotRows.taken(source_pool, lengths, s)
        kv = [layer.cross_attn.project_key_value(memory) for layer in self.decoder_layers]
        keys = torch.stack([x.key for x in kv])  # N × (b, H, S, d_k) -> (N, b, H, S, d_k)
        source_pool.buffer[:, 0, sources.rows, :, :s] = keys
        source_pool.buffer[:, 1, sources.rows, :, :s] = torch.stack([x.value for x in kv])
        slots = SlotRows.taken(own, [0] * b, capacity)
        return InferenceState(slots, sources)

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """(B, 1) newest tokens -> (B, V) log-probabilities of the next one, and the next state."""
        if isinstance(state, _ModuleStepState):
            log_probs, inner = state.step(tokens, state.state)
            return log_probs, _ModuleStepState(inner, state.step)
        assert isinstance(state, InferenceState)
        rows, sources = state.slots, state.sources
        rows.pool.reserve(rows.longest + 1)
        x = self._embed_rows(tokens[:, -1], rows.lengths, rows.longest)  # (B, D)
        bias = self._self_bias(rows.lengths, rows.longest)  # (B, H, 1, L + 1) or None
        at = rows.write_index()  # (B·H,) the same in every layer
        for i, layer in enumerate(self.layers):
            x = self._self_attention(layer, x, rows.cache(i, at), bias)
            x = self._cross_attention(layer, x, sources.cache(i))
            x = layer.ff(x)  # the feed-forward sub-layer (§3.3)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.output_scale != 1.0:
            x = x * self.output_scale  # T5 v1.0
        logits = self.output(x)  # (B, D) @ (D, V)
        log_probs = banned_log_probs(logits, self.banned, renormalize=self.renormalize)
        return log_probs, state.advanced()

    def _embed_rows(self, tokens: Tensor, positions: Tensor, highest: int) -> Tensor:
        """(B,) tokens at their rows' (B,) ``positions`` (none above ``highest``) -> (B, D):
        embeddings × √d_model + position (§3.4–3.5)."""
        x = F.embedding(tokens, self.embedding).mul_(self.scale)  # (B, D)
        if highest < self.positions.size(0):
            return x.add_(self.positions[positions])  # (B, D) + (B, D)
        return self.positional(x[:, None], positions=positions[:, None])[:, 0]  # (B, 1, D)

    def _self_attention(
        self, w: _Layer, x: Tensor, cache: SlotCache, bias: Tensor | None
    ) -> Tensor:
        """Masked self-attention sub-layer for each row's new position (§3.2.3); x (B, D); the
        row's new key/value is written at its length in its slot, and it attends over its own
        positions (the later ones are not there yet: the causal mask is the lengths); ``bias``
        T5's position bias of the new queries (B, H, 1, L + 1), or None."""
        b, h, d_k = x.size(0), self.heads, self.d_k
        qkv = w.qkv(w.self_norm(x) if self.norm_first else x)  # (B, D) @ (D, 3D) -> (B, 3D)
        key = qkv[:, h * d_k : 2 * h * d_k].view(b, h, 1, d_k)  # (B, D) -> (B, H, 1, d_k)
        value = qkv[:, 2 * h * d_k :].view(b, h, 1, d_k)
        query = qkv[:, : h * d_k].view(b, h, 1, d_k)
        heads = attend_slots(query, cache.append(key, value), bias=bias, scale=self.attention_scale)
        concat = heads.view(b, h * d_k)  # (B, H, 1, d_k) -> (B, D)
        return residual(w.self_out, w.self_norm, self.norm_first, concat, x)  # (B, D)

    def _cross_attention(self, w: _Layer, x: Tensor, cache: SlotCache) -> Tensor:
        """Encoder–decoder attention sub-layer: x (B, D), each row over its source's keys/values
        (its real tokens only; the beams of a sentence share them)."""
        b, h, d_k = x.size(0), self.heads, self.d_k
        query = w.cross_query(w.cross_norm(x) if self.norm_first else x)  # (B, D)
        heads = attend_slots(query.view(b, h, 1, d_k), cache, scale=self.attention_scale)
        concat = heads.view(b, h * d_k)  # (B, H, 1, d_k) -> (B, D)
        return residual(w.cross_out, w.cross_norm, self.norm_first, concat, x)  # (B, D)

    def _self_bias(self, lengths: Tensor, longest: int) -> Tensor | None:
        """T5's bias of each row's query (at its position ``lengths``) over its keys 0 .. its
        position: (B, H, 1, longest + 1), the columns past a row's position unread; or None."""
        if self.bias_table is None:
            return None
        table_length = self.bias_table.size(1)
        if longest >= table_length:  # past the table: a longer one, kept
            self.bias_table = self._bias_table(max(2 * table_length, longest + 1))
            assert self.bias_table is not None
            table_length = self.bias_table.size(1)
        columns = torch.arange(longest + 1, device=lengths.device)  # (L + 1,)
        index = (table_length - 1 - lengths)[:, None] + columns  # (B, L + 1)
        index = index.clamp_(max=table_length - 1)
        bias = self.bias_table[:, index]  # (H, B, L + 1)
        return bias.permute(1, 0, 2)[:, :, None]  # (H, B, L + 1) -> (B, H, 1, L + 1)
