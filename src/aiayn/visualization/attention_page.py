"""The attention page's data and frame, shared by the heatmap page
(:mod:`aiayn.visualization.html_report`), the head view (:mod:`aiayn.visualization.head_view`)
and the service's playground: the JSON-ready content of a :class:`~aiayn.visualization.
token_attention.TokenAttention` (:func:`report_data`), its safe inlining (:func:`script_json`),
the page's ``<head>`` (its template and common style in ``static/``) and the input's lines.

It stands below both pages, so neither imports the other for these.

Shape legend:
    N  layers     H  heads     R  rows (queries)     C  columns (keys)
"""

from __future__ import annotations

import html
import json
from typing import Any

from aiayn.visualization.static_files import fill, page_file
from aiayn.visualization.token_attention import AttentionLike, TokenAttention

__all__ = [
    "HEAD_VIEW_THRESHOLD",
    "as_token_attention",
    "page_head",
    "page_lines",
    "report_data",
    "script_json",
]

HEAD_VIEW_THRESHOLD = 0.01
"""Weights at or below this are not drawn in the head view: a line that faint cannot be seen,
and a long text would otherwise draw R·C·H lines per layer."""

_DECIMALS = 4  # weights are rounded to this many decimals in the page (exact zeros stay zero)


def as_token_attention(attention: AttentionLike) -> TokenAttention:
    """``attention`` as a :class:`TokenAttention` (anything else converted by its
    ``token_attention()``: an encoder–decoder's :class:`~aiayn.visualization.attention_maps.
    AttentionMaps`, a ViT's result)."""
    return attention if isinstance(attention, TokenAttention) else attention.token_attention()


def report_data(attention: AttentionLike) -> dict[str, Any]:
    """The JSON-ready content of the page: the input, labels and every map's weights.

    ``kinds[k]["layers"]`` is nested N × H × R × C (lists of floats, rounded to 4 decimals);
    ``threshold`` is the head view's (weights at or below it are not drawn there).
    """
    attention = as_token_attention(attention)
    kinds = []
    for view in attention.views:
        layers = [
            [[[round(float(x), _DECIMALS) for x in row] for row in head] for head in w.tolist()]
            for w in view.layers  # w: (H, R, C)
        ]
        rows, cols = attention.highlight.get(view.name, ([], []))
        kinds.append(
            {
                "name": view.name,
                "title": view.title,
                "rows": view.rows,
                "cols": view.cols,
                "axes": list(view.axis_names),
                "layers": layers,
                "highlight": [rows, cols],
                "focus": attention.focus.get(view.name),
            }
        )
    return {
        "title": attention.title,
        "lines": [list(line) for line in attention.lines],
        "threshold": HEAD_VIEW_THRESHOLD,
        "marked": attention.marked,
        "kinds": kinds,
    }


def script_json(data: dict[str, Any]) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>`` or ``<!--``)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_head(title: str, style: str, *, common_style: bool = True) -> str:
    """The ``<head>`` element (``static/page_head.html``, without its final newline): charset,
    viewport, title and inline style, the token pages' common ``static/page.css`` (unless not
    ``common_style``) then ``style``."""
    common = page_file("page.css") if common_style else ""
    head = fill(page_file("page_head.html"), title=html.escape(title), style=common + style)
    return head.removesuffix("\n")


def page_lines(attention: TokenAttention) -> str:
    """The input's description, one paragraph per (label, text) line."""
    return "\n".join(
        f'<p class="pair"><b>{html.escape(label)}:</b> {html.escape(text)}</p>'
        for label, text in attention.lines
    )
