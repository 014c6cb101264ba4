(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("image-attention-data").textContent);
  var layerSelect = document.getElementById("layer");
  var headSelect = document.getElementById("head");
  var overlay = document.getElementById("overlay");
  var caption = document.getElementById("overlay-caption");
  var readout = document.getElementById("readout");

  function fill(select, count, label, chosen) {
    for (var i = 0; i < count; i++) {
      var option = document.createElement("option");
      option.value = String(i);
      option.textContent = label + " " + (i + 1);
      select.appendChild(option);
    }
    select.selectedIndex = chosen;
  }

  function draw() {
    var l = layerSelect.selectedIndex, h = headSelect.selectedIndex;
    overlay.src = data.layers[l][h];
    caption.textContent = "class-token attention, layer " + (l + 1) + ", head " + (h + 1);
    readout.textContent = "hover over an image to read a patch's weight";
  }

  function patchAt(img, event) {  // (row, column) of the patch under the mouse, or null
    var box = img.getBoundingClientRect();
    var y = (event.clientY - box.top) / box.height * data.size[0];
    var x = (event.clientX - box.left) / box.width * data.size[1];
    if (y < 0 || x < 0 || y >= data.covered[0] || x >= data.covered[1]) { return null; }
    return [Math.floor(y / data.covered[0] * data.grid[0]),
            Math.floor(x / data.covered[1] * data.grid[1])];
  }

  function hover(img, matrix, what) {
    img.addEventListener("mousemove", function (event) {
      var at = patchAt(img, event);
      if (!at) { readout.textContent = what() + ": outside the patch grid (not seen)"; return; }
      readout.textContent = what() + ", patch (row " + (at[0] + 1) + ", column " +
        (at[1] + 1) + "): " + matrix()[at[0]][at[1]].toFixed(5);
    });
  }

  fill(layerSelect, data.layers.length, "layer", data.layers.length - 1);
  fill(headSelect, data.layers[0].length, "head", 0);
  layerSelect.addEventListener("change", draw);
  headSelect.addEventListener("change", draw);
  hover(overlay, function () {
    return data.maps[layerSelect.selectedIndex][headSelect.selectedIndex];
  }, function () { return caption.textContent; });
  hover(document.getElementById("rollout"), function () { return data.rollout_map; },
        function () { return "attention rollout"; });
  draw();

  window.aiaynImageAttention = {
    draw: draw,
    state: function () {
      return { layer: layerSelect.selectedIndex + 1, head: headSelect.selectedIndex + 1 };
    },
    select: function (layer, head) {
      layerSelect.selectedIndex = layer - 1;
      headSelect.selectedIndex = head - 1;
      draw();
    },
    source: function () { return overlay.src; },
    matrix: function () {
      return data.maps[layerSelect.selectedIndex][headSelect.selectedIndex];
    }
  };
})();
