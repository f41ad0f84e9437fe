// The operators' page (GET / of the page listener, page.h): HTML with its style and script inline, so that it
// needs nothing but this binary (no framework, nothing from a CDN). docs/page.md says what each part shows;
// the data comes from GET /ui/data (format there), polled every 2 s.
#include <string_view>

#include "scheduler/page.h"

namespace tessera::scheduler {

namespace {

constexpr std::string_view kPage = R"TESSERA_PAGE(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Tessera: who holds which GPU</title>
<style>
body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #1d2329; background: #f4f5f7; }
header { background: #1d2329; color: #fff; padding: 8px 16px; display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; }
header h1 { font-size: 16px; margin: 0; }
header .stat b { font-size: 15px; }
main { padding: 8px 16px; }
section { background: #fff; border: 1px solid #d9dde3; border-radius: 4px; margin: 8px 0; padding: 8px 12px; }
h2 { font-size: 14px; margin: 0 0 6px; }
table { border-collapse: collapse; }
td, th { padding: 2px 8px; border-bottom: 1px solid #eceef1; text-align: left; vertical-align: top; }
th { font-weight: 600; color: #555; }
.nodes { display: flex; flex-wrap: wrap; gap: 6px; }
.node { border: 1px solid #cfd4da; border-radius: 3px; padding: 3px 4px; background: #fafbfc; cursor: pointer; }
.node.unschedulable { background: #eee; border-style: dashed; }
.node.selected { outline: 2px solid #2f6fde; }
.node .nn { font-size: 10px; color: #555; white-space: nowrap; max-width: 200px; overflow: hidden; }
.gpus { display: flex; gap: 2px; }
.gpu { width: 14px; height: 34px; position: relative; background: #e4e7eb; border: 1px solid #b9c0c8; }
.gpu.unhealthy { background: repeating-linear-gradient(45deg, #f3c1c1, #f3c1c1 3px, #fff 3px, #fff 6px); }
.gpu .c { position: absolute; left: 0; width: 9px; }
.gpu .m { position: absolute; right: 0; width: 4px; background: #7a8794; }
.gpu .f { position: absolute; left: 0; right: 0; top: 0; height: 3px; background: #e8871e; }
.seg.high { box-shadow: inset 0 0 0 1px #000; }
.legend span { display: inline-block; margin-right: 12px; }
.sw { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
.note { color: #666; }
input { font: inherit; padding: 2px 4px; }
</style>
</head>
<body>
<header>
  <h1>Tessera</h1>
  <span class="stat">nodes <b id="node-count">-</b></span>
  <span class="stat">GPUs <b id="gpu-count">-</b> (<span id="healthy-count">-</span> healthy)</span>
  <span class="stat">compute held <b id="compute-used">-</b></span>
  <span class="stat">memory held <b id="memory-used">-</b></span>
  <span class="stat">fragmentation <b id="fragmentation">-</b></span>
  <span class="stat">policy <span id="policy">-</span></span>
  <span class="stat">updated <span id="updated">never</span></span>
  <span class="stat" id="error"></span>
</header>
<main>
<section>
  <h2>Namespaces</h2>
  <table id="namespaces"><thead><tr><th>namespace</th><th>pods</th><th>compute held (GPUs)</th><th>memory held</th><th>high-priority compute</th></tr></thead><tbody></tbody></table>
</section>
<section>
  <h2>Pending GPU pods</h2>
  <table id="pending"><thead><tr><th>pod</th><th>priority</th><th>asks</th><th>nodes with room</th><th>why it waits</th><th>last filtered</th></tr></thead><tbody></tbody></table>
  <p class="note" id="pending-none">No GPU pod is waiting (as the extender's filter last saw them).</p>
</section>
<section id="detail" hidden>
  <h2 id="detail-title"></h2>
  <table id="tenants"><thead><tr><th>GPU</th><th>model</th><th>pod</th><th>namespace</th><th>priority</th><th>compute</th><th>memory</th><th>fragment</th></tr></thead><tbody></tbody></table>
</section>
<section>
  <h2>Nodes and GPUs</h2>
  <p class="legend note">Each GPU: compute held (left bar, one colour per namespace; outlined: high priority), memory held (right bar),
  and in orange on top the share of its idle compute FGD counts as fragmented. Click a node for its tenants.
  Filter: <input id="filter" placeholder="node name or namespace"></p>
  <div class="nodes" id="nodes"></div>
</section>
<section>
  <h2>DRA claims</h2>
  <p class="note" id="dra"></p>
</section>
</main>
<script>
"use strict";
const state = { data: null, selected: null, filter: "", sigs: new Map(), els: new Map() };
window.tesseraRender = { first: null, last: null, count: 0, fetch: null };

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function pct(thousandths) { return (thousandths / 10).toFixed(thousandths % 10 ? 1 : 0) + "%"; }
function gib(mib) { return mib >= 1024 ? (mib / 1024).toFixed(1) + " GiB" : mib + " MiB"; }
const hues = new Map();
function colour(ns) {
  if (!hues.has(ns)) {
    let h = 0;
    for (const ch of ns) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
    hues.set(ns, "hsl(" + (h % 360) + ",60%,55%)");
  }
  return hues.get(ns);
}
// One tenant as words: what the table and the GPU's tooltip say.
function tenantWords(d, t) {
  const pod = d.pods[t[0]];
  let share = pct(t[2]);
  if (t[3] > t[2]) share += " (asked " + pct(t[3]) + ", compressed)";
  if (pod.compute === "elastic") share += "; elastic: floor " + pct(t[2]) + ", may use idle compute (its use is the node agent's metric)";
  return { pod, share, memory: gib(t[4]) + (t[5] && t[5] !== t[4] ? " (limit " + gib(t[5]) + ")" : "") };
}

function gpuHtml(d, node, g, i) {
  const [model, mem, used, memUsed, healthy, frag, tenants] = g;
  const idle = 1000 - used;
  let title = node.name + " GPU " + i + ": " + d.models[model] + ", " + pct(used) + " compute and " + gib(memUsed) + " of " + gib(mem) + " held";
  if (healthy) title += "; fragment " + (frag / 1000).toFixed(2) + " GPU" + (idle > 0 ? " (" + Math.round(100 * frag / idle) + "% of its idle compute)" : "");
  else title += "; unhealthy";
  let segs = "", y = 0;
  for (const t of tenants) {
    const w = tenantWords(d, t);
    title += "\n" + w.pod.name + " [" + t[1] + "]: " + w.share + ", " + w.memory + ", " + w.pod.priority;
    const h = Math.max(1, Math.round(34 * t[2] / 1000));
    segs += '<div class="c seg' + (w.pod.priority === "high" ? " high" : "") + '" data-pod="' + esc(w.pod.name) +
      '" data-share="' + t[2] + '" style="bottom:' + y + "px;height:" + h + "px;background:" + colour(w.pod.namespace) + '"></div>';
    y += h;
  }
  const mh = mem > 0 ? Math.round(34 * memUsed / mem) : 0;
  const fh = healthy && idle > 0 && frag > 0 ? '<div class="f" style="opacity:' + Math.min(1, frag / idle).toFixed(2) + '"></div>' : "";
  return '<div class="gpu' + (healthy ? "" : " unhealthy") + '" data-gpu="' + i + '" title="' + esc(title) + '">' + segs +
    '<div class="m" style="bottom:0;height:' + mh + 'px"></div>' + fh + "</div>";
}

function nodeHtml(d, node) {
  let html = '<div class="nn">' + esc(node.name) + "</div><div class=\"gpus\">";
  node.gpus.forEach((g, i) => { html += gpuHtml(d, node, g, i); });
  return html + "</div>";
}

function matches(d, node) {
  const f = state.filter;
  if (!f) return true;
  if (node.name.includes(f)) return true;
  return node.gpus.some(g => g[6].some(t => d.pods[t[0]].namespace.includes(f) || d.pods[t[0]].name.includes(f)));
}

function renderNodes(d) {
  const box = document.getElementById("nodes");
  const seen = new Set();
  let prev = null;
  for (const node of d.nodes) {
    if (!matches(d, node)) continue;
    seen.add(node.name);
    // Only what changed is drawn again: a node's element is kept while its data is the same.
    // The node's version changes with every pod placed or gone; fragments change when the policy is rebuilt;
    // a pod's name and binding flag are looked up by index.
    let sig = node.version + "|" + node.schedulable + "|" + node.fragment;
    for (const g of node.gpus) {
      sig += "|" + g[4] + "," + g[5];
      for (const t of g[6]) sig += "," + d.pods[t[0]].uid + (d.pods[t[0]].reserved ? "*" : "");
    }
    let el = state.els.get(node.name);
    if (!el) {
      el = document.createElement("div");
      el.dataset.node = node.name;
      el.addEventListener("click", () => { state.selected = el.dataset.node; renderDetail(state.data); markSelected(); });
      state.els.set(node.name, el);
    }
    if (state.sigs.get(node.name) !== sig) {
      el.className = "node" + (node.schedulable ? "" : " unschedulable") + (state.selected === node.name ? " selected" : "");
      el.title = node.name + ": fragment " + (node.fragment / 1000).toFixed(2) + " GPU" + (node.schedulable ? "" : ", unschedulable");
      el.innerHTML = nodeHtml(d, node);
      state.sigs.set(node.name, sig);
    }
    const want = prev ? prev.nextSibling : box.firstChild;
    if (want !== el) box.insertBefore(el, want);
    prev = el;
  }
  for (const [name, el] of state.els) {
    if (!seen.has(name)) {
      el.remove();
      state.els.delete(name);
      state.sigs.delete(name);
    }
  }
}

function markSelected() {
  for (const [name, el] of state.els) el.classList.toggle("selected", name === state.selected);
}

function renderDetail(d) {
  const box = document.getElementById("detail");
  const node = d && d.nodes.find(n => n.name === state.selected);
  if (!node) { box.hidden = true; return; }
  box.hidden = false;
  document.getElementById("detail-title").textContent = "Node " + node.name + (node.schedulable ? "" : " (unschedulable)") +
    ": fragment " + (node.fragment / 1000).toFixed(2) + " GPU";
  let rows = "";
  node.gpus.forEach((g, i) => {
    const frag = (g[5] / 1000).toFixed(2) + " GPU";
    const free = "free: " + pct(1000 - g[2]) + " compute, " + gib(g[1] - g[3]) + (g[4] ? "" : " (unhealthy)");
    if (g[6].length === 0) rows += "<tr><td>" + i + "</td><td>" + esc(d.models[g[0]]) + '</td><td colspan="5" class="note">' + free + "</td><td>" + frag + "</td></tr>";
    for (const t of g[6]) {
      const w = tenantWords(d, t);
      rows += '<tr data-pod="' + esc(w.pod.name) + '" data-gpu="' + i + '"><td>' + i + "</td><td>" + esc(d.models[g[0]]) + "</td><td>" + esc(w.pod.name) +
        (t[1] ? " [" + esc(t[1]) + "]" : "") + (w.pod.reserved ? " (binding)" : "") + "</td><td>" + esc(w.pod.namespace) + "</td><td>" + w.pod.priority +
        '</td><td class="share">' + esc(w.share) + "</td><td>" + esc(w.memory) + "</td><td>" + frag + "</td></tr>";
    }
  });
  document.querySelector("#tenants tbody").innerHTML = rows;
}

function renderSummary(d) {
  const c = d.cluster;
  document.getElementById("node-count").textContent = c.nodes;
  document.getElementById("gpu-count").textContent = c.gpus;
  document.getElementById("healthy-count").textContent = c.healthyGpus;
  document.getElementById("compute-used").textContent = (c.coresUsed / 1000).toFixed(2) + " of " + c.gpus + " GPUs";
  document.getElementById("memory-used").textContent = gib(c.memoryUsedMiB) + " of " + gib(c.memoryMiB);
  document.getElementById("fragmentation").textContent = (c.fragmentation / 1000).toFixed(2) + " GPU" +
    (c.idle > 0 ? " (" + (100 * c.fragmentation / c.idle).toFixed(1) + "% of idle)" : "") +
    (c.typicalPods ? "" : ", no workload seen yet");
  document.getElementById("policy").textContent = d.policy;
  document.getElementById("updated").textContent = d.generated;
  document.getElementById("dra").textContent = d.dra.note;
  const ns = new Map();
  const podsSeen = new Set();
  for (const node of d.nodes) for (const g of node.gpus) for (const t of g[6]) {
    const pod = d.pods[t[0]];
    const e = ns.get(pod.namespace) || { pods: 0, cores: 0, memory: 0, high: 0 };
    if (!podsSeen.has(t[0])) { podsSeen.add(t[0]); e.pods++; }
    e.cores += t[2]; e.memory += t[4];
    if (pod.priority === "high") e.high += t[2];
    ns.set(pod.namespace, e);
  }
  let rows = "";
  for (const [name, e] of [...ns].sort((a, b) => b[1].cores - a[1].cores)) {
    rows += '<tr data-namespace="' + esc(name) + '"><td><span class="sw" style="background:' + colour(name) + '"></span>' + esc(name) + "</td><td>" + e.pods +
      "</td><td>" + (e.cores / 1000).toFixed(2) + "</td><td>" + gib(e.memory) + "</td><td>" + (e.high / 1000).toFixed(2) + "</td></tr>";
  }
  document.querySelector("#namespaces tbody").innerHTML = rows;
  let pending = "";
  for (const p of d.pending) {
    pending += '<tr data-pod="' + esc(p.name) + '"><td>' + esc(p.name) + "</td><td>" + p.priority + "</td><td>" + p.vgpus + " GPU" +
      (p.cores ? ", " + pct(p.cores) + " compute" : "") + "</td><td>" + p.nodesFit + " of " + p.nodesAsked + '</td><td class="reason">' +
      esc(p.reason) + "</td><td>" + esc(p.lastFiltered) + "</td></tr>";
  }
  document.querySelector("#pending tbody").innerHTML = pending;
  document.getElementById("pending-none").hidden = d.pending.length > 0;
}

function render(d) {
  const t0 = performance.now();
  renderSummary(d);
  renderNodes(d);
  renderDetail(d);
  const ms = performance.now() - t0;
  const r = window.tesseraRender;
  if (r.first === null) r.first = ms;
  r.last = ms;
  r.count++;
  document.body.dataset.renders = r.count;
}

async function refresh() {
  try {
    const t0 = performance.now();
    const res = await fetch("ui/data", { cache: "no-store" });
    if (!res.ok) throw new Error("GET /ui/data answered " + res.status);
    const d = await res.json();
    window.tesseraRender.fetch = performance.now() - t0;
    state.data = d;
    render(d);
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "not updated: " + e.message;
  }
  setTimeout(refresh, 2000);
}
document.getElementById("filter").addEventListener("input", e => {
  state.filter = e.target.value.trim();
  if (state.data) render(state.data);
});
refresh();
</script>
</body>
</html>
)TESSERA_PAGE";

}  // namespace

std::string_view PageHtml() {
  return kPage;
}

}  // namespace tessera::scheduler
