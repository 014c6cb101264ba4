"""A real checkpoint's first self-attention layer, taken apart (``aiayn explain --checkpoint``).

Each family has a function (:class:`~aiayn.models.families.Family`'s ``first_layer``) that reads
the user's sentence (or image) with the checkpoint's own tokenizer (or image preprocessing) and
returns a :class:`FirstLayerInputs`: the token ids, the parts the family's embedder adds up
(token embeddings, scaled as the family scales them; positions: the paper's sinusoids (§3.5),
Marian's sinusoids in halves, learned tables (GPT-2, BERT, ViT), or none (T5, whose order comes
from a relative position bias on the scores); BERT's token types and LayerNorm; ViT's patch
projection and class token), the first block's norm (pre-norm families) and self-attention
module, its mask and bias, and the attention weights the model's own forward returns for that
layer (``need_weights=True``).

:func:`trace_first_layer` then redoes the layer with explicit float64 arithmetic for one head:
Q, K, V (§3.2.2), the scores Q Kᵀ, the scaling (1/√d_k, eq. 1; T5: none) and T5's bias, the mask,
the softmax and the head's output, then Concat · W_O. :func:`check_first_layer` holds it to the
model: the embedder's own output, the model's own attention weights, and the layer's
:class:`~aiayn.attention.SelfAttention` module run in float64 on the same input.
:func:`format_first_layer` prints it, each (T, D) matrix cut to its first ``columns`` columns.

The walk-through of every family is one code path: the family functions only say which stack,
tokens and forward are theirs.

Shape legend:
    T  tokens (with the family's special tokens; ViT: class token + N patches)
    D  d_model      H  heads      d_k  per-head size (T5: d_kv)      I = H·d_k
    N  patches      C·P·P  the pixels of one patch (channels × patch side²)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import SelfAttention, causal_mask
from aiayn.errors import UserError
from aiayn.layers import (
    Embedder,
    LearnedPositionalEmbedding,
    NoPositionalEncoding,
    SelfAttentionBlock,
    SinusoidalPositionalEncoding,
)
from aiayn.limits import MAX_EXPLAIN_TOKENS

__all__ = [
    "FirstLayerCheck",
    "FirstLayerInputs",
    "FirstLayerTrace",
    "InputPart",
    "bert_first_layer",
    "check_first_layer",
    "decoder_only_first_layer",
    "encoder_decoder_first_layer",
    "format_first_layer",
    "trace_first_layer",
    "vit_first_layer",
]

_DTYPE = torch.float64
_LIBRARY_TOLERANCE = 1e-9  # float64 against float64
_MODEL_TOLERANCE = 1e-4  # float64 against the model's float32 forward


@dataclass(frozen=True, eq=False)
class InputPart:
    """One (T, D) matrix of the embedder, named as the printout names it."""

    title: str
    matrix: Tensor


@dataclass(frozen=True, eq=False)
class FirstLayerInputs:
    """What a family's first layer reads, and what the model itself computed from it.

    Attributes:
        stack: which stack the layer is in ("encoder", "decoder-only stack").
        num_layers: the layers of that stack.
        labels: the T tokens' labels.
        ids: the T token ids, or None (ViT: pixels).
        parts: the embedder's parts in order, each (T, D) float64.
        combine: how the parts make x, in words ("X = E·√D + PE").
        x: (T, D) float64, the parts combined explicitly.
        model_x: (T, D) the model's own embedder output (eval mode).
        norm: the block's norm before attention (pre-norm), or None (post-norm: attention reads x).
        attention: the first block's self-attention module.
        mask: (T, T) boolean, True = may attend, or None (every token sees every token).
        bias: (H, T, T) additive scores (T5's relative position bias), or None.
        model_weights: (H, T, T) the layer's attention weights from the model's own forward.
    """

    stack: str
    num_layers: int
    labels: tuple[str, ...]
    ids: tuple[int, ...] | None
    parts: tuple[InputPart, ...]
    combine: str
    x: Tensor
    model_x: Tensor
    norm: nn.Module | None
    attention: SelfAttention
    mask: Tensor | None
    bias: Tensor | None
    model_weights: Tensor

    @property
    def num_tokens(self) -> int:
        """T."""
        return len(self.labels)


# -- reading the input ---------------------------------------------------------------------------


def _check_tokens(count: int) -> None:
    if count > MAX_EXPLAIN_TOKENS:
        raise UserError(
            f"the input has {count} tokens, more than explain traces (at most "
            f"{MAX_EXPLAIN_TOKENS}, aiayn.limits.MAX_EXPLAIN_TOKENS): it prints every score of a "
            "short sentence; shorten it"
        )


def _label(decode: Callable[[list[int]], str], token_id: int, specials: dict[int, str]) -> str:
    """A readable label: specials by name, a word-initial space as ``▁``, else ``#id``."""
    if token_id in specials:
        return specials[token_id]
    text = decode([token_id])
    if not text or "\ufffd" in text:
        return f"#{token_id}"
    return "▁" + text[1:] if text.startswith(" ") else text


def _text_parts(embedder: Embedder, ids: Tensor) -> tuple[list[InputPart], Tensor, str]:
    """The parts of a text embedder for (T,) ids, their explicit combination x (T, D) and how
    they combine, in float64: E[id]·scale, + positions, + token types, then the norm."""
    t = ids.numel()
    rows = embedder.embedding.weight.detach()[ids].to(_DTYPE)  # (T, D)
    scale = float(embedder.embedding.scale)
    parts = [InputPart("Token embeddings E[id] (§3.4)", rows)]
    x, words = rows, "E"
    if scale != 1.0:
        x = rows * scale
        parts.append(InputPart(f"E · √d_model = E × {scale:.4f} (§3.4)", x))
        words = "E·√D"
    position = _positions(embedder.positional, t)
    if position is not None:
        parts.append(position)
        x = x + position.matrix
        words += " + P"
    if embedder.token_types is not None:
        types = embedder.token_types.weight.detach()[0].to(_DTYPE).expand(t, -1)  # (T, D)
        parts.append(InputPart("Token-type embeddings (segment A: type 0)", types))
        x, words = x + types, words + " + type"
    if embedder.norm is not None:
        x = copy.deepcopy(embedder.norm).to(_DTYPE)(x)
        parts.append(InputPart(f"LayerNorm({words})", x))
        words = f"LayerNorm({words})"
    return parts, x, f"X = {words}"


def _positions(positional: nn.Module, t: int) -> InputPart | None:
    """The positional part of a text embedder for positions 0..T-1, or None (no encoding)."""
    if isinstance(positional, SinusoidalPositionalEncoding):
        how = "interleaved: sin at even columns, cos at odd (§3.5)"
        if positional.layout == "halves":
            how = "in halves: sines in the first half, cosines in the second (Marian)"
        table = positional.encoding(t).to(_DTYPE)  # (T, D)
        return InputPart(f"Sinusoidal positional encodings P, {how}", table)
    if isinstance(positional, LearnedPositionalEmbedding):
        if t > positional.max_len:
            raise UserError(
                f"the input has {t} tokens; this model's positions stop at {positional.max_len}"
            )
        return InputPart(
            "Learned position embeddings P[0..T-1]", positional.weight.detach()[:t].to(_DTYPE)
        )
    assert isinstance(positional, NoPositionalEncoding), type(positional).__name__
    return None


def _block(layer: nn.Module) -> tuple[nn.Module | None, SelfAttention]:
    """A self-attention block's norm before attention (pre-norm) or None, and its attention."""
    assert isinstance(layer, SelfAttentionBlock), type(layer).__name__
    sublayer = layer.attn_sublayer
    return (sublayer.norm if sublayer.norm_first else None), layer.self_attn


def _weights_of(weights: Sequence[Tensor] | None) -> Tensor:
    assert weights is not None and weights
    return weights[0][0].detach()  # layer 1, row 0: (H, T, T)


def _text_inputs(
    stack: str,
    embedder: Embedder,
    layers: Sequence[nn.Module],
    tokens: Tensor,
    labels: tuple[str, ...],
    *,
    mask: Tensor | None,
    bias: Tensor | None,
    model_weights: Tensor,
) -> FirstLayerInputs:
    """The first layer's inputs for a text stack: ``tokens`` (1, T) through ``embedder``
    explicitly and as the model runs it, and the first of ``layers``' norm and attention."""
    parts, x, combine = _text_parts(embedder, tokens[0])
    norm, attention = _block(layers[0])
    return FirstLayerInputs(
        stack=stack,
        num_layers=len(layers),
        labels=labels,
        ids=tuple(tokens[0].tolist()),
        parts=tuple(parts),
        combine=combine,
        x=x,
        model_x=embedder(tokens)[0],
        norm=norm,
        attention=attention,
        mask=mask,
        bias=bias,
        model_weights=model_weights,
    )


@torch.no_grad()
def encoder_decoder_first_layer(model: Any, folder: Path, text: str) -> FirstLayerInputs:
    """The encoder's first layer of an encoder–decoder (the paper's model, Marian, T5) on
    ``text``: the source ids as translation feeds them (normalised, EOS appended); T5's bias."""
    from aiayn.checkpoint import load_translation_tokenizer
    from aiayn.data import normalize

    tokenizer = load_translation_tokenizer(folder)
    clean = normalize(text)
    if not clean:
        raise UserError("--text is empty: give a sentence")
    ids = [*tokenizer.encode_batch([clean])[0], tokenizer.eos_id]
    _check_tokens(len(ids))
    specials = {tokenizer.eos_id: "</s>", tokenizer.pad_id: "<pad>"}

    def decode(row: list[int]) -> str:
        return tokenizer.decode_batch([row])[0]

    src = torch.tensor([ids])  # (1, T)
    encoder = model.encoder
    t = len(ids)
    bias = None if encoder.position_bias is None else encoder.position_bias(t, t)[0]  # (H, T, T)
    return _text_inputs(
        "encoder",
        encoder.embedder,
        encoder.layers,
        src,
        tuple(_label(decode, i, specials) for i in ids),
        mask=None,
        bias=None if bias is None else bias.to(_DTYPE),
        model_weights=_weights_of(model.encode(src, need_weights=True).self_weights),
    )


@torch.no_grad()
def decoder_only_first_layer(model: Any, folder: Path, text: str) -> FirstLayerInputs:
    """A decoder-only language model's (GPT-2's) first layer on ``text`` as a prompt: causal."""
    from aiayn.data.text_tokenizer import load_lm_tokenizer

    tokenizer = load_lm_tokenizer(folder)
    if not text.strip():
        raise UserError("--text is empty: give a sentence")
    ids = tokenizer.encode(text) or [model.config.bos_id]
    _check_tokens(len(ids))
    tokens = torch.tensor([ids])  # (1, T)
    specials = {model.config.bos_id: "<s>", model.config.eos_id: "</s>"}
    return _text_inputs(
        "decoder-only stack",
        model.embedder,
        model.layers,
        tokens,
        tuple(_label(tokenizer.decode, i, specials) for i in ids),
        mask=causal_mask(len(ids))[0, 0],  # (T, T)
        bias=None,
        model_weights=_weights_of(model(tokens, need_weights=True).weights),
    )


@torch.no_grad()
def bert_first_layer(model: Any, folder: Path, text: str) -> FirstLayerInputs:
    """BERT's first layer on ``[CLS] text [SEP]`` (segment A), bidirectional."""
    from aiayn.checkpoint import checkpoint_bert_tokenizer

    tokenizer = checkpoint_bert_tokenizer(folder)
    if not text.strip():
        raise UserError("--text is empty: give a sentence")
    ids = tokenizer.encode(text).ids
    _check_tokens(len(ids))
    tokens = torch.tensor([ids])  # (1, T)
    return _text_inputs(
        "encoder",
        model.encoder.embedder,
        model.encoder.layers,
        tokens,
        tuple(tokenizer.convert_ids_to_tokens(ids)),
        mask=None,
        bias=None,
        model_weights=_weights_of(model(tokens, need_weights=True).weights),
    )


def _patch_parts(embedder: Any, pixels: Tensor) -> tuple[list[InputPart], Tensor, tuple[int, int]]:
    """A ViT's patch embedding, explicitly: each patch's C·P·P pixels times E (the strided
    convolution's weight) plus its bias, the class token first; then E_pos. Returns the parts,
    x (1 + N, D) and the grid (g_h, g_w)."""
    conv = embedder.projection
    p = conv.kernel_size[0]
    patches = F.unfold(pixels.to(_DTYPE), p, stride=p)[0].T  # (1, C·P·P, N) -> (N, C·P·P)
    weight = conv.weight.detach().to(_DTYPE).flatten(1)  # (D, C, P, P) -> (D, C·P·P)
    bias = conv.bias.detach().to(_DTYPE) if conv.bias is not None else 0.0
    projected = patches @ weight.T + bias  # (N, C·P·P) @ (C·P·P, D) -> (N, D)
    cls = embedder.class_token.detach().to(_DTYPE)[0]  # (1, D)
    tokens = torch.cat([cls, projected])  # (1 + N, D)
    g_h, g_w = pixels.shape[-2] // p, pixels.shape[-1] // p
    positions = embedder.position_embeddings(g_h, g_w).detach()[0].to(_DTYPE)  # (1 + N, D)
    parts = [
        InputPart(
            "Patch embeddings: x_class, then each patch's pixels · E + b (ViT eq. 1)", tokens
        ),
        InputPart("Learned position embeddings E_pos (ViT eq. 1)", positions),
    ]
    return parts, tokens + positions, (g_h, g_w)


@torch.no_grad()
def vit_first_layer(model: Any, folder: Path, image: str) -> FirstLayerInputs:
    """A ViT's first layer on the image file ``image``: the class token and the patches."""
    from aiayn.checkpoint import checkpoint_preprocessor

    preprocessor = checkpoint_preprocessor(folder)
    pixels = preprocessor.load(image)[None]  # (1, C, H, W)
    embedder = model.embedder
    p = embedder.projection.kernel_size[0]
    patches = (pixels.shape[-2] // p) * (pixels.shape[-1] // p)
    if patches == 0:
        raise UserError(f"{image}: the model reads it as smaller than one {p}×{p} patch")
    _check_tokens(1 + patches)
    parts, x, (g_h, g_w) = _patch_parts(embedder, pixels)
    norm, attention = _block(model.layers[0])
    labels = ["[CLS]"] + [f"p{r + 1},{c + 1}" for r in range(g_h) for c in range(g_w)]
    return FirstLayerInputs(
        stack="encoder",
        num_layers=len(model.layers),
        labels=tuple(labels),
        ids=None,
        parts=tuple(parts),
        combine="X = patch embeddings + E_pos",
        x=x,
        model_x=embedder(pixels)[0],
        norm=norm,
        attention=attention,
        mask=None,
        bias=None,
        model_weights=_weights_of(model.encode(pixels, need_weights=True)[1]),
    )


# -- the trace -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FirstLayerTrace:
    """The first layer redone in float64 for head ``head`` (every head for the output).

    Attributes:
        inputs: what it read.
        head: the head shown, counted from 1.
        a: (T, D) the attention's input: norm(x) (pre-norm) or x.
        q, k, v: (H, T, d_k) every head's projections, biases included.
        scores: (H, T, T) Q Kᵀ.
        scale: the factor on the scores: 1/√d_k (eq. 1), or the model's own (T5: 1).
        scaled: (H, T, T) scores × scale, plus the bias when there is one.
        masked: (H, T, T) ``scaled`` with blocked entries at −∞.
        weights: (H, T, T) softmax of each row.
        heads: (H, T, d_k) weights @ V.
        output: (T, D) Concat(heads) · W_O (+ its bias): the attention sub-layer's output.
    """

    inputs: FirstLayerInputs
    head: int
    a: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    scores: Tensor
    scale: float
    scaled: Tensor
    masked: Tensor
    weights: Tensor
    heads: Tensor
    output: Tensor


def _projection(attention: SelfAttention, a: Tensor, block: int) -> Tensor:
    """Block 0, 1, 2 (Q, K, V) of the stacked in_proj for every head: (T, D) -> (H, T, d_k)."""
    i, h, d_k = attention.inner_dim, attention.num_heads, attention.d_k
    weight = attention.in_proj.weight.detach()[block * i : (block + 1) * i].to(_DTYPE)  # (I, D)
    out = a @ weight.T  # (T, D) @ (D, I) -> (T, I)
    if attention.in_proj.bias is not None:
        out = out + attention.in_proj.bias.detach()[block * i : (block + 1) * i].to(_DTYPE)
    return out.view(-1, h, d_k).transpose(0, 1)  # (T, I) -> (T, H, d_k) -> (H, T, d_k)


@torch.no_grad()
def trace_first_layer(inputs: FirstLayerInputs, head: int = 1) -> FirstLayerTrace:
    """Redo the first layer's self-attention explicitly (float64); ``head`` counts from 1.

    Raises:
        UserError: ``head`` outside 1..H.
    """
    attention = inputs.attention
    if not 1 <= head <= attention.num_heads:
        raise UserError(
            f"--head {head} is not a head of this model (it has 1..{attention.num_heads})"
        )
    a = inputs.x if inputs.norm is None else copy.deepcopy(inputs.norm).to(_DTYPE)(inputs.x)
    q, k, v = (_projection(attention, a, block) for block in range(3))  # 3 × (H, T, d_k)
    scores = q @ k.transpose(-1, -2)  # (H, T, d_k) @ (H, d_k, T) -> (H, T, T)
    scale = 1 / math.sqrt(attention.d_k) if attention.scale is None else float(attention.scale)
    scaled = scores * scale if inputs.bias is None else scores * scale + inputs.bias
    masked = scaled if inputs.mask is None else scaled.masked_fill(~inputs.mask, -math.inf)
    weights = torch.softmax(masked, dim=-1)  # (H, T, T)
    heads = weights @ v  # (H, T, T) @ (H, T, d_k) -> (H, T, d_k)
    concat = heads.transpose(0, 1).reshape(inputs.num_tokens, -1)  # -> (T, H, d_k) -> (T, I)
    out_proj = attention.out_proj
    output = concat @ out_proj.weight.detach().to(_DTYPE).T  # (T, I) @ (I, D) -> (T, D)
    if out_proj.bias is not None:
        output = output + out_proj.bias.detach().to(_DTYPE)
    return FirstLayerTrace(
        inputs, head, a, q, k, v, scores, scale, scaled, masked, weights, heads, output
    )


@dataclass(frozen=True)
class FirstLayerCheck:
    """How far the trace is from the model and the library.

    Attributes:
        embedder_max_abs_diff: max |explicit x − the model's embedder output|.
        model_weights_max_abs_diff: max |trace weights − the model's forward's layer-1
            weights| over every head.
        library_max_abs_diff: max |the layer's attention module run in float64 − the trace|
            over its output and weights.
        embedder_tolerance, model_tolerance: for comparisons with the float32 model (the
            embedder's scaled by the size of x).
        library_tolerance: float64 against float64.
    """

    embedder_max_abs_diff: float
    model_weights_max_abs_diff: float
    library_max_abs_diff: float
    embedder_tolerance: float
    model_tolerance: float = _MODEL_TOLERANCE
    library_tolerance: float = _LIBRARY_TOLERANCE

    @property
    def passed(self) -> bool:
        """Every difference within its tolerance."""
        return (
            self.embedder_max_abs_diff <= self.embedder_tolerance
            and self.model_weights_max_abs_diff <= self.model_tolerance
            and self.library_max_abs_diff <= self.library_tolerance
        )


@torch.no_grad()
def check_first_layer(trace: FirstLayerTrace) -> FirstLayerCheck:
    """Compare the trace with the model's embedder, the model's own attention weights and the
    layer's attention module (a float64 copy) run on the trace's input."""
    inputs = trace.inputs
    module = copy.deepcopy(inputs.attention).to(_DTYPE).eval()
    mask = None if inputs.mask is None else inputs.mask[None, None]  # (T, T) -> (1, 1, T, T)
    bias = None if inputs.bias is None else inputs.bias[None]  # (H, T, T) -> (1, H, T, T)
    result = module(trace.a[None], mask, need_weights=True, bias=bias)  # (1, T, D)
    assert result.weights is not None
    library = max(
        float((result.output[0] - trace.output).abs().max()),
        float((result.weights[0] - trace.weights).abs().max()),
    )
    size = max(1.0, float(inputs.x.abs().max()))
    return FirstLayerCheck(
        embedder_max_abs_diff=float((inputs.model_x.to(_DTYPE) - inputs.x).abs().max()),
        model_weights_max_abs_diff=float(
            (inputs.model_weights.to(_DTYPE) - trace.weights).abs().max()
        ),
        library_max_abs_diff=library,
        embedder_tolerance=1e-5 * size,
    )


# -- text ----------------------------------------------------------------------------------------


def _cut(matrix: Tensor, columns: int) -> tuple[Tensor, str]:
    """The first ``columns`` columns of a matrix and a note saying so when some are left out."""
    total = matrix.shape[-1]
    if total <= columns:
        return matrix, ""
    return matrix[..., :columns], f", columns 0..{columns - 1} of {total}"


def _block_text(
    title: str,
    matrix: Tensor,
    rows: Sequence[str],
    columns: int,
    decimals: int,
    cols: Sequence[str] | None = None,
) -> list[str]:
    """A titled matrix (cut to ``columns`` unless its columns are labelled), then an empty line."""
    from aiayn.visualization.explain import format_matrix

    note, shape = "", f"{matrix.shape[0]}×{matrix.shape[1]}"
    if cols is None:
        matrix, note = _cut(matrix, columns)
    return [f"{title}  ({shape}{note})", format_matrix(matrix, rows, cols, decimals=decimals), ""]


def _header(trace: FirstLayerTrace, source: str, where: str) -> list[str]:
    """What was read and the sizes; ``where`` names the checkpoint and its family."""
    inputs, attention = trace.inputs, trace.inputs.attention
    t, d, h = inputs.num_tokens, attention.d_model, attention.num_heads
    norm = (
        "pre-norm: attention reads Norm(X)"
        if inputs.norm is not None
        else "post-norm: attention reads X"
    )
    return [
        f'First layer, step by step: {where}, "{source}"',
        f"  layer 1 of the {inputs.stack}'s {inputs.num_layers}; head {trace.head} of {h}",
        f"  T={t} tokens, D=d_model={d}, H={h}, d_k=d_v={attention.d_k}; {norm}",
        "  matrices are used as x @ W (rows = tokens); wide ones show their first columns",
        "",
    ]


def _input_text(trace: FirstLayerTrace, columns: int, decimals: int) -> list[str]:
    """Steps 1–3: ids, the embedder's parts, X, and (pre-norm) the norm's output."""
    inputs, rows = trace.inputs, trace.inputs.labels
    out = []
    if inputs.ids is not None:
        out.append("Step 1. Token ids (the checkpoint's own tokenizer)")
        out += [f"    {label}  ->  {i}" for label, i in zip(rows, inputs.ids, strict=True)] + [""]
    else:
        out += [
            "Step 1. The image, read as the checkpoint's preprocessing says, cut into patches",
            "",
        ]
    for n, part in enumerate(inputs.parts):
        out += _block_text(f"Step 2.{n + 1}. {part.title}", part.matrix, rows, columns, decimals)
    if not any("position" in part.title.lower() for part in inputs.parts):
        out += [
            "  No positional encoding: T5's order comes only from the relative position bias",
            "",
        ]
    out += _block_text(f"Step 3. Layer input {inputs.combine}", inputs.x, rows, columns, decimals)
    if inputs.norm is not None:
        name = type(inputs.norm).__name__
        out += _block_text(
            f"Step 3b. The block's {name} first (pre-norm): A = {name}(X)",
            trace.a,
            rows,
            columns,
            decimals,
        )
    return out


def _scaling_text(trace: FirstLayerTrace, columns: int, decimals: int) -> list[str]:
    """Step 6: the scaling (÷ √d_k, or T5's none), T5's bias, the causal mask."""
    inputs, i = trace.inputs, trace.head - 1
    rows = inputs.labels

    def square(title: str, matrix: Tensor) -> list[str]:
        return _block_text(title, matrix, rows, columns, decimals, rows)

    if inputs.attention.scale is None:
        title = f"Step 6. Scaled: ÷ √d_k = ÷ {math.sqrt(inputs.attention.d_k):.4f} (eq. 1)"
    else:
        title = (
            f"Step 6. Not divided by √d_k: this family's scale is {trace.scale:g} (T5 folds "
            "the 1/√d_k into its initialisation)"
        )
    out: list[str] = []
    if inputs.bias is not None:
        bias_title = "learned, by bucket of key − query"
        out += square(
            f"Step 6a. Relative position bias of head {i + 1} ({bias_title})", inputs.bias[i]
        )
        title += " + the relative position bias"
    out += square(title, trace.scaled[i])
    if inputs.mask is not None:
        out += square("Step 6b. Causal mask (1 = may attend, 0 = blocked)", inputs.mask)
        out += square("  masked scores (blocked at −inf)", trace.masked[i])
    return out


def _head_text(trace: FirstLayerTrace, columns: int, decimals: int) -> list[str]:
    """Steps 4–8: head h's Q, K, V, scores, scaling, bias, mask, softmax and output."""
    inputs, i, n = trace.inputs, trace.head - 1, trace.head
    rows, d_k = inputs.labels, inputs.attention.d_k
    what = "X" if inputs.norm is None else "A"
    cols = f"{i * d_k}:{n * d_k}"
    out = [
        f"Step 4. Head {n}: Q_{n} = {what} W_Q[:, {cols}] (+ b), K_{n}, V_{n} likewise (§3.2.2)",
        "",
    ]
    for name, m in (("Q", trace.q), ("K", trace.k), ("V", trace.v)):
        out += _block_text(f"  {name}_{n}", m[i], rows, columns, decimals)
    scores = f"Step 5. Scores Q_{n} K_{n}ᵀ (rows = queries, columns = keys)"
    out += _block_text(scores, trace.scores[i], rows, columns, decimals, rows)
    out += _scaling_text(trace, columns, decimals)
    softmax = "Step 7. Attention weights = softmax of each row (eq. 1)"
    out += _block_text(softmax, trace.weights[i], rows, columns, decimals, rows)
    sums = "  ".join(f"{float(s):.{decimals}f}" for s in trace.weights[i].sum(dim=-1))
    out[-1:] = [f"    row sums: {sums}", ""]
    step = f"Step 8. head_{n} = weights · V_{n} (eq. 1)"
    return out + _block_text(step, trace.heads[i], rows, columns, decimals)


def _check_text(check: FirstLayerCheck) -> list[str]:
    def verdict(diff: float, tolerance: float) -> str:
        return "equals" if diff <= tolerance else "DIFFERS FROM"

    return [
        f"check: X {verdict(check.embedder_max_abs_diff, check.embedder_tolerance)} the model's "
        f"own embedder output (max |diff| = {check.embedder_max_abs_diff:.1e}, float32 model)",
        f"check: weights {verdict(check.model_weights_max_abs_diff, check.model_tolerance)} the "
        f"model's own forward, layer 1, every head (max |diff| = "
        f"{check.model_weights_max_abs_diff:.1e}, float32 model)",
        f"check: {verdict(check.library_max_abs_diff, check.library_tolerance)} "
        "aiayn.attention.SelfAttention (the layer's module in float64) output and weights "
        f"(max |diff| = {check.library_max_abs_diff:.1e})",
    ]


def format_first_layer(
    trace: FirstLayerTrace,
    *,
    source: str,
    where: str,
    columns: int = 8,
    decimals: int = 4,
    check: FirstLayerCheck | None = None,
) -> str:
    """The trace as text: the header (``source``: the text or image read; ``where``: the
    checkpoint and its family, in words), then every step with its matrix (``columns`` columns
    of the wide ones), then the layer's output and, if given, the checks."""
    out = _header(trace, source, where) + _input_text(trace, columns, decimals)
    out += _head_text(trace, columns, decimals)
    heads = ", ".join(f"head_{i + 1}" for i in range(trace.inputs.attention.num_heads))
    title = f"Step 9. The attention sub-layer's output: Concat({heads}) · W_O (+ b) (§3.2.2)"
    out += _block_text(title, trace.output, trace.inputs.labels, columns, decimals)
    if check is not None:
        out += _check_text(check)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"
