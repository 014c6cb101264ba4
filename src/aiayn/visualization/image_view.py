"""``aiayn attention`` for a Vision Transformer: the registry's capture for image families.

:func:`image_attention` reads the image as the checkpoint's preprocessing says and runs the ViT
once (:func:`~aiayn.visualization.image_attention.collect_image_attention`); the result writes
the class token's attention over the patches and the rollout (PNG and ``attention.html``, see
:mod:`aiayn.visualization.image_attention`) and ``head_view.html``: every head of a layer at once
over the positions [CLS], then the patches row by row (``r2c3``: grid row 2, column 3).

Shape legend:
    n heads   T = 1 + g_h·g_w positions (class token, then the patches)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.checkpoint import Checkpoint
from aiayn.visualization.image_attention import ImageAttention
from aiayn.visualization.token_attention import AttentionRequest, AttentionView, TokenAttention

__all__ = ["ImageAttentionResult", "image_attention", "patch_labels"]

HEAD_VIEW_FILE = "head_view.html"


def patch_labels(grid: tuple[int, int]) -> list[str]:
    """``[CLS]``, then ``r{row}c{column}`` of each patch in row-major order (from 1)."""
    g_h, g_w = grid
    return ["[CLS]", *(f"r{r + 1}c{c + 1}" for r in range(g_h) for c in range(g_w))]


@dataclass(frozen=True, eq=False)
class ImageAttentionResult:
    """A ViT's attention for one image, as ``aiayn attention`` prints and writes it."""

    attention: ImageAttention

    def token_attention(self) -> TokenAttention:
        """Every layer's (n, T, T) weights over [CLS] and the patches, for the head view."""
        labels = patch_labels(self.attention.grid)
        view = AttentionView(
            "self",
            "self-attention over [CLS] and the patches",
            labels,
            labels,
            [w.float() for w in self.attention.weights],
            ("query: position", "key: position"),
        )
        return TokenAttention(
            title=f"Head view: {self.attention.name}",
            lines=[("Image", self.attention.name)],
            views=[view],
            note="Positions: the class token, then the patches row by row (r2c3: grid row 2, "
            "column 3). Every row is a softmax and sums to 1.",
            focus={"self": 0},
        )

    def summary(self) -> list[str]:
        """The image, the grid it was read as, the top labels."""
        a = self.attention
        (height, width), (g_h, g_w), p = a.input_size, a.grid, a.patch_size
        lines = [
            f"image: {a.name} ({a.image.width}×{a.image.height} pixels)",
            f"read as {width}×{height} pixels: a {g_h}×{g_w} grid of {p}×{p} patches",
        ]
        lines += [f"{probability:.4f}\t{label}" for label, probability in a.predictions()]
        return lines

    def write(self, folder: Path, *, png: bool = True) -> list[Path]:
        """The PNGs (with ``png``), ``attention.html`` and ``head_view.html`` in ``folder``."""
        from aiayn.visualization.head_view import head_view
        from aiayn.visualization.image_attention import (
            draw_overlays,
            write_image_attention_html,
            write_image_attention_pngs,
        )

        overlays = draw_overlays(self.attention)
        written = write_image_attention_pngs(self.attention, folder, overlays) if png else []
        title = f"Attention maps: {self.attention.name}"
        page = folder / "attention.html"
        written.append(write_image_attention_html(self.attention, page, overlays, title=title))
        written.append(head_view(self.token_attention()).save(folder / HEAD_VIEW_FILE))
        return written


def image_attention(checkpoint: Checkpoint[Any], request: AttentionRequest) -> ImageAttentionResult:
    """``aiayn attention`` for a ViT checkpoint and ``request.image``."""
    from aiayn.checkpoint import checkpoint_preprocessor
    from aiayn.visualization.image_attention import collect_image_attention

    assert request.image is not None
    preprocessor = checkpoint_preprocessor(checkpoint.path)
    return ImageAttentionResult(
        collect_image_attention(checkpoint.model, preprocessor, request.image)
    )
