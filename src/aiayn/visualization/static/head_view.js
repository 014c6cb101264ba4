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
