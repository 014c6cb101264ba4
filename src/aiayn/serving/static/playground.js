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
    return $("text").value.split("\n").map(function (l) { return l.trim(); })
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
      return res.translations.map(function (t) { return t.text; }).join("\n");
    }
    if (path === "/v1/completions") { return req.prompt + res.choices[0].text; }
    if (path === "/v1/embeddings") {
      var v = res.data.map(function (d) { return d.embedding; });
      var ranked = req.input.slice(1).map(function (t, i) {
        return [dot(v[0], v[i + 1]), t];
      }).sort(function (a, b) { return b[0] - a[0]; });
      return ranked.map(function (r) { return r[0].toFixed(3) + "  " + r[1]; }).join("\n");
    }
    if (path === "/v1/classify") {
      return res.labels.map(function (row) {
        return row.map(function (l) {
          return l.label + " " + l.probability.toFixed(3);
        }).join("   ");
      }).join("\n");
    }
    return res.predictions.map(function (text) {
      return text.map(function (mask) {
        return mask.map(function (p) {
          return p.token + " " + p.probability.toFixed(3);
        }).join("   ");
      }).join("\n");
    }).join("\n\n");
  }
  // the head view's page before and after its data: these and the threshold below are put in
  // by aiayn/serving/playground.py at their /*NAME*/ placeholders
  var FRAME_HEAD = /*FRAME_HEAD*/"", FRAME_TAIL = /*FRAME_TAIL*/"";
  var drawn = null;
  function hideAttention() {
    drawn = null;
    $("attention").hidden = true;
  }
  function frameData(res) {  // the answer's maps in the attention page's data format
    return {
      title: res.title, threshold: /*THRESHOLD*/0, marked: "",
      lines: res.lines.map(function (l) { return [l.label, l.text]; }),
      kinds: res.views.map(function (v) {
        return {name: v.name, title: v.title, rows: v.rows, cols: v.cols, axes: v.axis_names,
                layers: v.layers, highlight: [[], []], focus: null};
      })
    };
  }
  function drawAttention(res) {
    var json = JSON.stringify(frameData(res)).replace(/</g, "\\u003c")
      .replace(/>/g, "\\u003e").replace(/&/g, "\\u0026");
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
            show(lastOutput + "\n(attention: " + (res.error ? res.error.message : r.status) + ")",
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
