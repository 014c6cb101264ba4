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
  one copy (made by what reads the reordered rows next: the step, a merge or a compaction);
  the cross-attention keys/values are computed once per source.

Rows that started at different steps run in one call (``aiayn serve``):
:func:`merge_inference_states` right-aligns their self-attention columns, the later rows'
leading columns masked (``InferenceState.pads``), each row embedded at its own position, and
pads the shorter sources (masked); T5's bias is a function of the query–key distance, so one
slice serves every row. :func:`compact_inference_state` drops the columns no row needs once
rows have left. Without pads (every row started together) the step is the one-position step.

The model's modules stay the reference: tests check that both steps give the same
log-probabilities at every position, with and without padding and beams, and for merged rows
against each row's module step alone.

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
    states of one decoding run; ``filled`` is how many positions the newest state has written.

    ``rows``: (B',) the rows of ``buffer`` that a selection (``index_select``: beam search's
    surviving beams) keeps, not copied yet, or None: every row, in order. What reads the keys
    and values next (the step, a merge, a compaction) copies the rows out in the copy it makes
    anyway: a selection followed by a merge copies them once, not twice."""

    __slots__ = ("buffer", "filled", "rows")

    def __init__(self, buffer: Tensor, filled: int, rows: Tensor | None = None):
        self.buffer, self.filled, self.rows = buffer, filled, rows

    @staticmethod
    def allocate(
        layers: int, rows: int, heads: int, capacity: int, d_k: int, like: Tensor
    ) -> _SelfKV:
        return _SelfKV(like.new_empty(layers, 2, rows, heads, capacity, d_k), 0)

    @property
    def count(self) -> int:
        """B, the state's rows."""
        return self.buffer.size(2) if self.rows is None else self.rows.numel()

    def copy_columns(self, start: int, stop: int, out: Tensor) -> None:
        """The state's rows' keys/values at columns ``start`` .. ``stop`` - 1 into ``out``,
        (N, 2, B, H, stop - start, d_k)."""
        own = self.buffer[:, :, :, :, start:stop]  # (N, 2, B or more, H, stop - start, d_k)
        if self.rows is None:
            out.copy_(own)
        else:
            torch.index_select(own, 2, self.rows, out=out)  # (N, 2, B, H, stop - start, d_k)


@dataclass(frozen=True)
class InferenceState:
    """Incremental state of :func:`inference_step`.

    Attributes:
        src_mask: (b, 1, 1, S) source padding mask, or None when no source is padded.
        cross: per layer, the encoder output's keys/values (b, H, S, d_k), computed once.
        self_kv: the self-attention keys/values of the positions decoded so far.
        offset: L, the self-attention key columns written so far: the number of target
            positions decoded, when every row started at the same step (``pads`` None).
        group: G, the number of consecutive decoder rows that share one source row (beams).
        pads: (B, 1) per row, the leading key columns that are not its own (rows that joined
            later: :func:`merge_inference_states`; masked, and the row's position is its column
            minus its pads), or None: every row's columns are 0 .. L - 1, the one-position step.
    """

    src_mask: Tensor | None
    cross: tuple[KVCache, ...]
    self_kv: _SelfKV
    offset: int
    group: int = 1
    pads: Tensor | None = None

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
        """The decoder rows ``index`` (B',) of the self-attention keys/values: a selection of
        the buffer's rows, copied out by what reads them next (:class:`_SelfKV`)."""
        kv = self.self_kv
        rows = index if kv.rows is None else kv.rows.index_select(0, index)  # (B',) in buffer
        pads = None if self.pads is None else self.pads.index_select(0, index)  # (B', 1)
        return replace(self, self_kv=_SelfKV(kv.buffer, self.offset, rows), group=group, pads=pads)


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
        # contiguous once here: as the projection's head views, every step's products would
        # copy them (per layer, per step)
        cross = tuple(
            KVCache(kv.key.contiguous(), kv.value.contiguous())  # 2 × (b, H, S, d_k)
            for kv in (layer.cross_attn.project_key_value(memory) for layer in self.decoder_layers)
        )
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
        if state.pads is None:  # every row at position L: no self-attention mask
            x, mask = self._embed(tokens[:, -1], pos), None  # (B, D)
        else:  # rows at their own positions, their columns right-aligned
            x = self._embed_rows(tokens[:, -1], pos - state.pads[:, 0], pos)  # (B, D)
            mask = own_columns(state.pads, pos + 1)  # (B, 1, 1, L + 1)
        bias = self._self_bias(pos)  # (1, H, 1, L + 1) or None: the same in every layer
        for i, layer in enumerate(self.layers):
            x = self._self_attention(layer, x, kv.buffer[i], pos, bias, mask)
            x = self._cross_attention(layer, x, state.cross[i], state.src_mask, state.group)
            x = layer.ff(x)  # the feed-forward sub-layer (§3.3)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.output_scale != 1.0:
            x = x * self.output_scale  # T5 v1.0
        logits = self.output(x)  # (B, D) @ (D, V)
        log_probs = banned_log_probs(logits, self.banned, renormalize=self.renormalize)
        kv.filled = pos + 1
        # built directly: dataclasses.replace goes through every field by name, each step
        advanced = InferenceState(state.src_mask, state.cross, kv, pos + 1, state.group, state.pads)
        return log_probs, advanced

    def _embed(self, tokens: Tensor, pos: int) -> Tensor:
        """(B,) tokens at position ``pos`` -> (B, D) embeddings × √d_model + position (§3.4–3.5)."""
        x = F.embedding(tokens, self.embedding).mul_(self.scale)  # (B, D)
        if pos < self.positions.size(0):
            return x.add_(self.positions[pos])
        return self.positional(x[:, None], pos)[:, 0]  # (B, 1, D) -> (B, D), computed on demand

    def _embed_rows(self, tokens: Tensor, positions: Tensor, highest: int) -> Tensor:
        """(B,) tokens at their rows' (B,) ``positions`` (none above ``highest``) -> (B, D), as
        :meth:`_embed` gives each row at its position."""
        x = F.embedding(tokens, self.embedding).mul_(self.scale)  # (B, D)
        if highest < self.positions.size(0):
            return x.add_(self.positions[positions])  # (B, D) + (B, D)
        return self.positional(x[:, None], positions=positions[:, None])[:, 0]  # (B, 1, D)

    def _writable(self, state: InferenceState) -> _SelfKV:
        """The buffer to write position L into: the state's own, or a copy when it is full, a
        newer state already wrote past L (two continuations of one prefix never share writes),
        or the state is a selection of the buffer's rows (copied out here)."""
        kv, pos = state.self_kv, state.offset
        n, _, _, h, capacity, d_k = kv.buffer.shape
        if kv.rows is None and kv.filled == pos and capacity > pos:
            return kv
        room = kv.rows is not None and capacity > pos  # a selection: the same capacity
        size = capacity if room else max(capacity, 2 * (pos + 1))
        new = _SelfKV.allocate(n, kv.count, h, size, d_k, kv.buffer)
        kv.copy_columns(0, pos, new.buffer[:, :, :, :, :pos])  # (N, 2, B, H, L, d_k)
        new.filled = pos
        return new

    def _self_attention(
        self, w: _Layer, x: Tensor, kv: Tensor, pos: int, bias: Tensor | None, mask: Tensor | None
    ) -> Tensor:
        """Masked self-attention sub-layer for one new position (§3.2.3); x (B, D), kv the
        layer's (2, B, H, C, d_k) buffer, column ``pos`` written here; ``bias`` T5's
        position bias of the new query (1, H, 1, L + 1), or None; ``mask`` (B, 1, 1, L + 1)
        the columns each row may attend to (its own), or None: all of them."""
        b, h, d_k = x.size(0), self.heads, self.d_k
        qkv = w.qkv(w.self_norm(x) if self.norm_first else x)  # (B, D) @ (D, 3D) -> (B, 3D)
        new_kv = qkv[:, h * d_k :].view(b, 2, h, d_k).transpose(0, 1)  # (B, 2D) -> (2, B, H, d_k)
        kv.select(3, pos).copy_(new_kv)  # into position L of (2, B, H, C, d_k)
        keys, values = kv.narrow(3, 0, pos + 1).unbind(0)  # 2 × (B, H, L + 1, d_k)
        query = qkv[:, : h * d_k].view(b, h, 1, d_k)  # (B, D) -> (B, H, 1, d_k)
        heads, _ = scaled_dot_product_attention(
            query, keys, values, mask, bias=bias, scale=self.attention_scale
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


def own_columns(pads: Tensor, columns: int) -> Tensor:
    """Which of ``columns`` right-aligned key columns are each row's own: (B, 1) leading pad
    columns per row -> (B, 1, 1, columns) boolean, True = column ≥ the row's pads (may attend).
    E.g. pads [[0], [2]], 3 columns -> [[T, T, T], [F, F, T]]."""
    index = torch.arange(columns, device=pads.device)  # (columns,)
    return (index >= pads)[:, None, None, :]  # (B, columns) -> (B, 1, 1, columns)


def merge_inference_states(a: DecoderState, b: DecoderState) -> InferenceState:
    """The rows of ``a`` then those of ``b`` in one state of :class:`InferenceStep`, each row
    keeping its own positions: how a decoding run takes in rows that started later, at the next
    step (``aiayn serve``).

    The self-attention keys/values are right-aligned at L = max(L_a, L_b) columns, the shorter
    state.s rows given |L_a − L_b| more leading pad columns (zeros, masked: ``pads``); the source
    keys/values are padded on the right to the longer source, the padding masked. Each row then
    attends to exactly what it attends to alone. Both states need the same G (rows per source);
    the module step's states (a model this step does not compute) do not merge: ValueError."""
    if not (isinstance(a, InferenceState) and isinstance(b, InferenceState)):
        raise ValueError("only the flattened step's states merge (InferenceState)")
    if a.group != b.group:
        raise ValueError(f"states of {a.group} and {b.group} rows per source do not merge")
    length = max(a.offset, b.offset)
    pads = torch.cat([_pads_at(s, length) for s in (a, b)])  # (B_a + B_b, 1)
    src_mask, cross = _merged_source(a, b)
    return InferenceState(src_mask, cross, _merged_self_kv(a, b, length), length, a.group, pads)


def _pads_at(state: InferenceState, length: int) -> Tensor:
    """(B, 1) the rows' leading pad columns once right-aligned at ``length`` columns."""
    rows = state.self_kv.count
    own = state.pads if state.pads is not None else state.self_kv.buffer.new_zeros(rows, 1)
    return own.long() + (length - state.offset)  # (B, 1)


def _merged_self_kv(a: InferenceState, b: InferenceState, length: int) -> _SelfKV:
    """The two states' self-attention keys/values, right-aligned at ``length`` columns in one
    new buffer with room for as many more as the roomier of the two had."""
    n, _, _, h, capacity_a, d_k = a.self_kv.buffer.shape
    rows_a, rows_b, capacity_b = a.self_kv.count, b.self_kv.count, b.self_kv.buffer.size(4)
    room = max(capacity_a - a.offset, capacity_b - b.offset, 1)
    kv = _SelfKV.allocate(n, rows_a + rows_b, h, length + room, d_k, a.self_kv.buffer)
    for state, rows in ((a, slice(0, rows_a)), (b, slice(rows_a, rows_a + rows_b))):
        start = length - state.offset
        kv.buffer[:, :, rows, :, :start].zero_()  # new pad columns: masked, never NaN × 0
        own = kv.buffer[:, :, rows, :, start:length]  # (N, 2, B_s, H, L_s, d_k)
        state.self_kv.copy_columns(0, state.offset, own)
    kv.filled = length
    return kv


def _merged_source(
    a: InferenceState, b: InferenceState
) -> tuple[Tensor | None, tuple[KVCache, ...]]:
    """The source masks (b_a + b_b, 1, 1, S) and per layer the source keys/values (b_a + b_b,
    H, S, d_k), the shorter source padded on the right (masked) to S = max(S_a, S_b); no mask
    when neither is padded."""
    lengths = (a.cross[0].key.size(2), b.cross[0].key.size(2))
    s = max(lengths)
    if a.src_mask is None and b.src_mask is None and lengths[0] == lengths[1]:
        mask = None
    else:
        mask = torch.cat([_right_padded(_source_real(x), s, 3) for x in (a, b)])  # (b, 1, 1, S)
    cross = tuple(
        KVCache(
            torch.cat([_right_padded(ka.key, s, 2), _right_padded(kb.key, s, 2)]),  # (b, H, S, d_k)
            torch.cat([_right_padded(ka.value, s, 2), _right_padded(kb.value, s, 2)]),
        )
        for ka, kb in zip(a.cross, b.cross, strict=True)
    )
    return mask, cross


def _source_real(state: InferenceState) -> Tensor:
    """(b, 1, 1, S) boolean, True = a real source token (all True where no mask is kept)."""
    if state.src_mask is not None:
        return state.src_mask
    key = state.cross[0].key  # (b, H, S, d_k)
    return torch.ones(key.size(0), 1, 1, key.size(2), dtype=torch.bool, device=key.device)


def _right_padded(x: Tensor, length: int, dim: int) -> Tensor:
    """``x`` with zeros (False) after its entries along ``dim``, up to ``length`` of them."""
    missing = length - x.size(dim)
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def compact_inference_state(state: DecoderState) -> DecoderState:
    """``state`` without the columns no row needs any more (after rows have left): the leading
    self-attention columns that are padding in every row, and the trailing source columns that
    are padding in every source row; back to the one-position step (no ``pads``) when no row has
    pad columns left, and to no source mask when no source is padded. Each row's positions and
    results stay. Other states are returned as they are."""
    if not isinstance(state, InferenceState):
        return state
    return _without_pad_sources(_without_pad_columns(state))


def _without_pad_columns(state: InferenceState) -> InferenceState:
    """Without the leading self-attention columns that are padding in every row (a copy)."""
    if state.pads is None or state.pads.numel() == 0:
        return state
    cut = int(state.pads.min())
    if cut == 0:
        return state
    pads = state.pads - cut  # (B, 1)
    old = state.self_kv  # (N, 2, B, H, C, d_k), or a selection of its rows
    n, _, _, h, capacity, d_k = old.buffer.shape
    length = state.offset - cut
    kv = _SelfKV.allocate(n, old.count, h, max(capacity - cut, 1), d_k, old.buffer)
    old.copy_columns(cut, state.offset, kv.buffer[:, :, :, :, :length])  # (N, 2, B, H, L', d_k)
    kv.filled = length
    return replace(state, self_kv=kv, offset=length, pads=pads if bool(pads.any()) else None)


def _without_pad_sources(state: InferenceState) -> InferenceState:
    """Without the trailing source positions that are padding in every source row."""
    if state.src_mask is None or state.src_mask.size(0) == 0:
        return state
    real = state.src_mask[:, 0, 0, :]  # (b, S)
    used = real.any(dim=0).nonzero()  # (k, 1) the source columns some row reads
    s = int(used.max()) + 1 if used.numel() else real.size(1)
    mask: Tensor | None = state.src_mask[:, :, :, :s]  # (b, 1, 1, S')
    if bool(real[:, :s].all()):
        mask = None
    if s == real.size(1) and mask is not None:
        return state
    cross = tuple(KVCache(kv.key[:, :, :s], kv.value[:, :, :s]) for kv in state.cross)
    return replace(state, src_mask=mask, cross=cross)
