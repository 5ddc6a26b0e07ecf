"""The entity-highlighting page served at ``/``: one self-contained HTML document (inline CSS and JS, no CDN).

It reads the models and labels from ``/v1/models``, posts to ``/v1/entities`` and highlights the
entities by label, with a legend of the requested labels (entities found per label) and the timing;
an open-label model's labels are typed, any names, its default ones to start from, and a note
says which of them it never trained on.
User text is only ever inserted as DOM text nodes. The API's offsets count code points (Python
``str``) and JavaScript strings are UTF-16, so the page slices the text as an array of code points:
an emoji or a flag before an entity would otherwise shift its highlight.
"""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>padellm-ner</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; padding: 0 1rem; color: #1d232b; }
  h1 { font-size: 1.4rem; margin-bottom: .2rem; }
  p.lead { margin-top: 0; color: #56606b; }
  textarea { width: 100%; min-height: 8rem; font: inherit; padding: .5rem; box-sizing: border-box; }
  fieldset { border: 1px solid #d0d5da; border-radius: 6px; margin: .8rem 0; }
  .row { display: flex; flex-wrap: wrap; gap: 1rem; align-items: center; }
  label { white-space: nowrap; }
  button { font: inherit; padding: .4rem 1.2rem; border-radius: 6px; border: 1px solid #2459a8; background: #2f6fd0; color: #fff; cursor: pointer; }
  button:disabled { opacity: .6; cursor: progress; }
  #result { white-space: pre-wrap; line-height: 2.1; border: 1px solid #d0d5da; border-radius: 6px; padding: .8rem; min-height: 3rem; }
  mark.entity { border-radius: 4px; padding: .1rem .25rem; color: #111; }
  mark.entity .tag { font-size: .65rem; font-weight: 700; margin-left: .3rem; vertical-align: middle; opacity: .8; }
  #legend span { display: inline-block; border-radius: 4px; padding: .1rem .5rem; margin-right: .4rem; font-size: .85rem; }
  #timing { color: #56606b; font-size: .9rem; }
  #error { color: #b3261e; font-weight: 600; }
</style>
</head>
<body>
<h1>padellm-ner</h1>
<p class="lead">Paste a text, pick the labels (or, on an open-label model, name your own) and the strategy, and see the entities.</p>
<form id="form">
  <textarea id="text" placeholder="Angela Merkel visited Paris ." required></textarea>
  <fieldset><legend>Model and strategy</legend>
    <div class="row">
      <label>Model <select id="model"></select></label>
      <label>Strategy <select id="strategy"><option value="padellm" selected>PaDeLLM (parallel)</option><option value="ar">autoregressive</option></select></label>
      <label>API key <input id="apikey" type="password" autocomplete="off" placeholder="if the server needs one"></label>
    </div>
  </fieldset>
  <fieldset><legend>Labels</legend><div id="labels" class="row"></div></fieldset>
  <button id="submit" type="submit">Find entities</button>
</form>
<p id="error" role="alert"></p>
<h2>Entities</h2>
<div id="legend"></div>
<div id="result" aria-live="polite"></div>
<p id="timing"></p>
<p id="note"></p>
<script>
"use strict";
const PALETTE = ["#ffd166", "#8ecae6", "#b8e986", "#f4a3c0", "#cdb4db", "#ffb703", "#90e0ef", "#caffbf", "#ffadad", "#bdb2ff"];
const $ = (id) => document.getElementById(id);
let models = [];

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("apikey").value.trim();
  if (key) { h["X-API-Key"] = key; }
  return h;
}

function colour(labels, label) {
  return PALETTE[Math.max(0, labels.indexOf(label)) % PALETTE.length];
}

function showError(message) { $("error").textContent = message; }

async function call(path, options) {
  const response = await fetch(path, Object.assign({headers: headers()}, options || {}));
  const body = await response.json().catch(() => ({detail: response.statusText}));
  if (!response.ok) {
    const detail = Array.isArray(body.detail) ? body.detail.map((e) => e.msg).join("; ") : body.detail;
    throw new Error(response.status + ": " + detail);
  }
  return body;
}

function currentModel() { return models.find((m) => m.name === $("model").value); }

function showLabels() {
  const box = $("labels");
  box.replaceChildren();
  const model = currentModel();
  if (!model) { return; }
  if (model.open_labels) {  // any names: typed, its default labels to start from
    const item = document.createElement("label");
    const input = document.createElement("input");
    input.id = "own-labels"; input.size = 60; input.value = model.labels.join(", ");
    item.append("Any labels, comma-separated ", input);
    box.append(item);
    return;
  }
  for (const label of model.labels) {
    const item = document.createElement("label");
    const input = document.createElement("input");
    input.type = "checkbox"; input.name = "label"; input.value = label; input.checked = true;
    const swatch = document.createElement("span");
    swatch.textContent = " " + label;
    swatch.style.background = colour(model.labels, label);
    item.append(input, swatch);
    box.append(item);
  }
}

async function loadModels() {
  try {
    const listing = await call("/v1/models");
    models = listing.models;
    const select = $("model");
    select.replaceChildren();
    for (const model of models) {
      const option = document.createElement("option");
      option.value = model.name;
      option.textContent = model.name + " (" + model.language + (model.dev_f1 === null ? "" : ", dev F1 " + model.dev_f1.toFixed(2)) + ")";
      option.selected = model.name === listing.default;
      select.append(option);
    }
    showLabels();
    showError("");
    document.body.dataset.ready = "true";
  } catch (error) { showError("Could not list the models: " + error.message); }
}

function render(text, entities, labels, asked) {
  const result = $("result");
  result.replaceChildren();
  const points = Array.from(text);  // the API's offsets count code points, not UTF-16 units
  const slice = (start, end) => points.slice(start, end).join("");
  let at = 0;
  for (const entity of [...entities].sort((a, b) => a.start - b.start)) {
    if (entity.start < at) { continue; }
    result.append(document.createTextNode(slice(at, entity.start)));
    const mark = document.createElement("mark");
    mark.className = "entity";
    mark.dataset.label = entity.label;
    mark.dataset.start = entity.start;
    mark.dataset.end = entity.end;
    mark.title = entity.label + " (score " + entity.score.toFixed(3) + ")";
    mark.style.background = colour(labels, entity.label);
    const tag = document.createElement("span");
    tag.className = "tag";
    tag.textContent = entity.label;
    mark.append(document.createTextNode(slice(entity.start, entity.end)), tag);
    result.append(mark);
    at = entity.end;
  }
  result.append(document.createTextNode(slice(at)));
  const legend = $("legend");
  legend.replaceChildren();
  for (const label of asked) {
    const swatch = document.createElement("span");
    swatch.dataset.label = label;
    swatch.textContent = label + " (" + entities.filter((e) => e.label === label).length + ")";
    swatch.style.background = colour(labels, label);
    legend.append(swatch);
  }
}

$("model").addEventListener("change", showLabels);
$("apikey").addEventListener("change", loadModels);
$("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("text").value;
  const typed = $("own-labels");
  const labels = typed ? typed.value.split(",").map((name) => name.trim()).filter((name) => name)
                       : [...document.querySelectorAll("input[name=label]:checked")].map((input) => input.value);
  if (labels.length === 0) { showError("Pick at least one label."); return; }
  $("submit").disabled = true;
  document.body.dataset.state = "busy";
  try {
    const answer = await call("/v1/entities", {method: "POST", body: JSON.stringify({text, labels, strategy: $("strategy").value, model: $("model").value})});
    const result = answer.results[0];
    render(text, result.entities, typed ? answer.labels : currentModel().labels, answer.labels);
    $("timing").textContent = result.entities.length + " entities in " + answer.elapsed_ms.toFixed(1) + " ms (engine " +
      result.stats.latency_ms.toFixed(1) + " ms, " + result.stats.forward_passes + " forward passes, " + answer.strategy + ", " + answer.model + ")";
    $("note").textContent = answer.unfamiliar_labels.length === 0 ? "" : answer.model + " never trained on " +
      answer.unfamiliar_labels.map((name) => JSON.stringify(name)).join(", ") + ": it finds such types far less often; " +
      "where a name it trained on fits (trained_names of GET /v1/models), ask that one.";
    showError("");
  } catch (error) { showError(error.message); }
  finally { $("submit").disabled = false; document.body.dataset.state = "done"; }
});
loadModels();
</script>
</body>
</html>
"""
