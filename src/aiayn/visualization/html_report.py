"""One self-contained HTML page to browse attention maps (``aiayn attention`` writes it).

The page holds everything it needs: the weights as inline JSON, small inline scripts that
draw them, and inline CSS. It loads nothing from the network or from other files, so it can be
mailed or opened from disk. It has two parts:

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
from aiayn.visualization.token_attention import AttentionLike, TokenAttention, write_view_pngs

__all__ = [
    "attention_html",
    "page_head",
    "report_data",
    "write_attention_files",
    "write_attention_html",
]

_STYLE = """
.controls { margin: 1em 0; display: flex; gap: 1.2em; align-items: center; flex-wrap: wrap; }
.controls label { font-weight: 600; }
#readout { min-height: 1.4em; font-family: ui-monospace, monospace; margin: 0.5em 0; }
.legend { display: flex; align-items: center; gap: 0.5em; font-size: 0.9em; }
.legend .bar { width: 160px; height: 12px; border: 1px solid #999;
  background: linear-gradient(to right, rgb(255,255,255), rgb(8,48,107)); }
canvas { border: 1px solid #ddd; }
"""

_SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attention-data").textContent);
  var kindSelect = document.getElementById("kind");
  var layerSelect = document.getElementById("layer");
  var headSelect = document.getElementById("head");
  var canvas = document.getElementById("map");
  var readout = document.getElementById("readout");
  var ctx = canvas.getContext("2d", { willReadFrequently: true });
  var CELL = 26, PAD = 8, FONT = "12px sans-serif";
  var geometry = null;

  function colour(v) {  // white (0) -> rgb(8, 48, 107) (1), as matplotlib's "Blues" ends
    var t = Math.max(0, Math.min(1, v));
    return [Math.round(255 - 247 * t), Math.round(255 - 207 * t), Math.round(255 - 148 * t)];
  }

  function setOptions(select, count, label) {
    var keep = select.selectedIndex;
    select.innerHTML = "";
    for (var i = 0; i < count; i++) {
      var option = document.createElement("option");
      option.value = String(i);
      option.textContent = label + " " + (i + 1);
      select.appendChild(option);
    }
    select.selectedIndex = keep >= 0 && keep < count ? keep : 0;
  }

  function current() {
    var kind = data.kinds[kindSelect.selectedIndex];
    return {
      kind: kind,
      matrix: kind.layers[layerSelect.selectedIndex][headSelect.selectedIndex]
    };
  }

  function draw() {
    var sel = current(), rows = sel.kind.rows, cols = sel.kind.cols, m = sel.matrix;
    ctx.font = FONT;
    var rowWidth = 0, colWidth = 0;
    rows.forEach(function (s) { rowWidth = Math.max(rowWidth, ctx.measureText(s).width); });
    cols.forEach(function (s) { colWidth = Math.max(colWidth, ctx.measureText(s).width); });
    var left = Math.ceil(rowWidth) + 2 * PAD, top = Math.ceil(colWidth) + 2 * PAD;
    canvas.width = left + cols.length * CELL + PAD;
    canvas.height = top + rows.length * CELL + PAD;
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (var r = 0; r < rows.length; r++) {
      for (var c = 0; c < cols.length; c++) {
        var rgb = colour(m[r][c]);
        ctx.fillStyle = "rgb(" + rgb[0] + "," + rgb[1] + "," + rgb[2] + ")";
        ctx.fillRect(left + c * CELL, top + r * CELL, CELL, CELL);
      }
    }
    ctx.strokeStyle = "#bbb";
    ctx.strokeRect(left - 0.5, top - 0.5, cols.length * CELL + 1, rows.length * CELL + 1);
    ctx.font = FONT;
    ctx.fillStyle = "#222";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    rows.forEach(function (s, i) { ctx.fillText(s, left - PAD, top + (i + 0.5) * CELL); });
    cols.forEach(function (s, j) {
      ctx.save();
      ctx.translate(left + (j + 0.5) * CELL, top - PAD);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(s, 0, 0);
      ctx.restore();
    });
    geometry = { left: left, top: top, cell: CELL, rows: rows.length, cols: cols.length };
    canvas.setAttribute("data-kind", sel.kind.name);
    readout.textContent = sel.kind.title + ", layer " + (layerSelect.selectedIndex + 1) +
      ", head " + (headSelect.selectedIndex + 1) + ": hover over a cell";
  }

  function onKind() {
    var kind = data.kinds[kindSelect.selectedIndex];
    setOptions(layerSelect, kind.layers.length, "layer");
    setOptions(headSelect, kind.layers[0].length, "head");
    draw();
  }

  canvas.addEventListener("mousemove", function (event) {
    if (!geometry) { return; }
    var box = canvas.getBoundingClientRect();
    var c = Math.floor((event.clientX - box.left - geometry.left) / geometry.cell);
    var r = Math.floor((event.clientY - box.top - geometry.top) / geometry.cell);
    if (r < 0 || c < 0 || r >= geometry.rows || c >= geometry.cols) { return; }
    var sel = current();
    readout.textContent = "query " + JSON.stringify(sel.kind.rows[r]) + " \u2192 key " +
      JSON.stringify(sel.kind.cols[c]) + ": " + sel.matrix[r][c].toFixed(4);
  });

  data.kinds.forEach(function (kind, i) {
    var option = document.createElement("option");
    option.value = String(i);
    option.textContent = kind.title;
    kindSelect.appendChild(option);
  });
  kindSelect.addEventListener("change", onKind);
  layerSelect.addEventListener("change", draw);
  headSelect.addEventListener("change", draw);
  onKind();

  window.aiaynAttention = {
    draw: draw,
    state: function () {
      return { kind: current().kind.name, layer: layerSelect.selectedIndex + 1,
               head: headSelect.selectedIndex + 1 };
    },
    matrix: function () { return current().matrix; },
    pixel: function (r, c) {
      var x = Math.floor(geometry.left + (c + 0.5) * geometry.cell);
      var y = Math.floor(geometry.top + (r + 0.5) * geometry.cell);
      return Array.prototype.slice.call(ctx.getImageData(x, y, 1, 1).data);
    }
  };
})();
"""


def attention_html(attention: AttentionLike, *, title: str = "Attention maps") -> str:
    """The complete page as a string (inline data, scripts and style; no external resources)."""
    attention = as_token_attention(attention)
    return f"""<!DOCTYPE html>
<html lang="en">
{page_head(title, _STYLE + HEAD_VIEW_STYLE)}
<body>
<h1>{html.escape(title)}</h1>
{page_lines(attention)}
<h2>One head</h2>
<div class="controls">
  <span><label for="kind">Attention</label> <select id="kind"></select></span>
  <span><label for="layer">Layer</label> <select id="layer"></select></span>
  <span><label for="head">Head</label> <select id="head"></select></span>
  <span class="legend">0 <span class="bar"></span> 1</span>
</div>
<div id="readout"></div>
<canvas id="map" width="10" height="10"></canvas>
<p class="note">{html.escape(attention.note)}</p>
{head_view_section()}
<script type="application/json" id="attention-data">{script_json(report_data(attention))}</script>
<script>{_SCRIPT}</script>
<script>{HEAD_VIEW_SCRIPT}</script>
</body>
</html>
"""


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
