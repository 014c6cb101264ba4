"""The Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words: Transformers
for Image Recognition at Scale"): the paper's encoder (§3.1 of Vaswani et al.) over a sequence of
image patches.

    pixels ─ Conv2d(P×P, stride P) ─ flatten ─ [x_class; patches] + E_pos ─ Dropout        eq. 1
           ─ L × SelfAttentionBlock (pre-norm LayerNorm, GELU feed-forward)              eq. 2–3
           ─ LayerNorm ─ hidden                                                          eq. 4
    hidden[:, 0] ─ Linear ─ tanh ─ pooled        (the pre-training head's hidden layer, §3.1)
    hidden[:, 0] ─ Linear ─ logits               (the fine-tuning head, §3.1 and §3.3)

The equations of §3.1, with N = HW/P² patches x_p^i ∈ ℝ^{P²·C}:

    z_0  = [x_class; x_p^1 E; …; x_p^N E] + E_pos,   E ∈ ℝ^{(P²·C)×D}, E_pos ∈ ℝ^{(N+1)×D}  (1)
    z'_ℓ = MSA(LN(z_{ℓ−1})) + z_{ℓ−1}                                                    (2)
    z_ℓ  = MLP(LN(z'_ℓ)) + z'_ℓ                                                          (3)
    y    = LN(z_L^0)                                                                     (4)

The patch projection E is a convolution with kernel and stride P (its weight (D, C, P, P) is E
reshaped). The classification head reads the final-norm class token y (as Hugging Face's
``ViTForImageClassification``), not the pooler. Images of another size than the trained one get
position embeddings interpolated bicubically over the patch grid (§3.2, "Fine-tuning and higher
resolution": "2D interpolation of the pre-trained position embeddings"), the class position kept
apart; :meth:`PatchEmbedder.position_embeddings` is Hugging Face's ``interpolate_pos_encoding``.

The stack is a loop of its own over the blocks, not :class:`~aiayn.models.transformer.Encoder`:
that one takes token ids and a padding mask through a token :class:`~aiayn.layers.Embedder`,
while an image has neither; the blocks, the norm factory and the feed-forward network are the
same parts every family is built from.

The family is :class:`ViTConfig` (presets below), the builder functions and :class:`ViT`; the
converter is :mod:`aiayn.convert.vit`.

Shape legend:
    B batch   C channels   H, W image height and width (pixels)   P patch size
    g the trained grid side (image_size / P)   h, w the grid of this image (H / P, W / P)
    N = h·w patches   T = 1 + N positions (class token first)   D d_model   F d_ff
    K labels   n heads
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import SelfAttention
from aiayn.config import ModelConfig, Presets, Published, check_heads, check_labels
from aiayn.errors import ConfigError, UserError
from aiayn.layers import ACTIVATIONS, Dropout, FeedForward, SelfAttentionBlock, layer_norm
from aiayn.validation import (
    Choice,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Rate,
    validate,
    validated,
)


@validated("model")
@dataclass(frozen=True)
class ViTConfig(ModelConfig):
    """Hyper-parameters of a Vision Transformer (Hugging Face's names in brackets).

    Attributes:
        image_size: the side of the square images it was trained on [image_size]; other sizes
            run with interpolated position embeddings.
        patch_size: P [patch_size]; a border of fewer than P pixels is not seen (as the strided
            convolution of every implementation).
        num_channels: C [num_channels].
        d_model: D [hidden_size].
        num_heads: heads [num_attention_heads]; d_k = D / heads.
        num_layers: L [num_hidden_layers].
        d_ff: F, the MLP's inner size [intermediate_size].
        activation: of the MLP [hidden_act]: "gelu" (exact, the paper's), "gelu_tanh", "relu",
            "silu".
        dropout: on embeddings + positions and on each sub-layer's output [hidden_dropout_prob].
        attention_dropout: on the attention weights [attention_probs_dropout_prob].
        layer_norm_eps: ε of every LayerNorm [layer_norm_eps].
        qkv_bias: W^Q, W^K, W^V have biases [qkv_bias]; W^O always has one.
        pooler: the dense + tanh layer on the class token [ViTModel's add_pooling_layer].
        num_labels: K, the classification head's outputs; 0 = no head [num_labels].
        id2label: the K labels' names in order [id2label], or () for none.
    """

    image_size: PositiveInt = 224
    patch_size: PositiveInt = 16
    num_channels: PositiveInt = 3
    d_model: PositiveInt = 768
    num_heads: PositiveInt = 12
    num_layers: PositiveInt = 12
    d_ff: PositiveInt = 3072
    activation: Annotated[str, Choice(tuple(ACTIVATIONS))] = "gelu"
    dropout: Rate = 0.0
    attention_dropout: Rate = 0.0
    layer_norm_eps: PositiveFloat = 1e-12
    qkv_bias: bool = True
    pooler: bool = True
    num_labels: NonNegativeInt = 0
    id2label: tuple[str, ...] = ()  # a list read back from JSON/YAML becomes a tuple

    def __post_init__(self) -> None:
        validate(self)
        if self.patch_size > self.image_size:
            raise ConfigError(
                f"patch_size={self.patch_size} is larger than image_size={self.image_size}"
            )
        check_heads(self.d_model, self.num_heads)
        check_labels(self.id2label, self.num_labels)

    @property
    def grid(self) -> int:
        """g, the side of the trained patch grid (image_size // patch_size)."""
        return self.image_size // self.patch_size

    def with_vocab_size(self, vocab_size: int) -> ViTConfig:
        """A ViT reads image patches: it has no vocabulary to size."""
        raise UserError("a vocabulary size does not apply to a ViT: it reads image patches")

    def summary(self) -> str:
        """The architecture in one line (the ViT paper's names, Table 1)."""
        return (
            f"N={self.num_layers} d_model={self.d_model} d_ff={self.d_ff} h={self.num_heads} "
            f"image={self.image_size} patch={self.patch_size} labels={self.num_labels}"
        )

    @property
    def num_patches(self) -> int:
        """N of the trained image size: g²."""
        return self.grid**2


def _sized(patch: int, d_model: int, heads: int, layers: int, d_ff: int) -> ViTConfig:
    return ViTConfig(
        patch_size=patch, d_model=d_model, num_heads=heads, num_layers=layers, d_ff=d_ff
    )


VIT_PRESETS: Presets[ViTConfig] = Presets(
    "ViT",
    {
        # the paper's ViT-B/16 (Table 1) at 224×224 as Hugging Face's ViTModel (with the pooler)
        "vit-base-patch16-224": _sized(16, 768, 12, 12, 3072),  # 86.4M
        # 8×8 grayscale digits (scikit-learn's digits): 2×2 patches, a 4×4 grid, 10 classes
        "vit-tiny-digits": ViTConfig(
            image_size=8,
            patch_size=2,
            num_channels=1,
            d_model=64,
            num_heads=4,
            num_layers=4,
            d_ff=128,
            dropout=0.1,
            pooler=False,
            num_labels=10,
            id2label=tuple(str(digit) for digit in range(10)),
        ),
        # for tests: the shapes of the converter's parity tests
        "vit-tiny": ViTConfig(
            image_size=32,
            patch_size=8,
            d_model=32,
            num_heads=4,
            num_layers=2,
            d_ff=64,
            num_labels=5,
        ),
    },
    published={
        "vit-base-patch16-224": Published(86_389_248, 0, "published ViT (ViTModel)"),
    },
)

vit_preset = VIT_PRESETS.build
"""A named ViT preset (see :data:`VIT_PRESETS`), optionally with fields changed."""


def expected_vit_parameters(config: ViTConfig) -> int:
    """Closed-form parameter count of :class:`ViT`:

    C·P²·D + D                      the patch projection E and its bias
    + D + (N + 1)·D                 the class token and the position embeddings E_pos
    + L·(4D² + 3D·[qkv_bias] + D)   attention: [W^Q; W^K; W^V] (biases optional) and W^O, b^O
    + L·(2·D·F + F + D)             the MLP W_1, b_1, W_2, b_2
    + L·4D + 2D                     two LayerNorms per block and the final one
    + D² + D if pooler              the pooler's dense layer
    + D·K + K                       the classification head (K = num_labels, 0 = none)
    """
    c = config
    d, f = c.d_model, c.d_ff
    embedding = c.num_channels * c.patch_size**2 * d + d + d + (c.num_patches + 1) * d
    attention = 4 * d * d + (3 * d if c.qkv_bias else 0) + d
    block = attention + (2 * d * f + f + d) + 4 * d
    pooler = d * d + d if c.pooler else 0
    head = d * c.num_labels + c.num_labels
    return embedding + c.num_layers * block + 2 * d + pooler + head


# -- the family's builder: ViT's parts, from its config -------------------------------------------


class PatchEmbedder(nn.Module):
    """Eq. 1: the patches' linear projection E (a strided convolution), the learned class token
    x_class prepended, the learned position embeddings E_pos added, then dropout.

    Args:
        num_channels: C.
        d_model: D.
        patch_size: P.
        grid: g, the side of the patch grid the position embeddings were learned on.
        dropout: P_drop on the sum.
    """

    def __init__(self, num_channels: int, d_model: int, patch_size: int, grid: int, dropout: float):
        super().__init__()
        self.grid = grid
        self.projection = nn.Conv2d(num_channels, d_model, patch_size, stride=patch_size)  # E
        self.class_token = nn.Parameter(torch.zeros(1, 1, d_model))  # x_class, (1, 1, D)
        self.positions = nn.Parameter(torch.zeros(1, 1 + grid * grid, d_model))  # (1, 1 + g², D)
        self.dropout = Dropout(dropout)

    def position_embeddings(self, h: int, w: int) -> Tensor:
        """E_pos for an h × w patch grid: the learned table when (h, w) = (g, g), else its g × g
        patch part resized bicubically to h × w (``align_corners=False``, as Hugging Face's
        ``interpolate_pos_encoding=True``), the class position kept apart: (1, 1 + h·w, D).
        While ``torch.export`` traces (``aiayn export --to onnx``) the table is always resized,
        so the graph takes any image size: resizing g × g to g × g samples the grid points
        themselves, where the bicubic weights are (0, 1, 0, 0), the table unchanged."""
        if not torch.compiler.is_exporting() and (h, w) == (self.grid, self.grid):
            return self.positions  # an exported graph resizes always (identity at g × g)
        g, d = self.grid, self.positions.size(-1)
        cls_position = self.positions[:, :1]  # (1, 1, D)
        patches = self.positions[:, 1:]  # (1, g², D)
        patches = patches.reshape(1, g, g, d).permute(0, 3, 1, 2)  # (1, g², D) -> (1, D, g, g)
        resized = F.interpolate(patches.float(), size=(h, w), mode="bicubic", align_corners=False)
        resized = resized.to(patches.dtype).permute(0, 2, 3, 1)  # (1, D, h, w) -> (1, h, w, D)
        return torch.cat([cls_position, resized.reshape(1, h * w, d)], dim=1)  # (1, 1 + h·w, D)

    def forward(self, pixels: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, 1 + N, D) with N = ⌊H/P⌋·⌊W/P⌋."""
        if pixels.size(1) != self.projection.in_channels:
            raise ValueError(
                f"images have {pixels.size(1)} channels, the model takes "
                f"{self.projection.in_channels} (num_channels)"
            )
        patches = self.projection(pixels.to(self.projection.weight.dtype))  # -> (B, D, h, w)
        b, _, h, w = patches.shape
        patches = patches.flatten(2).transpose(1, 2)  # (B, D, h, w) -> (B, D, N) -> (B, N, D)
        tokens = torch.cat([self.class_token.expand(b, -1, -1), patches], dim=1)  # (B, 1 + N, D)
        return self.dropout(tokens + self.position_embeddings(h, w))


def vit_patch_embedder(config: ViTConfig) -> PatchEmbedder:
    """Eq. 1's embedder for the config's channels, patch size and trained grid."""
    c = config
    return PatchEmbedder(c.num_channels, c.d_model, c.patch_size, c.grid, c.dropout)


def vit_attention(config: ViTConfig) -> SelfAttention:
    """Multi-head self-attention (MSA of eq. 2) with 1/√d_k scaling; without ``qkv_bias`` the
    [W^Q; W^K; W^V] projection is rebuilt without biases while W^O keeps its own (as in
    Hugging Face's ViT, whose flag covers the three input projections only)."""
    c = config
    attention = SelfAttention(c.d_model, c.num_heads, dropout=c.attention_dropout)
    if not c.qkv_bias:
        attention.in_proj = nn.Linear(c.d_model, 3 * c.d_model, bias=False)  # (3D, D)
        attention.reset_parameters()
    return attention


def vit_block(config: ViTConfig) -> SelfAttentionBlock:
    """One encoder block, eq. 2–3: pre-norm MSA and a GELU MLP, each in a residual connection."""
    c = config
    return SelfAttentionBlock(
        vit_attention(c),
        FeedForward(c.d_model, c.d_ff, c.activation),
        layer_norm(c.layer_norm_eps),
        norm_first=True,
        dropout=c.dropout,
    )


class ViTOutput(NamedTuple):
    """What :class:`ViT` returns.

    Attributes:
        hidden: (B, 1 + N, D) final states after the last LayerNorm (eq. 4 at position 0).
        pooled: (B, D) tanh(dense(hidden[:, 0])) when the config has the pooler, else None.
        logits: (B, K) the classification head on hidden[:, 0] when num_labels > 0, else None.
        weights: per layer (B, n, 1 + N, 1 + N) attention weights, if requested.
    """

    hidden: Tensor
    pooled: Tensor | None
    logits: Tensor | None
    weights: list[Tensor] | None


class ViT(nn.Module):
    """The Vision Transformer: :class:`PatchEmbedder`, L pre-norm blocks, a final LayerNorm, and
    the optional pooler and classification head.

    Args:
        config: the hyper-parameters.
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        c = self.config = config
        self.embedder = vit_patch_embedder(c)
        self.layers = nn.ModuleList(vit_block(c) for _ in range(c.num_layers))
        self.final_norm = layer_norm(c.layer_norm_eps)(c.d_model)
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None  # [pooler.dense]
        self.classifier = nn.Linear(c.d_model, c.num_labels) if c.num_labels else None  # (K, D)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """For training from scratch: weights, the class token and the position embeddings
        ~ N(0, 0.02²) truncated at ±2σ (Hugging Face's and timm's scale), zero biases, unit
        LayerNorms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for table in (self.embedder.class_token, self.embedder.positions):
            nn.init.trunc_normal_(table, std=0.02, a=-0.04, b=0.04)

    def encode(
        self, pixels: Tensor, *, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Eq. 1–4 over every position: (B, C, H, W) -> (B, 1 + N, D) final states, and per layer
        the (B, n, 1 + N, 1 + N) attention weights if requested."""
        x = self.embedder(pixels)  # (B, 1 + N, D)
        weights: list[Tensor] | None = [] if need_weights else None
        for block in self.layers:
            out = block(x, need_weights=need_weights)
            x = out.output  # (B, 1 + N, D)
            if weights is not None and out.weights is not None:
                weights.append(out.weights)
        return self.final_norm(x), weights

    def forward(self, pixels: Tensor, *, need_weights: bool = False) -> ViTOutput:
        """Final states, pooled class token, logits and (if requested) attention weights of
        (B, C, H, W) images; another size than ``image_size`` interpolates E_pos."""
        hidden, weights = self.encode(pixels, need_weights=need_weights)
        y = hidden[:, 0]  # (B, D), eq. 4
        pooled = None if self.pooler is None else torch.tanh(self.pooler(y))  # (B, D)
        logits = None if self.classifier is None else self.classifier(y)  # (B, D) @ (D, K)
        return ViTOutput(hidden, pooled, logits, weights)
