"""Encoder inference on the real tokens only: the self-attention stacks of BERT, ViT, the paper's
encoder, Marian's and T5's, flattened for inference as :mod:`aiayn.decoding.fast_step` flattens
the decoding step.

A batch of sentences is padded to its longest one, (B, S); for sentences of 8–128 tokens about
half of the positions are padding. The reference path (the modules' ``forward``, as Hugging
Face's) runs every linear layer, feed-forward network, norm and residual addition on all B·S
positions and masks the padded keys in attention. This path runs them on the N real tokens
only, one (N, D) matrix (the "unpadded" layout):

- the embedder runs as its module does, over (B, S) (gathers and additions), and its N real
  rows are kept;
- attention alone runs on the padded layout: a block's [W^Q; W^K; W^V] product (N, 3I) is
  scattered into a (B·S, 3I) buffer whose padded rows stay zero, attention runs on its
  (B, H, S, d_k) views with the padding mask, as the reference's
  (:func:`torch.nn.functional.scaled_dot_product_attention`; T5's position bias added), and
  the real rows of its output are gathered back, (N, I). (Attention sentence by sentence over
  its real tokens alone does less than half the work on such batches, but as many small calls
  it took longer: docs/performance.md);
- W^O and the feed-forward network's W_2 add the residual inside their product, W_1 applies the
  activation inside its product (oneDNN post-ops where the weights were packed by
  :func:`~aiayn.inference.packed.pack_for_inference`; PyTorch's ``F.linear`` and the activation
  after it elsewhere): the kernels of :mod:`aiayn.inference.kernels`, which the decoding step
  shares.

The arithmetic is the reference's up to summation order: tests hold the two paths to 1e-5 at
every real position for every value of every option of the families' configs. Where a batch
has no padding, N = B·S: nothing is scattered or gathered (ViT's images are never padded).

Padded positions: this path returns **zeros** there. The reference returns a state there that
means nothing (the padding token's embedding carried through the blocks, attending to the real
tokens), which every use (mean pooling, the masked-LM positions, the decoder's masked
cross-attention) ignores. A row of the pooled output reads position 0 as the reference does:
meaningless there too when that position is padding.

Inference only: built from a model in eval mode (no dropout: a model in training mode is
refused, call ``model.eval()``), runs under :func:`torch.inference_mode` and returns no
attention weights (ask the model itself for them). Parts of a kind it does not know are
refused with :class:`~aiayn.inference.kernels.UnsupportedPart` (a TypeError) naming them, never
computed differently. The weights are read, not
copied: build the runner again after replacing a module (changing weights in place is seen).

Shape legend:
    B batch   S padded length (ViT: T = 1 + patches)   N real tokens of the batch (≤ B·S)
    D d_model   H heads   d_k size per head   I = H·d_k   F d_ff   V vocabulary   K labels
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import MultiHeadAttention, SelfAttention, mask_fill_value
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
from aiayn.layers import SelfAttentionBlock
from aiayn.layers.relative_position import RelativePositionBias
from aiayn.layers.transformer_layers import SublayerConnection
from aiayn.models.bert import BERT, BertOutput, Pooler, padding_from_attention_mask
from aiayn.models.transformer import Encoder
from aiayn.models.vit import ViT, ViTOutput

_WHO = "encoder inference"  # how messages name this path


def _root_pre_hooks(root: nn.Module, called: nn.Module, name: str) -> tuple[Callable, ...]:
    """The forward pre-hooks of ``root``, which this path runs as a call of ``root`` would (T5's
    encoder refuses float16 in one). Hooks on the parts whose ``forward`` this path does not
    call (all but ``called``, the embedder, and its parts) are refused: they would not run."""
    refuse_hooks(root, name, called=called, root_pre_hooks_run=True)
    if root._forward_pre_hooks_with_kwargs:
        raise UnsupportedPart(f"{name} runs no forward pre-hooks that take keyword arguments")
    return tuple(root._forward_pre_hooks.values())


def _run_pre_hooks(hooks: tuple[Callable, ...], root: nn.Module, *args: Tensor | None) -> None:
    """Each hook on ``args``, the positional arguments of the call it stands for."""
    for hook in hooks:
        if hook(root, args) is not None:
            raise UnsupportedPart(
                f"{type(root).__name__} has a forward pre-hook that changes its input"
            )


def _refuse_training(model: nn.Module, name: str) -> None:
    """The model, or any of its parts that drop out (dropout, attention), in training mode is
    refused (a PackedLinear's own flag means nothing)."""
    dropping = (m for m in model.modules() if isinstance(m, (nn.Dropout, MultiHeadAttention)))
    if model.training or any(module.training for module in dropping):
        raise ValueError(f"{name} runs without dropout: call model.eval() first")


@dataclass(frozen=True)
class _Rows:
    """Where the N rows of the unpadded layout sit in the padded (B, S) batch, and the mask of
    attention's scores.

    Attributes:
        batch, length: B and S.
        index: (N,) flat positions b·S + s of the real tokens in row-major order, or None when
            every position is real (N = B·S).
        scores_mask: None; the (B, 1, 1, S) boolean key mask; T5's (1, H, S, S) position bias;
            or with both, the bias with the blocked keys at the dtype's minimum, (B, H, S, S).
            A row without a real token attends everywhere (its outputs are never kept).
    """

    batch: int
    length: int
    index: Tensor | None
    scores_mask: Tensor | None

    @staticmethod
    def of(real: Tensor | None, batch: int, length: int, bias: Tensor | None) -> _Rows:
        """From the (B, S) mask of real tokens (None or all True: no padding) and the (1, H, S,
        S) position bias (or None). One host sync."""
        if real is None or bool(real.all()):
            return _Rows(batch, length, None, bias)
        index = real.flatten().nonzero().squeeze(1)  # (N,)
        keys = (real | ~real.any(dim=1, keepdim=True))[:, None, None, :]  # (B, 1, 1, S)
        if bias is not None:
            keys = bias.masked_fill(~keys, mask_fill_value(bias.dtype))  # (B, H, S, S)
        return _Rows(batch, length, index, keys)

    def gather(self, x: Tensor) -> Tensor:
        """(B, S, *) -> (N, C): the real rows, trailing dimensions flattened to C."""
        flat = x.reshape(self.batch * self.length, -1)  # (B·S, C), a copy only if it must
        return flat if self.index is None else flat.index_select(0, self.index)

    def scatter(self, x: Tensor, buffer: Tensor | None) -> Tensor:
        """(N, C) -> (B·S, C): written into ``buffer``, whose padded rows are zero (None
        without padding: ``x`` itself)."""
        if self.index is None or buffer is None:
            return x
        return buffer.index_copy_(0, self.index, x)

    def padded(self, x: Tensor) -> Tensor:
        """(N, C) -> (B, S, C), zeros at the padded positions."""
        buffer = None if self.index is None else x.new_zeros(self.batch * self.length, x.size(1))
        return self.scatter(x, buffer).view(self.batch, self.length, x.size(1))


@dataclass(frozen=True, slots=True)
class _Block:
    """The weights of one self-attention block (§3.1's encoder layer) as this path uses them."""

    qkv: LinearKernel  # [W^Q; W^K; W^V]: (D,) -> (3I,)
    out: LinearKernel  # W^O: (I,) -> (D,)
    attn_norm: NormKernel
    ff: FeedForwardKernel  # the feed-forward sub-layer, its norm and residual connection
    norm_first: bool
    heads: int  # H
    d_k: int
    scale: float | None  # of the scores: None = 1/√d_k (the paper)

    @staticmethod
    def of(layer: nn.Module) -> _Block:
        """A block's weights, its parts checked to be of the kinds this path runs."""
        check_kind(layer, (SelfAttentionBlock,), _WHO, "SelfAttentionBlock")
        assert isinstance(layer, SelfAttentionBlock)
        attn, subs = layer.self_attn, (layer.attn_sublayer, layer.ff_sublayer)
        check_kind(attn, (SelfAttention,), _WHO, "aiayn's SelfAttention")
        assert isinstance(attn, SelfAttention)
        for sub in subs:
            check_kind(sub, (SublayerConnection,), _WHO, "SublayerConnection")
            check_norm(sub.norm, _WHO)
        if subs[0].norm_first != subs[1].norm_first:
            raise UnsupportedPart(f"{_WHO} runs blocks whose two sub-layers share norm_first")
        norm_first = subs[0].norm_first
        return _Block(
            linear_kernel(attn.in_proj),
            linear_kernel(attn.out_proj),
            NormKernel(subs[0].norm),
            FeedForwardKernel.of(layer.feed_forward, subs[1].norm, norm_first, _WHO),
            norm_first,
            attn.num_heads,
            attn.d_k,
            attn.scale,
        )


class _Blocks:
    """A stack of self-attention blocks over the unpadded rows: (N, D) -> (N, D), every block
    with the same attention shape (H heads of size d_k)."""

    def __init__(self, layers: Sequence[nn.Module]):
        self.blocks = tuple(_Block.of(layer) for layer in layers)
        shapes = {(block.heads, block.d_k) for block in self.blocks}
        if len(shapes) > 1:
            raise UnsupportedPart(
                f"encoder inference runs one attention shape (heads, d_k), got {sorted(shapes)}"
            )
        self.heads, self.d_k = shapes.pop() if shapes else (1, 1)

    def __call__(self, x: Tensor, rows: _Rows) -> Tensor:
        """Eq. 1–3 of each block in turn on the (N, D) rows."""
        width = 3 * self.heads * self.d_k  # 3I
        buffer = None if rows.index is None else x.new_zeros(rows.batch * rows.length, width)
        for w in self.blocks:
            x = self._attention(w, x, rows, buffer)
            x = w.ff(x)  # the feed-forward sub-layer (§3.3)
        return x

    def _attention(self, w: _Block, x: Tensor, rows: _Rows, buffer: Tensor | None) -> Tensor:
        """Self-attention sub-layer (§3.2.2): (N, D) -> (N, D); the attention itself on the
        padded layout, whose Q, K and V heads are views of ``buffer`` (none copied)."""
        b, s, h, d_k = rows.batch, rows.length, self.heads, self.d_k
        qkv = rows.scatter(w.qkv(w.attn_norm(x) if w.norm_first else x), buffer)  # (B·S, 3I)
        q, k, v = qkv.view(b, s, 3, h, d_k).permute(2, 0, 3, 1, 4).unbind(0)  # 3 × (B, H, S, d_k)
        heads = F.scaled_dot_product_attention(
            q, k, v, attn_mask=rows.scores_mask, scale=w.scale
        )  # (B, H, S, d_k)
        concat = rows.gather(heads.transpose(1, 2))  # (B, S, H, d_k) -> (N, I)
        return residual(w.out, w.attn_norm, w.norm_first, concat, x)  # (N, D)


class EncoderInference:
    """An :class:`~aiayn.models.transformer.Encoder` (BERT's, the paper's, Marian's, T5's) run
    on the real tokens only: (B, S) ids -> (B, S, D) final states, zeros at padded positions.

    Args:
        encoder: the stack, in eval mode (its current weights are used, not copied).
    """

    def __init__(self, encoder: Encoder):
        check_kind(encoder, (Encoder,), _WHO, "aiayn's Encoder")
        _refuse_training(encoder, _WHO)
        bias, final = encoder.position_bias, encoder.final_norm
        if bias is not None:
            check_kind(bias, (RelativePositionBias,), _WHO, "T5's position bias")
        if final is not None:
            check_norm(final, _WHO, "a final LayerNorm or RMSNorm")
        self.encoder = encoder
        self.hooks = _root_pre_hooks(encoder, encoder.embedder, _WHO)
        self.embedder = encoder.embedder  # run as the module: (B, S) -> (B, S, D)
        self.position_bias = bias
        self.blocks = _Blocks(list(encoder.layers))
        self.final_norm = None if final is None else NormKernel(final)

    @torch.inference_mode()
    def __call__(
        self, tokens: Tensor, real: Tensor | None = None, *, token_types: Tensor | None = None
    ) -> Tensor:
        """Args:
        tokens: (B, S) ids.
        real: (B, S) boolean, True at real tokens; None = no padding.
        token_types: (B, S) segment ids for an embedder with token types (BERT), or None.

        Returns:
            (B, S, D) final states, zeros at the padded positions.
        """
        b, s = tokens.shape
        if real is not None and real.shape != tokens.shape:
            raise ValueError(f"real has shape {tuple(real.shape)}, tokens {tuple(tokens.shape)}")
        mask = None if real is None else real[:, None, None, :]  # (B, 1, 1, S), as its forward's
        _run_pre_hooks(self.hooks, self.encoder, tokens, mask)
        if token_types is None:
            embedded = self.embedder(tokens)  # (B, S, D)
        else:
            embedded = self.embedder(tokens, token_types=token_types)
        bias = None if self.position_bias is None else self.position_bias(s, s)  # (1, H, S, S)
        rows = _Rows.of(real, b, s, bias)
        x = self.blocks(rows.gather(embedded), rows)  # (N, D)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return rows.padded(x)  # (B, S, D)


class BertInference:
    """:class:`~aiayn.models.bert.BERT`'s ``forward`` on the real tokens only: final states
    (zeros at padded positions) and the pooled state; no attention weights.

    Args:
        model: the model, in eval mode (its current weights are used, not copied).
    """

    def __init__(self, model: BERT):
        check_kind(model, (BERT,), "BERT inference", "aiayn's BERT")
        _refuse_training(model, "BERT inference")
        pooler = model.pooler
        if pooler is not None:
            check_kind(pooler, (Pooler,), "BERT inference", "BERT's Pooler")
        self.model = model
        self.hooks = _root_pre_hooks(model, model.encoder, "BERT inference")
        self.encoder = EncoderInference(model.encoder)
        self.pooler = None if pooler is None else linear_kernel(pooler.dense)

    @torch.inference_mode()
    def __call__(
        self,
        tokens: Tensor,
        token_types: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> BertOutput:
        """Arguments as :meth:`BERT.forward <aiayn.models.bert.BERT.forward>`: (B, S) ids, segment
        ids, and the (B, S) attention mask (true or 1 at real tokens; None = no padding)."""
        _run_pre_hooks(self.hooks, self.model, tokens, token_types, attention_mask)
        mask = padding_from_attention_mask(attention_mask, tokens)  # (B, 1, 1, S), checked
        real = None if mask is None else mask[:, 0, 0, :]  # (B, S)
        hidden = self.encoder(tokens, real, token_types=token_types)  # (B, S, D)
        pooled = None if self.pooler is None else torch.tanh(self.pooler(hidden[:, 0]))  # (B, D)
        return BertOutput(hidden, pooled, None)


class ViTInference:
    """:class:`~aiayn.models.vit.ViT`'s ``forward`` with the blocks flattened: final states,
    pooled state and logits of (B, C, H, W) images; no attention weights.

    Args:
        model: the model, in eval mode (its current weights are used, not copied).
    """

    def __init__(self, model: ViT):
        check_kind(model, (ViT,), "ViT inference", "aiayn's ViT")
        _refuse_training(model, "ViT inference")
        check_norm(model.final_norm, "ViT inference", "a final LayerNorm or RMSNorm")
        self.model = model
        self.hooks = _root_pre_hooks(model, model.embedder, "ViT inference")
        self.embedder = model.embedder  # eq. 1, run as the module: (B, C, H, W) -> (B, T, D)
        self.blocks = _Blocks(list(model.layers))
        self.final_norm = NormKernel(model.final_norm)
        self.pooler = None if model.pooler is None else linear_kernel(model.pooler)
        self.classifier = None if model.classifier is None else linear_kernel(model.classifier)

    @torch.inference_mode()
    def __call__(self, pixels: Tensor) -> ViTOutput:
        """(B, C, H, W) images -> final states (B, T, D), pooled (B, D), logits (B, K)."""
        _run_pre_hooks(self.hooks, self.model, pixels)
        x = self.embedder(pixels)  # (B, T, D)
        b, t, d = x.shape
        rows = _Rows(b, t, None, None)  # every position real
        hidden = self.final_norm(self.blocks(rows.gather(x), rows)).view(b, t, d)  # eq. 2–4
        y = hidden[:, 0]  # (B, D), the class token
        pooled = None if self.pooler is None else torch.tanh(self.pooler(y))  # (B, D)
        logits = None if self.classifier is None else self.classifier(y)  # (B, D) @ (D, K)
        return ViTOutput(hidden, pooled, logits, None)
