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
script runs) and ``html`` (the whole page).

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
from aiayn.visualization.token_attention import AttentionLike

__all__ = [
    "HEAD_VIEW_SCRIPT",
    "HEAD_VIEW_STYLE",
    "HEAD_VIEW_THRESHOLD",
    "HeadView",
    "head_view",
    "head_view_section",
]

HEAD_VIEW_STYLE = """
.headview .hv-controls { margin: 0.6em 0; display: flex; gap: 1.2em; align-items: center;
  flex-wrap: wrap; }
.headview .hv-controls label { font-weight: 600; }
.headview .hv-head { display: inline-block; min-width: 1.7em; padding: 0.1em 0.3em;
  margin-right: 0.2em; border: 2px solid transparent; border-radius: 3px; color: #fff;
  font: 12px ui-monospace, monospace; text-align: center; cursor: pointer; user-select: none; }
.headview .hv-head.off { background: #ddd !important; color: #777; }
.headview #hv-readout { min-height: 2.8em; font-family: ui-monospace, monospace; }
.headview svg text { font: 13px sans-serif; cursor: pointer; fill: #222; }
.headview svg line { pointer-events: none; }
.headview svg text.hl { font-weight: 700; fill: #b4006e; }
.headview #hv-marked { font-size: 0.9em; margin: 0.3em 0; }
.headview #hv-marked .hl { font-weight: 700; color: #b4006e; }
.headview svg text.active { fill: #000; font-weight: 700; text-decoration: underline; }
"""

HEAD_VIEW_SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attention-data").textContent);
  var ROW = 24, GAP = 300, PAD = 10, TOP = 14;
  var kindSelect = document.getElementById("hv-kind");
  var layerSelect = document.getElementById("hv-layer");
  var headsBox = document.getElementById("hv-heads");
  var svg = document.getElementById("hv-svg");
  var NS = svg.namespaceURI;  // an <svg> in HTML is in the SVG namespace
  var readout = document.getElementById("hv-readout");
  var heads = [], hover = null, pinned = null, lines = 0, group = null, geometry = null;

  function colour(h, count) {
    return "hsl(" + Math.round(360 * h / Math.max(count, 1)) + ", 75%, 42%)";
  }

  function kind() { return data.kinds[kindSelect.selectedIndex]; }

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    parent.appendChild(node);
    return node;
  }

  function textWidth(labels) {
    var probe = el("text", { x: 0, y: 0 }, svg), width = 0;
    labels.forEach(function (s) {
      probe.textContent = s;
      width = Math.max(width, probe.getComputedTextLength());
    });
    svg.removeChild(probe);
    return Math.ceil(width);
  }

  function toggler(h) { return function () { toggleHead(h); }; }

  function buildHeads() {
    var count = kind().layers[0].length;
    headsBox.innerHTML = "";
    heads = [];
    for (var h = 0; h < count; h++) {
      heads.push(true);
      var swatch = document.createElement("span");
      swatch.className = "hv-head";
      swatch.style.background = colour(h, count);
      swatch.textContent = String(h + 1);
      swatch.title = "head " + (h + 1) + ": click to turn off or on";
      swatch.setAttribute("data-head", String(h));
      swatch.addEventListener("click", toggler(h));
      headsBox.appendChild(swatch);
    }
  }

  function token(side) {
    var at = hover || pinned;
    return at && at.side === side ? at.index : -1;
  }

  function drawTokens(labels, side, x, anchor, marked) {
    labels.forEach(function (s, i) {
      var t = el("text", { x: x, y: TOP + (i + 0.5) * ROW, "text-anchor": anchor,
        "dominant-baseline": "middle", "data-side": side, "data-index": i }, svg);
      t.textContent = s;
      if (marked.indexOf(i) >= 0) { t.classList.add("hl"); }
      t.addEventListener("mouseenter", function () {
        hover = { side: side, index: i };
        drawLines();
      });
      t.addEventListener("mouseleave", function () { hover = null; drawLines(); });
      t.addEventListener("click", function () {
        var same = pinned && pinned.side === side && pinned.index === i;
        pinned = same ? null : { side: side, index: i };
        drawLines();
      });
    });
  }

  function draw() {  // the columns of tokens, then the lines
    var k = kind(), mark = k.highlight || [[], []];
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var left = textWidth(k.rows) + PAD, right = textWidth(k.cols) + PAD;
    geometry = { x1: left + PAD, x2: left + PAD + GAP };
    svg.setAttribute("width", geometry.x2 + PAD + right + PAD);
    svg.setAttribute("height", TOP + Math.max(k.rows.length, k.cols.length) * ROW + PAD);
    group = el("g", {}, svg);
    drawTokens(k.rows, "left", left, "end", mark[0]);
    drawTokens(k.cols, "right", geometry.x2 + PAD, "start", mark[1]);
    drawLines();
  }

  function drawLines() {  // one line per weight above the threshold, of the heads that are on
    var k = kind(), layer = k.layers[layerSelect.selectedIndex], count = layer.length;
    var row = token("left"), col = token("right");
    var spread = Math.min(0.6 * ROW, 2.5 * (count - 1));  // heads side by side in a row
    while (group.firstChild) { group.removeChild(group.firstChild); }
    lines = 0;
    for (var h = 0; h < count; h++) {
      if (!heads[h]) { continue; }
      var m = layer[h], dy = count > 1 ? (h / (count - 1) - 0.5) * spread : 0;
      for (var r = 0; r < m.length; r++) {
        if (row >= 0 && r !== row) { continue; }
        for (var c = 0; c < m[r].length; c++) {
          var w = m[r][c];
          if (w <= data.threshold || (col >= 0 && c !== col)) { continue; }
          el("line", { x1: geometry.x1, y1: TOP + (r + 0.5) * ROW + dy, x2: geometry.x2,
            y2: TOP + (c + 0.5) * ROW + dy, stroke: colour(h, count), "stroke-width": 2,
            "stroke-opacity": Math.min(1, w), "data-head": h, "data-row": r, "data-col": c },
            group);
          lines++;
        }
      }
    }
    Array.prototype.forEach.call(svg.querySelectorAll("text"), function (t) {
      var index = +t.getAttribute("data-index");
      t.classList.toggle("active", token(t.getAttribute("data-side")) === index);
    });
    describe(k, row, col);
  }

  function describe(k, row, col) {
    var on = heads.filter(Boolean).length;
    var where = k.title + ", layer " + (layerSelect.selectedIndex + 1) + ", " + on + " of " +
      heads.length + " heads: ";
    var what = "hover over a token to isolate it, click to keep it";
    if (row >= 0) { what = "query " + JSON.stringify(k.rows[row]) + " attends to\u2026"; }
    if (col >= 0) { what = "who attends to key " + JSON.stringify(k.cols[col]); }
    readout.textContent = where + what;
  }

  function toggleHead(h) {
    heads[h] = !heads[h];
    headsBox.children[h].className = heads[h] ? "hv-head" : "hv-head off";
    drawLines();
  }

  function onKind() {
    var k = kind(), keep = layerSelect.selectedIndex;
    layerSelect.innerHTML = "";
    k.layers.forEach(function (_, i) {
      var option = document.createElement("option");
      option.value = String(i);
      option.textContent = "layer " + (i + 1);
      layerSelect.appendChild(option);
    });
    layerSelect.selectedIndex = keep >= 0 && keep < k.layers.length ? keep : 0;
    hover = null;
    pinned = k.focus === null || k.focus === undefined ? null : { side: "left", index: k.focus };
    buildHeads();
    draw();
  }

  data.kinds.forEach(function (k, i) {
    var option = document.createElement("option");
    option.value = String(i);
    option.textContent = k.title;
    kindSelect.appendChild(option);
  });
  var marked = document.getElementById("hv-marked");
  marked.innerHTML = "";
  if (data.marked) {
    var sample = document.createElement("span");
    sample.className = "hl";
    sample.textContent = "Coloured tokens";
    marked.appendChild(sample);
    marked.appendChild(document.createTextNode(": " + data.marked + "."));
  }
  kindSelect.addEventListener("change", onKind);
  layerSelect.addEventListener("change", draw);
  onKind();

  window.aiaynHeadView = {
    threshold: data.threshold,
    draw: draw,
    lineCount: function () { return lines; },
    state: function () {
      var at = hover || pinned;
      return { kind: kind().name, layer: layerSelect.selectedIndex + 1,
               heads: heads.map(function (on, h) { return on ? h + 1 : 0; }).filter(Boolean),
               token: at ? { side: at.side, index: at.index } : null };
    },
    hover: function (side, index) { hover = { side: side, index: index }; drawLines(); },
    leave: function () { hover = null; pinned = null; drawLines(); },
    toggleHead: toggleHead,
    select: function (name, layer) {
      data.kinds.forEach(function (k, i) {
        if (k.name === name) { kindSelect.selectedIndex = i; }
      });
      onKind();
      layerSelect.selectedIndex = layer - 1;
      draw();
    }
  };
})();
"""


def head_view_section() -> str:
    """The head view's HTML: its controls and an empty SVG the script fills."""
    return f"""<section class="headview">
<h2>Head view: every head of a layer</h2>
<div class="hv-controls">
  <span><label for="hv-kind">Attention</label> <select id="hv-kind"></select></span>
  <span><label for="hv-layer">Layer</label> <select id="hv-layer"></select></span>
  <span><label>Heads</label> <span id="hv-heads"></span></span>
</div>
<div id="hv-readout"></div>
<div id="hv-marked"></div>
<svg id="hv-svg" width="10" height="10"></svg>
<p class="note">Queries on the left, keys on the right; one colour per head, a line per weight
above {HEAD_VIEW_THRESHOLD}, as opaque as the weight. Hover over a token to see
only its lines; click it to keep them; click a head's number to turn it off or on.</p>
</section>"""


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
    page = f"""<!DOCTYPE html>
<html lang="en">
{page_head(heading, HEAD_VIEW_STYLE)}
<body>
<h1>{html.escape(heading)}</h1>
{page_lines(attention)}
{head_view_section()}
<script type="application/json" id="attention-data">{script_json(report_data(attention))}</script>
<script>{HEAD_VIEW_SCRIPT}</script>
</body>
</html>
"""
    return HeadView(page)
