"""aiayn models -> CTranslate2 models, through CTranslate2's own converter API (Klein et al.,
"CTranslate2", the OpenNMT inference engine).

A :class:`ctranslate2.converters.Converter` subclass, :class:`AiaynConverter`, hands CTranslate2 a
*spec* built here from an aiayn model's parts; CTranslate2 validates it, quantises it and writes
the folder (``model.bin``, the vocabularies, ``config.json``). The spec is read from the modules
themselves (their norms, attention scales, feed-forward kinds, position modules), so one builder
serves every encoder–decoder family:

    encoder–decoder (the paper's model, post- or pre-norm; Marian; T5)  TransformerSpec
    decoder-only language model (GPT-2)                                 TransformerDecoderModelSpec
    encoder with token types and a pooler (BERT)                        TransformerEncoderModelSpec

What maps where, per block (aiayn -> CTranslate2):

    self_attn.in_proj (3I, D), out_proj      self_attention.linear[0], linear[1]
    cross_attn.in_proj rows Q | K, V         attention.linear[0] | linear[1], out_proj linear[2]
    <sub-layer>.norm                         <sub-layer>.layer_norm (before or after: pre_norm)
    feed_forward.linear1, linear2            ffn.linear_0, ffn.linear_1
    gated: gate, linear1, linear2            ffn.linear_0 (activated), linear_0_noact, linear_1
    T5's relative position bias (buckets, H) self_attention.relative_attention_bias

Positions: a sinusoidal module becomes an explicit table of ``max_len`` rows (at least 1024) in
the model's own layout (the paper's interleaved sin/cos, or Marian's halves), so CTranslate2
never generates its own (whose values are neither layout's); a learned one its weights; none a
zero table. Embeddings keep their scale (√D in the
paper, 1 elsewhere); a stack's final norm, T5's output scale D^−½ and Marian's logits bias carry
over. A part CTranslate2 cannot express is refused by name (:class:`~aiayn.errors.UserError`).

Token strings: CTranslate2 reads and writes tokens, not ids; the vocabularies are the checkpoint
tokenizer's strings in id order (ids a tokenizer does not cover, such as T5's padding rows, get
``<unused_N>``). CTranslate2 appends EOS to each source (``add_source_eos``), as aiayn does, and
starts the decoder from the tokenizer's BOS (the converted models' decoder start token).

This module imports ``ctranslate2`` (the ``ct2`` extra): only :mod:`aiayn.convert.export` imports
it, after checking the extra is there.

Shape legend:  D d_model   I heads × head size   H heads   V vocabulary   P positions
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ctranslate2.converters import Converter
from ctranslate2.specs import common_spec, transformer_spec
from torch import Tensor, nn

from aiayn.attention import CrossAttention, MultiHeadAttention
from aiayn.convert.formats import QUANTIZATIONS
from aiayn.errors import UserError
from aiayn.layers import (
    FeedForward,
    GatedFeedForward,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
)
from aiayn.layers.embedding import Embedder, sinusoidal_encoding
from aiayn.layers.norm import RMSNorm
from aiayn.layers.relative_position import RelativePositionBias
from aiayn.layers.transformer_layers import CrossAttentionBlock, SelfAttentionBlock

_ACTIVATIONS = {
    "relu": common_spec.Activation.RELU,
    "gelu": common_spec.Activation.GELU,
    "gelu_tanh": common_spec.Activation.GELUTanh,
    "silu": common_spec.Activation.SWISH,
}


class AiaynConverter(Converter):
    """CTranslate2's converter for a spec built by one of this module's builders: ``convert(out,
    quantization=...)`` validates, quantises and writes it (CTranslate2's own steps)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build

    def _load(self) -> Any:
        return self._build()


def write_ct2(spec_builder: Callable[[], Any], out: Path, quantization: str) -> Path:
    """Write the spec ``spec_builder()`` builds as a CTranslate2 folder ``out`` (which must not
    exist) with weights of type ``quantization`` (:data:`QUANTIZATIONS`)."""
    if quantization not in QUANTIZATIONS:
        offered = ", ".join(QUANTIZATIONS)
        raise UserError(f"--quantization {quantization!r} is not offered (choose from {offered})")
    return Path(AiaynConverter(spec_builder).convert(str(out), quantization=quantization))


# -- the families' entries (the registry's ``to_ct2``) --------------------------------------------


def encoder_decoder_to_ct2(model: nn.Module, source: object) -> Callable[[], Any]:
    """The spec builder of an encoder–decoder (the paper's model, Marian, T5) and the
    checkpoint's translation tokenizer ``source`` (a ``tokenizer.json`` path or a pretrained
    tokenizer)."""
    from aiayn.data import Tokenizer
    from aiayn.models.transformer import EncoderDecoder

    assert isinstance(model, EncoderDecoder)
    tokenizer = Tokenizer.load(source) if isinstance(source, Path) else source

    def build() -> Any:
        spec = encoder_decoder_spec(model)
        c = model.config
        sources = token_strings(tokenizer, c.vocab_size)
        targets = token_strings(tokenizer, getattr(c, "target_vocab_size", c.vocab_size), True)
        spec.register_source_vocabulary(sources)
        spec.register_target_vocabulary(targets)
        _set_seq2seq_config(spec.config, tokenizer, sources, targets, _norm_eps(model))
        return spec

    return build


def decoder_only_to_ct2(model: nn.Module, source: object) -> Callable[[], Any]:
    """The spec builder of a decoder-only language model (GPT-2) and its ``tokenizer.json``."""
    from aiayn.data.text_tokenizer import load_lm_tokenizer
    from aiayn.models.gpt2 import GPT2

    assert isinstance(model, GPT2)
    if not isinstance(source, Path):
        raise UserError(f"a language model's checkpoint holds a tokenizer.json, not {source!r}")
    tokenizer = load_lm_tokenizer(source)

    def build() -> Any:
        spec = language_model_spec(model)
        tokens = token_strings(tokenizer, model.config.vocab_size)
        spec.register_vocabulary(tokens)
        c, config = model.config, spec.config
        config.bos_token, config.eos_token = tokens[c.bos_id], tokens[c.eos_id]
        unk = getattr(tokenizer, "unk_id", None)
        config.unk_token = tokens[c.eos_id if unk is None else unk]
        config.layer_norm_epsilon = _norm_eps(model)
        return spec

    return build


def encoder_to_ct2(model: nn.Module, source: object) -> Callable[[], Any]:
    """The spec builder of an encoder with token types and an optional pooler (BERT), and its
    WordPiece tokenizer. The masked-LM or classification head stays behind: CTranslate2's
    encoder gives the final states and the pooled state."""
    from aiayn.data.bert_tokenizer import BertTokenizer
    from aiayn.models.bert import BERT

    assert isinstance(model, BERT)
    if not isinstance(source, BertTokenizer):
        raise UserError(f"an encoder's checkpoint holds a WordPiece tokenizer, not {source!r}")

    def build() -> Any:
        spec = encoder_model_spec(model)
        tokens = token_strings(source, model.config.vocab_size)
        spec.register_vocabulary(tokens)
        spec.config.unk_token = tokens[source.unk_id]
        spec.config.layer_norm_epsilon = _norm_eps(model)
        return spec

    return build


# -- vocabularies ---------------------------------------------------------------------------------


def token_strings(tokenizer: Any, size: int, target: bool = False) -> list[str]:
    """The ``size`` token strings of ids 0 .. size − 1 (the target side's with ``target``, for a
    tokenizer with separate vocabularies); an id without a string gets ``<unused_N>``.

    Raises:
        UserError: two ids with one string (CTranslate2 maps strings back to ids).
    """
    separate = target and getattr(tokenizer, "separate_vocabs", False)
    lookup = partial(tokenizer.id_to_token, target=True) if separate else tokenizer.id_to_token
    tokens: list[str | None] = [lookup(i) for i in range(size)]
    taken = {t for t in tokens if t is not None}
    out: list[str] = []
    for i, token in enumerate(tokens):
        if token is None:
            token = f"<unused_{i}>"
            while token in taken:
                token = f"<{token}>"
            taken.add(token)
        out.append(token)
    seen: set[str] = set()
    for token in out:
        if token in seen:
            raise UserError(f"the vocabulary spells two ids {token!r}: CTranslate2 needs one each")
        seen.add(token)
    return out


def _set_seq2seq_config(
    config: Any, tokenizer: Any, sources: Sequence[str], targets: Sequence[str], eps: float
) -> None:
    """Special tokens as aiayn's translation uses them: EOS appended to each source, the
    decoder started from BOS, and LayerNorm's ε. CTranslate2 names each by one string, looked
    up in either vocabulary: with separate vocabularies both must spell the id alike."""
    for name in ("eos_id", "bos_id"):
        i = getattr(tokenizer, name)
        if sources[i] != targets[i]:
            raise UserError(
                f"the source and target vocabularies spell {name} {i} differently "
                f"({sources[i]!r}, {targets[i]!r}): CTranslate2 names it by one string"
            )
    config.bos_token = targets[tokenizer.bos_id]
    config.decoder_start_token = targets[tokenizer.bos_id]
    config.eos_token = targets[tokenizer.eos_id]
    unk = getattr(tokenizer, "unk_id", None)
    config.unk_token = sources[tokenizer.eos_id if unk is None else unk]
    config.add_source_eos = True
    config.layer_norm_epsilon = eps


# -- specs ------------------------------------------------------------------------------------


def encoder_decoder_spec(model: Any) -> Any:
    """The TransformerSpec of an :class:`~aiayn.models.transformer.EncoderDecoder` (weights
    set; vocabularies and special tokens are the caller's)."""
    enc, dec = model.encoder, model.decoder
    encoder = transformer_spec.TransformerEncoderSpec(
        len(enc.layers), **_stack_options(enc.layers, enc.final_norm, enc.position_bias)
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        len(dec.layers), **_stack_options(dec.layers, dec.final_norm, dec.position_bias)
    )
    _fill_stack(encoder, enc, [encoder.embeddings[0]])
    _fill_stack(decoder, dec, [decoder.embeddings])
    _set_linear(decoder.projection, model.output_proj)
    if model.output_scale != 1.0:
        decoder.scale_outputs = float(model.output_scale)
    return transformer_spec.TransformerSpec(encoder, decoder)


def language_model_spec(model: Any) -> Any:
    """The TransformerDecoderModelSpec of a decoder-only model (GPT-2): its blocks are
    self-attention blocks, run causally."""
    options = _stack_options(model.layers, model.final_norm, None)
    decoder = transformer_spec.TransformerDecoderSpec(
        len(model.layers), with_encoder_attention=False, **options
    )
    _fill_embedder(decoder, model.embedder, [decoder.embeddings])
    for layer_spec, block in zip(decoder.layer, model.layers, strict=True):
        _fill_self_block(layer_spec, block)
    _set_norm(decoder.layer_norm, model.final_norm)
    _set_linear(decoder.projection, model.output_proj)
    return transformer_spec.TransformerDecoderModelSpec(decoder)


def encoder_model_spec(model: Any) -> Any:
    """The TransformerEncoderModelSpec of BERT: word and token-type embeddings added, learned
    positions, the embeddings' LayerNorm, post-norm blocks and the tanh pooler."""
    enc = model.encoder
    embedder = enc.embedder
    if embedder.token_types is None or embedder.norm is None:
        raise UserError("this encoder has no token types or embedding norm: not BERT's layout")
    encoder = transformer_spec.TransformerEncoderSpec(
        len(enc.layers),
        num_source_embeddings=2,
        embeddings_merge=common_spec.EmbeddingsMerge.ADD,
        layernorm_embedding=True,
        **_stack_options(enc.layers, enc.final_norm, None),
    )
    _fill_stack(encoder, enc, encoder.embeddings)
    encoder.embeddings[1].weight = embedder.token_types.weight  # (T, D)
    _set_norm(encoder.layernorm_embedding, embedder.norm)
    spec = transformer_spec.TransformerEncoderModelSpec(
        encoder, pooling_layer=model.pooler is not None
    )
    if model.pooler is not None:
        _set_linear(spec.pooler_dense, model.pooler.dense)
    return spec


def _stack_options(
    layers: Sequence[nn.Module], final_norm: nn.Module | None, bias: nn.Module | None
) -> dict[str, Any]:
    """The spec options a stack's parts ask for: heads, head size, pre/post-norm, the final
    norm, RMSNorm, the activation, a gated feed-forward network, T5's relative bias."""
    if not layers:
        raise UserError("a stack without layers cannot be written for CTranslate2")
    block = layers[0]
    if not isinstance(block, (SelfAttentionBlock, CrossAttentionBlock)):
        raise UserError(f"a {type(block).__name__} block has no CTranslate2 equivalent")
    attention, feed_forward = block.self_attn, block.feed_forward
    if not isinstance(feed_forward, (FeedForward, GatedFeedForward)):
        raise UserError(f"a {type(feed_forward).__name__} has no CTranslate2 equivalent")
    if feed_forward.activation_name not in _ACTIVATIONS:
        raise UserError(
            f"activation {feed_forward.activation_name!r} has no CTranslate2 equivalent"
        )
    norm_first = _sublayers(block)[0].norm_first
    if norm_first and final_norm is None:
        raise UserError("a pre-norm stack without a final norm has no CTranslate2 equivalent")
    options: dict[str, Any] = {
        "num_heads": attention.num_heads,
        "pre_norm": norm_first,
        "activation": _ACTIVATIONS[feed_forward.activation_name],
        "ffn_glu": isinstance(feed_forward, GatedFeedForward),
        "rms_norm": isinstance(_sublayers(block)[0].norm, RMSNorm),
        "relative_attention_bias": bias is not None,
    }
    if attention.inner_dim != attention.d_model:
        options["head_dim"] = attention.d_k
    return options


def _sublayers(block: nn.Module) -> list[Any]:
    """A block's residual sub-layers, in order."""
    if isinstance(block, CrossAttentionBlock):
        return [block.self_sublayer, block.cross_sublayer, block.ff_sublayer]
    assert isinstance(block, SelfAttentionBlock)
    return [block.attn_sublayer, block.ff_sublayer]


def _fill_stack(spec: Any, stack: Any, embeddings: Sequence[Any]) -> None:
    """An encoder or decoder stack: its embedder, blocks, final norm and relative bias."""
    _fill_embedder(spec, stack.embedder, embeddings)
    for layer_spec, block in zip(spec.layer, stack.layers, strict=True):
        if isinstance(block, CrossAttentionBlock):
            _fill_cross_block(layer_spec, block)
        else:
            _fill_self_block(layer_spec, block)
    if stack.final_norm is not None:
        _set_norm(spec.layer_norm, stack.final_norm)
    if stack.position_bias is not None:
        _set_relative_bias(spec.layer, stack.position_bias)


def _fill_embedder(spec: Any, embedder: Embedder, embeddings: Sequence[Any]) -> None:
    """Token embedding and its scale, and the position table (none with a relative bias)."""
    token = embedder.embedding
    if not isinstance(token, TokenEmbedding):
        raise UserError(f"a {type(token).__name__} has no CTranslate2 equivalent")
    embeddings[0].weight = token.weight  # (V, D)
    spec.scale_embeddings = float(token.scale)
    if hasattr(spec, "position_encodings"):
        spec.position_encodings.encodings = position_table(embedder.positional, token.d_model)
    elif not isinstance(embedder.positional, NoPositionalEncoding):
        raise UserError("a stack with a relative position bias must have no positional encoding")


MIN_POSITIONS = 1024
"""Fewest rows of a computed position table (sinusoids, or zeros for none): aiayn computes
positions past ``max_len`` on demand, CTranslate2 refuses positions past its table, and
decodes up to 256 tokens by default."""


def position_table(positional: nn.Module, d_model: int) -> Tensor:
    """The (P, D) positions CTranslate2 adds: the module's sinusoids (its own layout) for its
    ``max_len`` positions and at least :data:`MIN_POSITIONS`, its learned table, or zeros (no
    positions)."""
    if isinstance(positional, SinusoidalPositionalEncoding):
        length = max(positional.table.size(0), MIN_POSITIONS)
        return sinusoidal_encoding(length, d_model, layout=positional.layout)  # (P, D)
    if isinstance(positional, LearnedPositionalEmbedding):
        return positional.weight  # (P, D)
    if isinstance(positional, NoPositionalEncoding):
        return torch.zeros(MIN_POSITIONS, d_model)  # (P, D)
    raise UserError(f"a {type(positional).__name__} has no CTranslate2 equivalent")


def _fill_self_block(spec: Any, block: SelfAttentionBlock) -> None:
    """One self-attention block (an encoder layer, or a decoder-only model's layer)."""
    _fill_attention(spec.self_attention, block.self_attn)
    _set_norm(spec.self_attention.layer_norm, block.attn_sublayer.norm)
    _fill_feed_forward(spec.ffn, block.feed_forward)
    _set_norm(spec.ffn.layer_norm, block.ff_sublayer.norm)


def _fill_cross_block(spec: Any, block: CrossAttentionBlock) -> None:
    """One decoder layer: self-attention, encoder–decoder attention, feed-forward."""
    _fill_attention(spec.self_attention, block.self_attn)
    _set_norm(spec.self_attention.layer_norm, block.self_sublayer.norm)
    _fill_attention(spec.attention, block.cross_attn)
    _set_norm(spec.attention.layer_norm, block.cross_sublayer.norm)
    _fill_feed_forward(spec.ffn, block.feed_forward)
    _set_norm(spec.ffn.layer_norm, block.ff_sublayer.norm)


def _fill_attention(spec: Any, attention: MultiHeadAttention) -> None:
    """[W^Q; W^K; W^V] as one linear (self-attention) or W^Q | [W^K; W^V] (encoder–decoder
    attention), W^O, and the scale on Q Kᵀ when it is not 1/√d_k."""
    proj = attention.in_proj
    if not isinstance(proj, nn.Linear):
        raise UserError("an attention layer packed for inference cannot be exported")
    i = attention.inner_dim
    bias = proj.bias
    if isinstance(attention, CrossAttention):
        spec.linear[0].weight = proj.weight[:i]  # (I, D): W^Q
        spec.linear[1].weight = proj.weight[i:]  # (2I, D): [W^K; W^V]
        if bias is not None:
            spec.linear[0].bias, spec.linear[1].bias = bias[:i], bias[i:]
    else:
        _set_linear(spec.linear[0], proj)  # (3I, D)
    _set_linear(spec.linear[-1], attention.out_proj)  # (D, I)
    if attention.scale is not None:
        spec.queries_scale = float(attention.scale)


def _fill_feed_forward(spec: Any, feed_forward: nn.Module) -> None:
    """W_1 (activated), W_2; a gated network's gate is CTranslate2's activated ``linear_0``."""
    if isinstance(feed_forward, GatedFeedForward):
        _set_linear(spec.linear_0, feed_forward.gate)
        _set_linear(spec.linear_0_noact, feed_forward.linear1)
    else:
        assert isinstance(feed_forward, FeedForward)
        _set_linear(spec.linear_0, feed_forward.linear1)
    _set_linear(spec.linear_1, feed_forward.linear2)


def _set_relative_bias(layers: Sequence[Any], bias: RelativePositionBias) -> None:
    """T5's bias table (buckets, H), computed once per stack: every layer's self-attention
    holds the same one (CTranslate2 stores it once)."""
    if bias.num_buckets != bias.embedding.num_embeddings:
        raise UserError("the relative position bias table does not match its bucket count")
    for layer in layers:
        layer.self_attention.relative_attention_bias = bias.embedding.weight  # (buckets, H)
        layer.self_attention.relative_attention_max_distance = np.int32(bias.max_distance)


def _set_linear(spec: Any, linear: nn.Module) -> None:
    """A linear layer's weight (out, in) and bias."""
    if not isinstance(linear, nn.Linear):
        raise UserError(f"a {type(linear).__name__} has no CTranslate2 equivalent")
    spec.weight = linear.weight
    if linear.bias is not None:
        spec.bias = linear.bias


def _set_norm(spec: Any, norm: nn.Module) -> None:
    """LayerNorm's γ and β, or RMSNorm's γ."""
    if isinstance(norm, nn.LayerNorm):
        spec.gamma, spec.beta = norm.weight, norm.bias
    elif isinstance(norm, RMSNorm):
        spec.gamma = norm.weight
    else:
        raise UserError(f"a {type(norm).__name__} has no CTranslate2 equivalent")


def _norm_eps(model: nn.Module) -> float:
    """The ε every norm of the model shares (CTranslate2 has one per model)."""
    eps = {float(m.eps) for m in model.modules() if isinstance(m, (nn.LayerNorm, RMSNorm))}
    if len(eps) != 1:
        raise UserError(f"the model's norms use several ε ({sorted(eps)}): CTranslate2 has one")
    return eps.pop()
