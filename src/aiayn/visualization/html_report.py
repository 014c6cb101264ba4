"""One self-contained HTML page to browse attention maps (``aiayn attention`` writes it).

The page holds everything it needs: the weights as inline JSON, small inline scripts that
draw them, and inline CSS. It loads nothing from the network or from other files, so it can be
mailed or opened from disk. Its template, style and heatmap script are files of the package
(``static/html_report.html``, ``.css`` and ``.js``), put into the page as it is written. It has
two parts:

- a heatmap of one map: selects choose the attention (for an encoder–decoder, §3.2.3: encoder
  self-attention, masked decoder self-attention, encoder–decoder attention; GPT-2's causal and
  BERT's bidirectional self-attention), the layer and the head (§3.2.2); hovering over a cell
  shows its query, key and weight. The colour scale is the PNGs' (matplotlib "Blues"):
  white = 0, dark blue = 1.
- the head view (:mod:`aiayn.visualization.head_view`): every head of a layer at once.

For tests and curious readers the heatmap's script exposes ``window.aiaynAttention``:
``state()`` (the selected kind, layer and head), ``matrix()`` (the weights drawn, R × C),
``pixel(r, c)`` (the RGBA of the canvas at the centre of cell (r, c)) and ``draw()``.

Shape legend:
    N  layers     H  heads     R  rows (queries)     C  columns (keys)
"""

from __future__ import annotations

import html
from pathlib import Path

from aiayn.visualization.attention_page import (
    as_token_attention,
    page_head,
    page_lines,
    report_data,
    script_json,
)
from aiayn.visualization.head_view import HEAD_VIEW_SCRIPT, HEAD_VIEW_STYLE, head_view_section
from aiayn.visualization.static_files import fill, page_file
from aiayn.visualization.token_attention import AttentionLike, TokenAttention, write_view_pngs

__all__ = [
    "attention_html",
    "page_head",
    "report_data",
    "write_attention_files",
    "write_attention_html",
]


def attention_html(attention: AttentionLike, *, title: str = "Attention maps") -> str:
    """The complete page as a string (inline data, scripts and style; no external resources)."""
    attention = as_token_attention(attention)
    return fill(
        page_file("html_report.html"),
        head=page_head(title, page_file("html_report.css") + HEAD_VIEW_STYLE),
        title=html.escape(title),
        lines=page_lines(attention),
        note=html.escape(attention.note),
        section=head_view_section(),
        data=script_json(report_data(attention)),
        script=page_file("html_report.js"),
        head_view_script=HEAD_VIEW_SCRIPT,
    )


def write_attention_html(
    attention: AttentionLike, path: Path, *, title: str = "Attention maps"
) -> Path:
    """Write :func:`attention_html` to ``path`` (parent folders are created); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(attention_html(attention, title=title), encoding="utf-8")
    return path


def write_attention_files(
    attention: TokenAttention, folder: Path, *, png: bool = True
) -> list[Path]:
    """The PNGs (with ``png``: :func:`~aiayn.visualization.token_attention.write_view_pngs`)
    and ``attention.html`` (the heatmap page with the head view) of ``attention`` in
    ``folder``; returns the files written."""
    caption = repr(attention.lines[0][1]) if attention.lines else ""
    written = write_view_pngs(attention.views, caption, folder) if png else []
    page = folder / "attention.html"
    written.append(write_attention_html(attention, page, title=attention.title))
    return written
