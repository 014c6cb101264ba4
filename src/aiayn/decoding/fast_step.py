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
- the self-attention keys/values of every layer live in one preallocated buffer, written in
  place one position per step (its capacity doubles when full), reordered for beam search in
  one copy; the cross-attention keys/values are computed once per source.

The model's modules stay the reference: tests check that both steps give the same
log-probabilities at every position, with and without padding and beams.

Shape legend:
    B decoder rows (sentences × beams)   G rows per source row   b source rows (B = b·G)
    S source length   D d_model   H heads   d_k size per head   N layers   C cache capacity
    P positions of the precomputed tables
    L positions decoded so far   V vocabulary
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import CrossAttention, KVCache, SelfAttention, scaled_dot_product_attention
from aiayn.decoding.step import (
    DecoderState,
    StepFunction,
    banned_ids,
    banned_log_probs,
    encode_source,
    encoder_decoder_step,
    select_source_rows,
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


class _SelfKV:
    """Self-attention keys/values of every layer, (N, 2, B, H, C, d_k), shared by the successive
    states of one decoding run; ``filled`` is how many positions the newest state has written."""

    __slots__ = ("buffer", "filled")

    def __init__(self, buffer: Tensor, filled: int):
        self.buffer, self.filled = buffer, filled

    @staticmethod
    def allocate(
        layers: int, rows: int, heads: int, capacity: int, d_k: int, like: Tensor
    ) -> _SelfKV:
        return _SelfKV(like.new_empty(layers, 2, rows, heads, capacity, d_k), 0)


@dataclass(frozen=True)
class InferenceState:
    """Incremental state of :func:`inference_step`.

    Attributes:
        src_mask: (b, 1, 1, S) source padding mask, or None when no source is padded.
        cross: per layer, the encoder output's keys/values (b, H, S, d_k), computed once.
        self_kv: the self-attention keys/values of the positions decoded so far.
        offset: L, the number of target positions decoded so far.
        group: G, the number of consecutive decoder rows that share one source row (beams).
    """

    src_mask: Tensor | None
    cross: tuple[KVCache, ...]
    self_kv: _SelfKV
    offset: int
    group: int = 1

    def repeat_interleave(self, repeats: int) -> InferenceState:
        """Each decoder row becomes ``repeats`` rows (the beams); the source side is not copied."""
        rows = self.cross[0].key.size(0) * self.group  # B = b·G
        index = torch.arange(rows, device=self.cross[0].key.device)
        return self._with_rows(index.repeat_interleave(repeats), self.group * repeats)

    def index_select(self, index: Tensor) -> InferenceState:
        """Reorder/select decoder rows (sentences or beams): index is (B'·G,) into B·G; the
        source side follows as :func:`~aiayn.decoding.step.select_source_rows` says."""
        source_rows = self.cross[0].key.size(0)
        sentences, group = select_source_rows(index, source_rows, self.group)
        state = self._with_rows(index, group)
        if sentences is None:
            return state
        return replace(
            state,
            src_mask=None if self.src_mask is None else self.src_mask.index_select(0, sentences),
            cross=tuple(kv.index_select(sentences) for kv in self.cross),
        )

    def _with_rows(self, index: Tensor, group: int) -> InferenceState:
        """The decoder rows ``index`` (B',) of the self-attention keys/values, in a new buffer."""
        old = self.self_kv.buffer  # (N, 2, B, H, C, d_k)
        n, _, _, h, capacity, d_k = old.shape
        new = _SelfKV.allocate(n, index.numel(), h, capacity, d_k, old)
        filled = new.buffer[:, :, :, :, : self.offset]  # (N, 2, B', H, L, d_k)
        torch.index_select(old[:, :, :, :, : self.offset], 2, index, out=filled)
        new.filled = self.offset
        return replace(self, self_kv=new, group=group)


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

    @torch.inference_mode()
    def initial_state(self, src: Tensor, *, capacity: int = 64) -> DecoderState:
        """Encode ``src`` (b, S) once: the state before the first step.

        As :func:`~aiayn.decoding.step.encode_source` says, no source mask is kept when no
        source is padded. ``capacity``: target positions the cache holds before it first grows.
        """
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if self.fallback is not None:
            step, state = encoder_decoder_step(
                self.model, src, banned=self.banned_given, renormalize=self.renormalize
            )
            return _ModuleStepState(state, step)
        memory, src_mask, padded = encode_source(self.model, src, self.encoder)  # (b, S, D), ...
        mask = src_mask if padded else None
        cross = tuple(layer.cross_attn.project_key_value(memory) for layer in self.decoder_layers)
        n = len(self.layers)
        kv = _SelfKV.allocate(n, src.size(0), self.heads, capacity, self.d_k, memory)
        return InferenceState(mask, cross, kv, 0)

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """(B, 1) newest tokens -> (B, V) log-probabilities of the next one, and the next state."""
        if isinstance(state, _ModuleStepState):
            log_probs, inner = state.step(tokens, state.state)
            return log_probs, _ModuleStepState(inner, state.step)
        assert isinstance(state, InferenceState)
        kv = self._writable(state)
        pos = state.offset
        x = self._embed(tokens[:, -1], pos)  # (B, D)
        bias = self._self_bias(pos)  # (1, H, 1, L + 1) or None: the same in every layer
        for i, layer in enumerate(self.layers):
            x = self._self_attention(layer, x, kv.buffer[i], pos, bias)
            x = self._cross_attention(layer, x, state.cross[i], state.src_mask, state.group)
            x = layer.ff(x)  # the feed-forward sub-layer (§3.3)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.output_scale != 1.0:
            x = x * self.output_scale  # T5 v1.0
        logits = self.output(x)  # (B, D) @ (D, V)
        log_probs = banned_log_probs(logits, self.banned, renormalize=self.renormalize)
        kv.filled = pos + 1
        return log_probs, InferenceState(state.src_mask, state.cross, kv, pos + 1, state.group)

    def _embed(self, tokens: Tensor, pos: int) -> Tensor:
        """(B,) tokens at position ``pos`` -> (B, D) embeddings × √d_model + position (§3.4–3.5)."""
        x = F.embedding(tokens, self.embedding).mul_(self.scale)  # (B, D)
        if pos < self.positions.size(0):
            return x.add_(self.positions[pos])
        return self.positional(x[:, None], pos)[:, 0]  # (B, 1, D) -> (B, D), computed on demand

    def _writable(self, state: InferenceState) -> _SelfKV:
        """The buffer to write position L into: the state's own, or a copy when it is full or a
        newer state already wrote past L (two continuations of one prefix never share writes)."""
        kv, pos = state.self_kv, state.offset
        n, _, rows, h, capacity, d_k = kv.buffer.shape
        if kv.filled == pos and capacity > pos:
            return kv
        new = _SelfKV.allocate(n, rows, h, max(capacity, 2 * (pos + 1)), d_k, kv.buffer)
        new.buffer[:, :, :, :, :pos] = kv.buffer[:, :, :, :, :pos]  # (N, 2, B, H, L, d_k)
        new.filled = pos
        return new

    def _self_attention(
        self, w: _Layer, x: Tensor, kv: Tensor, pos: int, bias: Tensor | None
    ) -> Tensor:
        """Masked self-attention sub-layer for one new position (§3.2.3); x (B, D), kv the
        layer's (2, B, H, C, d_k) buffer, position ``pos`` written here; ``bias`` T5's
        position bias of the new query (1, H, 1, L + 1), or None."""
        b, h, d_k = x.size(0), self.heads, self.d_k
        qkv = w.qkv(w.self_norm(x) if self.norm_first else x)  # (B, D) @ (D, 3D) -> (B, 3D)
        new_kv = qkv[:, h * d_k :].view(b, 2, h, d_k).transpose(0, 1)  # (B, 2D) -> (2, B, H, d_k)
        kv.select(3, pos).copy_(new_kv)  # into position L of (2, B, H, C, d_k)
        keys, values = kv.narrow(3, 0, pos + 1).unbind(0)  # 2 × (B, H, L + 1, d_k)
        query = qkv[:, : h * d_k].view(b, h, 1, d_k)  # (B, D) -> (B, H, 1, d_k)
        heads, _ = scaled_dot_product_attention(
            query, keys, values, bias=bias, scale=self.attention_scale
        )  # (B, H, 1, d_k)
        concat = heads.view(b, h * d_k)  # (B, H, 1, d_k) -> (B, D)
        return residual(w.self_out, w.self_norm, self.norm_first, concat, x)  # (B, D)

    def _cross_attention(
        self, w: _Layer, x: Tensor, kv: KVCache, mask: Tensor | None, group: int
    ) -> Tensor:
        """Encoder–decoder attention sub-layer: x (B, D) over the source keys/values (b, H, S,
        d_k); the G rows of one source attend as G queries of it (no key/value copied)."""
        b_rows, h, d_k = x.size(0), self.heads, self.d_k
        query = w.cross_query(w.cross_norm(x) if self.norm_first else x)  # (B, D)
        query = query.view(b_rows // group, group, h, d_k).transpose(1, 2)  # (b, H, G, d_k)
        heads, _ = scaled_dot_product_attention(
            query, kv.key, kv.value, mask, scale=self.attention_scale
        )  # (b, H, G, d_k)
        concat = heads.transpose(1, 2).reshape(b_rows, h * d_k)  # (b, G, H, d_k) -> (B, D)
        return residual(w.cross_out, w.cross_norm, self.norm_first, concat, x)  # (B, D)

    def _self_bias(self, pos: int) -> Tensor | None:
        """T5's bias of the query at ``pos`` over keys 0 .. pos: (1, H, 1, pos + 1), or None."""
        if self.bias_table is None:
            return None
        length = self.bias_table.size(1)
        if pos >= length:  # past the table: a longer one, kept
            self.bias_table = self._bias_table(max(2 * length, pos + 1))
            assert self.bias_table is not None
            length = self.bias_table.size(1)
        return self.bias_table[None, :, None, length - 1 - pos :]  # (H, L+1) -> (1, H, 1, L + 1)
