"""Where a Vision Transformer looks in one image (``aiayn attention --image``).

:func:`collect_image_attention` reads an image file as the checkpoint's preprocessing says, runs
the :class:`~aiayn.models.vit.ViT` once and keeps the attention weights it *returns*
(``need_weights=True``): per layer, (n, T, T) with T = 1 + N positions, the class token first,
then the N = g_h·g_w patches in row-major order (the patch embedder's ``flatten``). Two pure
computations turn them into pictures of the patch grid:

- :func:`cls_attention`: the class token's attention over the patches in one layer, per head:
  row 0 (the [CLS] query), columns 1..N (patch keys), reshaped to the (g_h, g_w) grid. The
  class token's final state is what the classifier reads, so these are the patches it gathers
  from directly, layer by layer.
- :func:`attention_rollout` (Abnar & Zuidema 2020, "Quantifying Attention Flow in
  Transformers", §3): how much of each input position flows into each position at the top,
  through every layer. Each layer's heads are averaged, the residual connection is modelled by
  adding the identity, rows are renormalised (Â = (A + I) / 2, still a row-stochastic matrix),
  and the layers are chained: R = Â_L · … · Â_2 · Â_1. Row 0 of R over the patch columns is
  the class token's rolled-out attention (:func:`rollout_cls_map`).

Drawing is separate: :func:`overlay_heatmap` upsamples a (g_h, g_w) map to the image
(bilinearly; for a small input enlarged 4× or more, as blocks of one colour per patch) and
blends it in as a translucent colour map (each map scaled to its own maximum: the weights over
many patches are small); :func:`write_image_attention_pngs` writes
``cls_L{layer}_H{head}.png`` per layer and head, ``cls_L{layer}_all.png`` (every head of a
layer on one sheet) and ``rollout.png``; :func:`write_image_attention_html` writes one
self-contained page (images as base64 data URIs) to pick the layer and head, with the rollout
and the classifier's top labels (its template, style and script: the package's
``static/image_attention.html``, ``.css`` and ``.js``).

The image is drawn as the model reads it (resized as its preprocessing says), contrast-stretched
(its darkest pixel black, its brightest white: an 8×8 digit stored as values 0–16 is visible), and
enlarged by a whole factor so that its longer side has at least :data:`DISPLAY_MIN_SIDE` pixels
(bicubically, or pixel by pixel when the factor is :data:`PIXELATED_FROM` or more). Pixels of
a border narrower than a patch are not seen by the model (the strided patch projection skips
them): they are drawn without a heatmap.

Shape legend:
    n  heads      L  layers      T = 1 + N positions (class token, then N patches)
    g_h, g_w  the patch grid     K  labels
    H, W  image height and width as the model reads it      H', W'  as drawn
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from torch import Tensor

from aiayn.data.images import ImagePreprocessor, open_image
from aiayn.errors import UserError
from aiayn.models.vit import ViT
from aiayn.visualization.attention_page import page_head, script_json
from aiayn.visualization.static_files import fill, page_file

__all__ = [
    "DISPLAY_MIN_SIDE",
    "GREY_FLOOR",
    "GRID_GREY",
    "OVERLAY_ALPHA",
    "OVERLAY_HUE",
    "PIXELATED_FROM",
    "ImageAttention",
    "Overlays",
    "attention_rollout",
    "cls_attention",
    "collect_image_attention",
    "draw_overlays",
    "image_attention_html",
    "image_attention_pngs",
    "overlay_heatmap",
    "page_data",
    "rollout_cls_map",
    "top_predictions",
    "write_image_attention_html",
    "write_image_attention_pngs",
]

DISPLAY_MIN_SIDE = 224
PIXELATED_FROM = 4  # an input enlarged this many times or more is drawn pixel by pixel
"""The drawings enlarge the model's input by a whole factor to at least this longer side."""

CLASS_TOKEN = 0
"""The class token's position in the sequence (eq. 1 of Dosovitskiy et al.: prepended)."""

TOP_K = 5
"""Labels listed on the page."""

OVERLAY_HUE = (1.0, 0.27, 0.0)
"""The attention's one colour (red-orange, RGB in [0, 1]), laid over the image in grey."""
OVERLAY_ALPHA = 0.75
"""The hue's opacity at a map's maximum (0 at its minimum)."""
GRID_GREY = 0.5
"""The patch grid's lines (a grey level in [0, 1])."""
GREY_FLOOR = 0.3
"""The image's darkest grey, as drawn: black would hide the hue laid over it."""
_PAGE_FORMAT = ("JPEG", "image/jpeg")  # the page's images: a few KB each (the PNG files stay)


# -- pure computations ---------------------------------------------------------------------------


def cls_attention(weights: Tensor, grid: tuple[int, int]) -> Tensor:
    """The class token's attention over the patches, per head, on the patch grid.

    Args:
        weights: one layer's (n, T, T) attention weights (rows: queries, columns: keys),
            T = 1 + g_h·g_w, the class token at position 0.
        grid: (g_h, g_w).

    Returns:
        (n, g_h, g_w): ``weights[h, 0, 1 + i·g_w + j]`` at ``[h, i, j]``. The values of a head
        sum to 1 minus the class token's attention to itself.
    """
    g_h, g_w = grid
    heads, rows, cols = weights.shape
    if rows != cols or cols != 1 + g_h * g_w:
        raise ValueError(f"weights {tuple(weights.shape)} do not fit a {g_h}×{g_w} patch grid")
    patches = weights[:, CLASS_TOKEN, 1:]  # (n, T, T) -> (n, N): the [CLS] row, patch columns
    return patches.reshape(heads, g_h, g_w)  # (n, N) -> (n, g_h, g_w), row-major as embedded


def attention_rollout(layers: Sequence[Tensor]) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020) through the layers, first to last.

    Each layer's (n, T, T) weights -> the head mean A (T, T) -> Â = (A + I) renormalised per
    row (the residual stream: half the flow stays in place, as the rows of A sum to 1) ->
    R = Â_L · … · Â_1, accumulated from the first layer up (R_1 = Â_1, R_l = Â_l · R_{l−1}).
    Computed in float64, returned as float32.

    Args:
        layers: L × (n, T, T) attention weights, the first layer first.

    Returns:
        (T, T) R: row t is how much of each input position (column) reaches position t after
        the last layer; every row sums to 1.
    """
    if not layers:
        raise ValueError("attention rollout needs at least one layer")
    rollout: Tensor | None = None
    for weights in layers:  # (n, T, T)
        mean = weights.double().mean(dim=0)  # (n, T, T) -> (T, T), heads averaged
        with_residual = mean + torch.eye(mean.size(-1), dtype=mean.dtype)  # (T, T)
        normalised = with_residual / with_residual.sum(dim=-1, keepdim=True)  # rows sum to 1
        rollout = normalised if rollout is None else normalised @ rollout  # (T, T) @ (T, T)
    assert rollout is not None
    return rollout.float()


def rollout_cls_map(rollout: Tensor, grid: tuple[int, int]) -> Tensor:
    """Row 0 (the class token) of a (T, T) rollout over the patch columns -> (g_h, g_w)."""
    return cls_attention(rollout[None], grid)[0]  # (1, T, T) -> (1, g_h, g_w) -> (g_h, g_w)


def top_predictions(
    probabilities: Tensor, names: Sequence[str], k: int = TOP_K
) -> list[tuple[str, float]]:
    """The ``k`` most probable labels of (K,) ``probabilities`` (at most K), most probable
    first, as (name, probability); a label without a name is its class index."""
    top = probabilities.topk(min(k, probabilities.numel()))
    return [
        (names[i] if names else str(i), float(p))
        for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
    ]


# -- the model's attention on one image ----------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ImageAttention:
    """A ViT's attention weights and prediction for one image.

    Attributes:
        name: the image file's name (for titles).
        image: the image, upright, in RGB, at its stored size (drawn resized to the input size).
        input_size: (H, W), the pixels the model read (after the preprocessing's resize).
        patch_size: P.
        grid: (g_h, g_w) = (H // P, W // P).
        weights: L × (n, T, T) attention weights, the first layer first.
        probabilities: (K,) the classifier's softmax, or None for a ViT without one.
        label_names: the K labels' names (the config's id2label), or () for class indices.
    """

    name: str
    image: Image.Image
    input_size: tuple[int, int]
    patch_size: int
    grid: tuple[int, int]
    weights: list[Tensor]
    probabilities: Tensor | None
    label_names: tuple[str, ...]

    @property
    def num_layers(self) -> int:
        """L."""
        return len(self.weights)

    @property
    def num_heads(self) -> int:
        """n, the heads of every layer."""
        return int(self.weights[0].shape[0])

    def cls_maps(self) -> list[Tensor]:
        """L × (n, g_h, g_w): :func:`cls_attention` of every layer."""
        return [cls_attention(w, self.grid) for w in self.weights]

    def rollout(self) -> Tensor:
        """(T, T): :func:`attention_rollout` of all the layers."""
        return attention_rollout(self.weights)

    def rollout_map(self) -> Tensor:
        """(g_h, g_w): the class token's row of the rollout over the patches."""
        return rollout_cls_map(self.rollout(), self.grid)

    def predictions(self, k: int = TOP_K) -> list[tuple[str, float]]:
        """The top ``k`` (label, probability); [] without a classifier."""
        if self.probabilities is None:
            return []
        return top_predictions(self.probabilities, self.label_names, k)


@torch.no_grad()
def collect_image_attention(
    model: ViT, preprocessor: ImagePreprocessor, path: str | Path
) -> ImageAttention:
    """Read the image at ``path`` as ``preprocessor`` says, run ``model`` once (in eval mode,
    its mode restored afterwards) and keep every layer's attention and the class probabilities.

    Raises:
        UserError: naming the file, when it is not a readable image, cannot be preprocessed, has
            other channels than the model takes, or is smaller than one patch.
    """
    image = open_image(path)
    try:
        pixels = preprocessor.preprocess(image)  # (C, H, W)
    except (OSError, ValueError) as exc:  # UserError is a ValueError
        raise UserError(f"{path}: cannot preprocess the image ({exc})") from None
    config = model.config
    channels, height, width = pixels.shape
    if channels != config.num_channels:
        raise UserError(
            f"{path}: the image is read with {channels} channels; the model takes "
            f"{config.num_channels}"
        )
    p = config.patch_size
    if height < p or width < p:
        raise UserError(
            f"{path}: the model reads it as {width}×{height} pixels, smaller than one {p}×{p} patch"
        )
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = model(pixels[None].to(device), need_weights=True)  # (1, C, H, W)
    finally:
        model.train(was_training)
    assert out.weights is not None
    probabilities = None
    if out.logits is not None:
        probabilities = torch.softmax(out.logits[0].float(), dim=-1).cpu()  # (K,)
    display = preprocessor.convert(image).convert("RGB")
    return ImageAttention(
        name=Path(path).name,
        image=display,
        input_size=(height, width),
        patch_size=p,
        grid=(height // p, width // p),
        weights=[w[0].float().cpu() for w in out.weights],  # L × (n, T, T)
        probabilities=probabilities,
        label_names=tuple(config.id2label),
    )


# -- drawing -------------------------------------------------------------------------------------


def overlay_heatmap(
    image: Image.Image,
    heat: Tensor,
    covered: tuple[int, int],
    *,
    alpha: float = OVERLAY_ALPHA,
    hue: tuple[float, float, float] = OVERLAY_HUE,
    blocks: bool = False,
    patch_pixels: int = 0,
) -> Image.Image:
    """Lay a (g_h, g_w) map over ``image`` drawn in grey, as one translucent hue.

    The map is scaled from its own minimum (0) to its maximum (1), upsampled (bilinearly, or
    with ``blocks`` as one value per patch) to ``covered`` = (height, width) pixels from the top
    left corner (the part of the image the patch grid covers); a pixel at level v ∈ [0, 1] becomes
    (1 − alpha·v)·grey + alpha·v·hue, so the map's minimum leaves the grey image as it is and
    its maximum is the hue at opacity ``alpha`` (a nearly even map, as a rollout is, still shows
    where it is highest). With ``patch_pixels`` > 0, the patch grid is drawn
    over the covered part (a mid grey line every ``patch_pixels`` pixels). Pixels outside the
    covered part stay grey. Returns a new RGB image of ``image``'s size.
    """
    width, height = image.size
    heat = heat.detach().double()
    low, high = (float(heat.min()), float(heat.max())) if heat.numel() else (0.0, 0.0)
    spread = high - low
    scaled = (heat - low) / spread if spread > 0 else torch.zeros_like(heat)  # (g_h, g_w) in [0, 1]
    mode = "nearest" if blocks else "bilinear"
    upsampled = F.interpolate(scaled[None, None], size=covered, mode=mode)[0, 0]  # (h, w)
    opacity = alpha * upsampled.clamp(0, 1).numpy()[..., None]  # (h, w, 1)
    base = np.asarray(image.convert("L").convert("RGB"), dtype=np.float64) / 255.0  # (H', W', 3)
    ch, cw = covered
    mixed = base.copy()
    mixed[:ch, :cw] = (1 - opacity) * base[:ch, :cw] + opacity * np.asarray(hue)
    if patch_pixels > 0:
        mixed[:ch:patch_pixels, :cw] = GRID_GREY  # the top edge of every patch row
        mixed[:ch, :cw:patch_pixels] = GRID_GREY  # the left edge of every patch column
        mixed[ch - 1, :cw] = mixed[:ch, cw - 1] = GRID_GREY  # the grid's last edges
    pixels = np.clip(np.round(mixed * 255.0), 0, 255).astype(np.uint8)
    assert pixels.shape == (height, width, 3)
    return Image.fromarray(pixels, "RGB")


@dataclass(frozen=True)
class Overlays:
    """The pictures of an :class:`ImageAttention`, all of one size (W', H').

    Attributes:
        input: the image as the model reads it, enlarged.
        heads: L × n overlays of :meth:`ImageAttention.cls_maps`.
        rollout: the overlay of :meth:`ImageAttention.rollout_map`.
        covered: (height, width) of the part of the drawing the patch grid covers.
        patch_pixels: the side of a patch in the drawing (the grid's step).
    """

    input: Image.Image
    heads: list[list[Image.Image]]
    rollout: Image.Image
    covered: tuple[int, int]
    patch_pixels: int = 0

    @property
    def size(self) -> tuple[int, int]:
        """(W', H'), as PIL gives sizes."""
        return self.input.size


def draw_overlays(attention: ImageAttention, *, min_side: int = DISPLAY_MIN_SIDE) -> Overlays:
    """Every overlay of ``attention``: the input in grey (contrast-stretched to the greys
    :data:`GREY_FLOOR` .. white, so that the hue shows over dark pixels too) and resized to
    (H, W) × s, s the smallest whole factor with a longer side of at least ``min_side`` pixels
    (1 for a large enough input); pixel by pixel, with one level per patch, when
    s ≥ PIXELATED_FROM; the patch grid drawn over each map."""
    height, width = attention.input_size
    scale = max(1, math.ceil(min_side / max(height, width)))
    size = (width * scale, height * scale)  # (W', H')
    blocks = scale >= PIXELATED_FROM
    resample = Image.Resampling.NEAREST if blocks else Image.Resampling.BICUBIC
    grey = ImageOps.autocontrast(attention.image.convert("L"))
    grey = grey.point(lambda v: round(GREY_FLOOR * 255 + (1 - GREY_FLOOR) * v))  # lighter
    shown = grey.resize(size, resample=resample).convert("RGB")
    g_h, g_w = attention.grid
    step = attention.patch_size * scale
    covered = (g_h * step, g_w * step)

    def overlay(heat: Tensor) -> Image.Image:
        return overlay_heatmap(shown, heat, covered, blocks=blocks, patch_pixels=step)

    heads = [[overlay(head) for head in layer] for layer in attention.cls_maps()]  # (n, g_h, g_w)
    return Overlays(shown, heads, overlay(attention.rollout_map()), covered, step)


def image_attention_pngs(attention: ImageAttention) -> list[str]:
    """The names :func:`write_image_attention_pngs` writes, in order."""
    names = ["input.png"]
    for layer in range(1, attention.num_layers + 1):
        names += [f"cls_L{layer}_H{head}.png" for head in range(1, attention.num_heads + 1)]
        names.append(f"cls_L{layer}_all.png")
    return [*names, "rollout.png"]


def _overlay_scale(
    alpha: float = OVERLAY_ALPHA, hue: tuple[float, float, float] = OVERLAY_HUE
) -> Any:
    """The colour bar's colour map: the hue from transparent (0) to opacity ``alpha`` (the
    map's maximum), as :func:`overlay_heatmap` lays it over the image."""
    from matplotlib.colors import ListedColormap

    levels = np.linspace(0.0, 1.0, 256)[:, None]  # (256, 1)
    rgba = np.concatenate([np.broadcast_to(hue, (256, 3)), alpha * levels], axis=1)  # (256, 4)
    return ListedColormap(rgba)


def _span(heat: Tensor) -> tuple[float, float]:
    """(minimum, maximum) of a map: the ends of its colour bar."""
    return float(heat.min()), float(heat.max())


def _draw_panel(
    fig: Any,
    ax: Any,
    picture: Image.Image,
    overlays: Overlays,
    grid: tuple[int, int],
    span: tuple[float, float] | None,
    label: str,
) -> None:
    """One overlay in an axes: patch rows and columns numbered, a colour bar of the weights
    from the map's minimum to its maximum, ``span``; none for the plain image, ``span`` None)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    ax.imshow(np.asarray(picture), interpolation="nearest")
    g_h, g_w = grid
    step = overlays.patch_pixels
    ax.set_xticks(
        [(j + 0.5) * step - 0.5 for j in range(g_w)], [str(j + 1) for j in range(g_w)], fontsize=7
    )
    ax.set_yticks(
        [(i + 0.5) * step - 0.5 for i in range(g_h)], [str(i + 1) for i in range(g_h)], fontsize=7
    )
    ax.set_xlabel("patch column", fontsize=8)
    ax.set_ylabel("patch row", fontsize=8)
    if span is not None:
        low, high = span
        scale = ScalarMappable(Normalize(low, max(high, low + 1e-12)), _overlay_scale())
        fig.colorbar(scale, ax=ax, shrink=0.8, label=label)


def _single_figure(
    picture: Image.Image,
    overlays: Overlays,
    grid: tuple[int, int],
    span: tuple[float, float] | None,
    title: str,
    label: str,
) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2, 4.4), layout="constrained")
    ax = fig.add_subplot()
    _draw_panel(fig, ax, picture, overlays, grid, span, label)
    ax.set_title(title, fontsize=9)
    return fig


def _layer_figure(attention: ImageAttention, overlays: Overlays, layer: int) -> Any:
    """Every head's overlay of one layer (counted from 1), each with its colour bar."""
    from matplotlib.figure import Figure

    maps = attention.cls_maps()[layer - 1]  # (n, g_h, g_w)
    heads = len(maps)
    cols = min(4, heads)
    rows = math.ceil(heads / cols)
    fig = Figure(figsize=(3.6 * cols, 3.3 * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= heads:
            ax.set_axis_off()
            continue
        picture = overlays.heads[layer - 1][index]
        _draw_panel(fig, ax, picture, overlays, attention.grid, _span(maps[index]), "weight")
        ax.set_title(f"head {index + 1}", fontsize=9)
    fig.suptitle(
        f"{attention.name}: the class token's attention over the patches, layer {layer} "
        "(stronger red = more; each head from its own minimum to its maximum)",
        fontsize=10,
    )
    return fig


def _figures(attention: ImageAttention, overlays: Overlays) -> dict[str, Any]:
    """The figures of :func:`image_attention_pngs`, by file name."""
    name, grid = attention.name, attention.grid
    (height, width), p = attention.input_size, attention.patch_size
    plain = overlay_heatmap(
        overlays.input, torch.zeros(grid), overlays.covered, patch_pixels=overlays.patch_pixels
    )
    title = f"{name} as the model reads it: {width}×{height} pixels, {grid[0]}×{grid[1]} patches"
    figures = {"input.png": _single_figure(plain, overlays, grid, None, f"{title} of {p}×{p}", "")}
    label = "attention weight of the class token"
    for layer, maps in enumerate(attention.cls_maps(), start=1):
        for head, heat in enumerate(maps, start=1):
            picture = overlays.heads[layer - 1][head - 1]
            title = f"{name}: class-token attention, layer {layer}, head {head}"
            figure = _single_figure(picture, overlays, grid, _span(heat), title, label)
            figures[f"cls_L{layer}_H{head}.png"] = figure
        figures[f"cls_L{layer}_all.png"] = _layer_figure(attention, overlays, layer)
    span = _span(attention.rollout_map())
    title = (
        f"{name}: attention rollout of the class token\nthrough all {attention.num_layers} layers "
        "(Abnar & Zuidema 2020)"
    )
    label = "share of the class token's input"
    figures["rollout.png"] = _single_figure(overlays.rollout, overlays, grid, span, title, label)
    return figures


def write_image_attention_pngs(
    attention: ImageAttention, out_dir: Path, overlays: Overlays | None = None
) -> list[Path]:
    """Write :func:`image_attention_pngs` into ``out_dir`` (created); returns the files.

    ``input.png``: the image as the model reads it, in grey, with the patch grid;
    ``cls_L{l}_H{h}.png``: the class token's attention of layer l, head h over the patches, a
    translucent red over the grey image (:func:`overlay_heatmap`) with a colour bar of the
    weights; ``cls_L{l}_all.png``: every head of layer l; ``rollout.png``: the attention
    rollout. Each has a title saying what it shows and the patch rows and columns numbered.
    """
    overlays = draw_overlays(attention) if overlays is None else overlays
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, figure in _figures(attention, overlays).items():
        figure.savefig(out_dir / file_name, dpi=100)
        written.append(out_dir / file_name)
    return written


# -- the page ------------------------------------------------------------------------------------


def _data_uri(image: Image.Image) -> str:
    """``image`` as a base64 data URI in the page's format."""
    fmt, mime = _PAGE_FORMAT
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, quality=88)
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def _rounded(values: Tensor) -> Any:
    """A tensor as nested lists of floats rounded to 5 decimals."""
    return np.round(values.double().numpy(), 5).tolist()


def page_data(attention: ImageAttention, overlays: Overlays) -> dict[str, Any]:
    """The JSON-ready content of the page: the images as data URIs and the numbers drawn.

    ``layers`` is L × n data URIs, ``maps`` L × n × g_h × g_w class-token weights,
    ``rollout_map`` g_h × g_w; ``covered`` and ``size`` are in drawn pixels.
    """
    width, height = overlays.size
    return {
        "name": attention.name,
        "grid": list(attention.grid),
        "size": [height, width],
        "covered": list(overlays.covered),
        "input": _data_uri(overlays.input),
        "layers": [[_data_uri(image) for image in layer] for layer in overlays.heads],
        "maps": [_rounded(m) for m in attention.cls_maps()],
        "rollout": _data_uri(overlays.rollout),
        "rollout_map": _rounded(attention.rollout_map()),
        "predictions": [
            {"label": label, "probability": round(p, 6)} for label, p in attention.predictions()
        ],
    }


def _predictions_html(attention: ImageAttention) -> str:
    predictions = attention.predictions()
    if not predictions:
        return "<p>This model has no classifier (num_labels = 0): no predictions.</p>"
    rows = "\n".join(
        f'<tr><td class="p">{p:.4f}</td><td><span class="bar" style="width: {p * 12:.2f}em">'
        f"</span></td><td>{html.escape(label)}</td></tr>"
        for label, p in predictions
    )
    return f'<table class="predictions">\n{rows}\n</table>'


def _legend_colours() -> str:
    """The colour bar's two ends in CSS: the image's darkest grey, and the hue at its full
    opacity over it (as :func:`overlay_heatmap` draws a map's minimum and maximum)."""
    grey = np.full(3, GREY_FLOOR)
    top = (1 - OVERLAY_ALPHA) * grey + OVERLAY_ALPHA * np.asarray(OVERLAY_HUE)
    low, high = (np.round(c * 255).astype(int) for c in (grey, top))
    return f"rgb({low[0]}, {low[1]}, {low[2]}), rgb({high[0]}, {high[1]}, {high[2]})"


def image_attention_html(
    attention: ImageAttention,
    overlays: Overlays | None = None,
    *,
    title: str = "Attention maps",
) -> str:
    """The complete page as a string: inline data, script and style, images as data URIs."""
    overlays = draw_overlays(attention) if overlays is None else overlays
    data = page_data(attention, overlays)
    (height, width), (g_h, g_w) = attention.input_size, attention.grid
    return fill(
        page_file("image_attention.html"),
        head=page_head(title, page_file("image_attention.css"), common_style=False),
        title=html.escape(title),
        name=html.escape(attention.name),
        width=width,
        height=height,
        g_h=g_h,
        g_w=g_w,
        patch=attention.patch_size,
        layers=attention.num_layers,
        heads=attention.num_heads,
        input=data["input"],
        rollout=data["rollout"],
        legend=_legend_colours(),
        predictions=_predictions_html(attention),
        data=script_json(data),
        script=page_file("image_attention.js"),
    )


def write_image_attention_html(
    attention: ImageAttention,
    path: Path,
    overlays: Overlays | None = None,
    *,
    title: str = "Attention maps",
) -> Path:
    """Write :func:`image_attention_html` to ``path`` (parent folders are created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(image_attention_html(attention, overlays, title=title), encoding="utf-8")
    return path
