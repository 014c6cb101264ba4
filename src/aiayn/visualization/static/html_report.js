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
