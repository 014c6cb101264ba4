"""The head view: every head of one layer at once, as coloured lines between two token columns.

The queries stand in the left column, the keys in the right one; a line joins query i to key j
for each head h whose weight a_h[i, j] is above :data:`HEAD_VIEW_THRESHOLD`, in the head's
colour, as opaque as the weight (the multi-head attention of §3.2.2, all heads drawn together,
as in Vig 2019, "A Multiscale Visualization of Attention in the Transformer Model"). Hovering
over a token isolates its lines (a query's: where it looks; a key's: who looks at it); clicking
a token keeps it isolated until clicked again; clicking a head's swatch turns the head off and
on; selects pick the attention (e.g. encoder self-attention, masked decoder self-attention,
encoder–decoder attention) and the layer.

The view is plain SVG drawn by a small inline script from the page's inline JSON (no network,
no other file). It is part of the page ``aiayn attention`` writes (:mod:`aiayn.visualization.
html_report`), and :func:`head_view` gives it on its own, for a notebook: the returned
:class:`HeadView` has ``_repr_html_`` (Jupyter shows the page in an inline frame, where its
script runs) and ``html`` (the whole page). Its markup, style and script are files of the
package, put into the pages as they are written: ``static/head_view_section.html``,
``head_view.css`` and ``head_view.js`` (``head_view.html``: the page of its own).

For tests and curious readers the script exposes ``window.aiaynHeadView``: ``state()`` (the
attention, layer, heads on, hovered or pinned token), ``lineCount()`` (lines drawn),
``hover(side, index)`` / ``leave()``, ``toggleHead(h)``, ``select(kind, layer)`` and
``threshold``.

Shape legend:
    N  layers     H  heads     R  rows (queries)     C  columns (keys)
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from aiayn.visualization.attention_page import (
    HEAD_VIEW_THRESHOLD,
    as_token_attention,
    page_head,
    page_lines,
    report_data,
    script_json,
)
from aiayn.visualization.static_files import fill, page_file
from aiayn.visualization.token_attention import AttentionLike

__all__ = [
    "HEAD_VIEW_SCRIPT",
    "HEAD_VIEW_STYLE",
    "HEAD_VIEW_THRESHOLD",
    "HeadView",
    "head_view",
    "head_view_section",
]

HEAD_VIEW_STYLE = page_file("head_view.css")
"""The head view's CSS (``static/head_view.css``), for the ``<style>`` of a page that shows it."""

HEAD_VIEW_SCRIPT = page_file("head_view.js")
"""The head view's script (``static/head_view.js``): draws the page's ``attention-data`` JSON
(:func:`~aiayn.visualization.attention_page.report_data`) in :func:`head_view_section`."""


def head_view_section() -> str:
    """The head view's HTML (``static/head_view_section.html``, without its final newline): its
    controls and an empty SVG the script fills."""
    section = fill(page_file("head_view_section.html"), threshold=HEAD_VIEW_THRESHOLD)
    return section.removesuffix("\n")


@dataclass(frozen=True)
class HeadView:
    """A self-contained head-view page (:attr:`html`); Jupyter displays it inline."""

    html: str

    def _repr_html_(self) -> str:
        """The page in an inline frame (its script runs there, apart from the notebook's)."""
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
            'style="width: 100%; height: 640px; border: 1px solid #ddd;"></iframe>'
        )

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (parent folders are created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path


def head_view(attention: AttentionLike, *, title: str | None = None) -> HeadView:
    """The head view of ``attention`` (from a family's capture, e.g.
    :func:`aiayn.visualization.capture_attention`, or :func:`~aiayn.visualization.attention_maps.
    collect_attention`) as a page of its own, for a notebook cell or a file."""
    attention = as_token_attention(attention)
    heading = title or attention.title
    page = fill(
        page_file("head_view.html"),
        head=page_head(heading, HEAD_VIEW_STYLE),
        heading=html.escape(heading),
        lines=page_lines(attention),
        section=head_view_section(),
        data=script_json(report_data(attention)),
        script=HEAD_VIEW_SCRIPT,
    )
    return HeadView(page)
