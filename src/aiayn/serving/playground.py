"""The playground page of ``aiayn serve`` (``GET /``): one self-contained HTML page (inline script
and CSS, nothing loaded from elsewhere) that lists the loaded models (``/v1/models``) and sends
what is typed, or an image dropped on it, to the chosen model's endpoint: translations,
continuations, nearest-sentence similarities (the first line against the others), labels, or
masked tokens. A bearer token, when the service needs one, is typed into the page and sent with
every call. The page itself holds no data and is served without the token.

After a translation, when the model serves ``/v1/attention``, the page asks for the
encoder–decoder attention of the answer (the first line's source and its translation as the
target, the maps ``aiayn attention`` captures; where the answer, tokenized again, has more tokens
than a map's side, the model's own greedy translation, as the maps' lines then say) and draws
it with the attention page's head view (:mod:`aiayn.visualization.head_view`: its style, markup
and script, unchanged) in an inline frame of its own, built in the browser from the answer's
JSON: every head of a layer at once, a line from each decoder input to each source token it
attends to.

The script exposes ``window.aiaynPlayground`` (``models()``, ``choose(name)``, ``run()``,
``output()``, ``attention()``: the drawn maps' token counts) for the headless-browser test.
"""

from __future__ import annotations

import json

from aiayn.visualization.head_view import (
    HEAD_VIEW_SCRIPT,
    HEAD_VIEW_STYLE,
    HEAD_VIEW_THRESHOLD,
    head_view_section,
)
from aiayn.visualization.html_report import page_head

_FRAME_HEAD = f"""<!DOCTYPE html>
<html lang="en">
{page_head("Encoder–decoder attention", HEAD_VIEW_STYLE)}
<body>
{head_view_section()}
<script type="application/json" id="attention-data">"""
"""The head view's page up to its data (the attention page's head view, as ``head_view``
writes it)."""

_FRAME_TAIL = f"""</script>
<script>{HEAD_VIEW_SCRIPT}</script>
</body>
</html>
"""


def _js_string(text: str) -> str:
    """``text`` as a JavaScript string literal that is safe inside a ``<script>`` element."""
    literal = json.dumps(text)
    return literal.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>aiayn serve</title>
<link rel="icon" href="data:,">
<style>
body { font: 15px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 52em; padding: 0 1em; }
textarea { width: 100%; height: 7em; font: inherit; }
#drop { border: 2px dashed #999; padding: 1.5em; text-align: center; color: #555; }
#drop.over { border-color: #06c; color: #06c; }
pre { background: #f4f4f4; padding: 1em; white-space: pre-wrap; min-height: 2em; }
.error { color: #b00; }
label { margin-right: 1em; }
#attention-frame { width: 100%; height: 30em; border: 1px solid #ddd; }
</style></head>
<body>
<h1>aiayn serve</h1>
<p><label>Model <select id="model"></select></label>
<label>Token <input id="token" type="password" placeholder="only if the service needs one">
</label></p>
<p id="hint"></p>
<div id="text-input"><textarea id="text"></textarea></div>
<div id="image-input" hidden><div id="drop">Drop an image here, or
<input id="image" type="file" accept="image/*"></div></div>
<p><button id="run">Run</button> <span id="status"></span></p>
<pre id="out"></pre>
<section id="attention" hidden>
<h2>Encoder–decoder attention of the answer</h2>
<p id="attention-about"></p>
<iframe id="attention-frame" title="encoder–decoder attention"></iframe>
</section>
<script>
(function () {
  "use strict";
  var models = [], current = null, lastOutput = "", file = null;
  var $ = function (id) { return document.getElementById(id); };
  var HINTS = {
    "/v1/translate": "One sentence per line: their translations.",
    "/v1/completions": "A prompt: its continuation.",
    "/v1/embeddings": "First line: a query; the other lines: sentences, ranked by similarity.",
    "/v1/classify": "One text per line: its most probable labels.",
    "/v1/fill-mask": "Texts with the mask token, one per line: the likeliest fillers."
  };
  function endpoint(m) {
    var order = ["/v1/translate", "/v1/completions", "/v1/classify", "/v1/fill-mask",
                 "/v1/embeddings"];
    for (var i = 0; i < order.length; i++) {
      if (m.endpoints.indexOf(order[i]) >= 0) { return order[i]; }
    }
    return null;
  }
  function readsImages(m) { return m.reads === "image"; }
  function headers(json) {
    var h = {};
    if (json) { h["Content-Type"] = "application/json"; }
    if ($("token").value) { h["Authorization"] = "Bearer " + $("token").value; }
    return h;
  }
  function show(text, failed) {
    lastOutput = text;
    $("out").textContent = text;
    $("out").className = failed ? "error" : "";
  }
  function choose(name) {
    current = models.filter(function (m) { return m.id === name; })[0] || null;
    if (!current) { return; }
    $("model").value = name;
    var image = readsImages(current);
    $("image-input").hidden = !image;
    $("text-input").hidden = image;
    $("hint").textContent = image ? "An image: its most probable labels."
                                  : HINTS[endpoint(current)] || "";
  }
  function lines() {
    return $("text").value.split("\\n").map(function (l) { return l.trim(); })
      .filter(function (l) { return l.length > 0; });
  }
  function body(path) {
    var texts = lines();
    if (path === "/v1/translate") { return {model: current.id, texts: texts}; }
    if (path === "/v1/completions") {
      return {model: current.id, prompt: $("text").value.trim(), max_tokens: 32};
    }
    if (path === "/v1/embeddings") { return {model: current.id, input: texts}; }
    if (path === "/v1/classify") { return {model: current.id, texts: texts, top_k: 3}; }
    return {model: current.id, texts: texts, top_k: 5};
  }
  function dot(a, b) {
    var s = 0;
    for (var i = 0; i < a.length; i++) { s += a[i] * b[i]; }
    return s;
  }
  function format(path, req, res) {
    if (path === "/v1/translate") {
      return res.translations.map(function (t) { return t.text; }).join("\\n");
    }
    if (path === "/v1/completions") { return req.prompt + res.choices[0].text; }
    if (path === "/v1/embeddings") {
      var v = res.data.map(function (d) { return d.embedding; });
      var ranked = req.input.slice(1).map(function (t, i) {
        return [dot(v[0], v[i + 1]), t];
      }).sort(function (a, b) { return b[0] - a[0]; });
      return ranked.map(function (r) { return r[0].toFixed(3) + "  " + r[1]; }).join("\\n");
    }
    if (path === "/v1/classify") {
      return res.labels.map(function (row) {
        return row.map(function (l) {
          return l.label + " " + l.probability.toFixed(3);
        }).join("   ");
      }).join("\\n");
    }
    return res.predictions.map(function (text) {
      return text.map(function (mask) {
        return mask.map(function (p) {
          return p.token + " " + p.probability.toFixed(3);
        }).join("   ");
      }).join("\\n");
    }).join("\\n\\n");
  }
  var FRAME_HEAD = /*FRAME_HEAD*/, FRAME_TAIL = /*FRAME_TAIL*/;
  var drawn = null;
  function hideAttention() {
    drawn = null;
    $("attention").hidden = true;
  }
  function frameData(res) {  // the answer's maps in the attention page's data format
    return {
      title: res.title, threshold: /*THRESHOLD*/, marked: "",
      lines: res.lines.map(function (l) { return [l.label, l.text]; }),
      kinds: res.views.map(function (v) {
        return {name: v.name, title: v.title, rows: v.rows, cols: v.cols, axes: v.axis_names,
                layers: v.layers, highlight: [[], []], focus: null};
      })
    };
  }
  function drawAttention(res) {
    var json = JSON.stringify(frameData(res)).replace(/</g, "\\\\u003c")
      .replace(/>/g, "\\\\u003e").replace(/&/g, "\\\\u0026");
    var frame = $("attention-frame");
    $("attention-about").textContent = res.lines.map(function (l) {
      return l.label + ": " + l.text;
    }).join(" \u2014 ");
    $("attention").hidden = false;
    return new Promise(function (resolve) {
      frame.onload = function () {
        var doc = frame.contentDocument;
        if (doc) { frame.style.height = (doc.documentElement.scrollHeight + 20) + "px"; }
        var view = res.views[0];
        drawn = {view: view.name, rows: view.rows.length, cols: view.cols.length,
                 layers: view.layers.length};
        resolve();
      };
      frame.srcdoc = FRAME_HEAD + json + FRAME_TAIL;
    });
  }
  function attention(source, translation) {  // the first line's answer, when the model serves it
    if (current.endpoints.indexOf("/v1/attention") < 0 || !source) { return Promise.resolve(); }
    var b = {model: current.id, text: source, views: ["cross"]};
    if (translation) { b.target = translation; }
    return fetch("/v1/attention", {method: "POST", headers: headers(true), body: JSON.stringify(b)})
      .then(function (r) {
        if (r.status === 413 && b.target !== undefined) {
          // the answer, tokenized again, is longer than a map's side: the model's own greedy
          // translation instead (which the maps name)
          return attention(source, "");
        }
        return r.json().then(function (res) {
          if (!r.ok) {
            show(lastOutput + "\\n(attention: " + (res.error ? res.error.message : r.status) + ")",
                 false);
            return;
          }
          return drawAttention(res);
        });
      });
  }
  function answer(path, req) {
    return function (r) {
      return r.json().then(function (res) {
        if (!r.ok) { show(res.error ? res.error.message : "HTTP " + r.status, true); return; }
        show(format(path, req, res), false);
        if (path === "/v1/translate") {
          return attention(req.texts[0], res.translations[0].text);
        }
      });
    };
  }
  function run() {
    if (!current) { return Promise.resolve(); }
    $("status").textContent = "…";
    hideAttention();
    var done = function () { $("status").textContent = ""; };
    var failed = function (e) { show(String(e), true); done(); };
    if (readsImages(current)) {
      if (!file) { show("choose or drop an image first", true); done(); return Promise.resolve(); }
      var form = new FormData();
      form.append("image", file);
      form.append("model", current.id);
      var req = {model: current.id};
      return fetch("/v1/classify", {method: "POST", headers: headers(false), body: form})
        .then(answer("/v1/classify", req)).then(done, failed);
    }
    var path = endpoint(current), b = body(path);
    return fetch(path, {method: "POST", headers: headers(true), body: JSON.stringify(b)})
      .then(answer(path, b)).then(done, failed);
  }
  function load() {
    return fetch("/v1/models", {headers: headers(false)}).then(function (r) {
      return r.json().then(function (res) {
        if (!r.ok) { show(res.error ? res.error.message : "HTTP " + r.status, true); return; }
        models = res.data;
        $("model").innerHTML = "";
        models.forEach(function (m) {
          var o = document.createElement("option");
          o.value = m.id;
          o.textContent = m.id + " (" + m.family + ": " + m.endpoints.join(", ") + ")";
          $("model").appendChild(o);
        });
        if (models.length) { choose(models[0].id); }
      });
    });
  }
  $("model").addEventListener("change", function () { choose($("model").value); });
  $("token").addEventListener("change", load);
  $("run").addEventListener("click", run);
  $("image").addEventListener("change", function () { file = $("image").files[0] || null; });
  var drop = $("drop");
  drop.addEventListener("dragover", function (e) { e.preventDefault(); drop.className = "over"; });
  drop.addEventListener("dragleave", function () { drop.className = ""; });
  drop.addEventListener("drop", function (e) {
    e.preventDefault();
    drop.className = "";
    file = e.dataTransfer.files[0] || null;
    if (file) { run(); }
  });
  var ready = load();
  window.aiaynPlayground = {
    ready: function () { return ready; },
    models: function () { return models.map(function (m) { return m.id; }); },
    choose: choose,
    run: run,
    output: function () { return lastOutput; },
    attention: function () { return drawn; }
  };
})();
</script>
</body></html>
"""

PAGE = (
    _PAGE.replace("/*FRAME_HEAD*/", _js_string(_FRAME_HEAD))
    .replace("/*FRAME_TAIL*/", _js_string(_FRAME_TAIL))
    .replace("/*THRESHOLD*/", json.dumps(HEAD_VIEW_THRESHOLD))
)
"""The page (``GET /``)."""
