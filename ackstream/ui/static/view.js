// The live view: reads /api/topologies every few seconds and draws each topology
// with plotly.js (served by this same server). ?every=MS sets the interval.
"use strict";

const EVERY_MS = Number(new URLSearchParams(location.search).get("every")) || 2000;
const COLORS = { acked: "#2b8a3e", failed: "#c92a2a", replayed: "#e67700", dead_lettered: "#5f3dc4" };
const LAYOUT = { margin: { l: 50, r: 10, t: 10, b: 40 }, legend: { orientation: "h" }, hovermode: "x unified" };
const CONFIG = { displaylogo: false, responsive: true };

const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));
const ms = (n) => (n === null || n === undefined ? "–" : `${Math.round(n).toLocaleString("en")} ms`);
const when = (t) => new Date(t).toLocaleTimeString();

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function section(name) {
  let el = document.querySelector(`section.topology[data-name="${CSS.escape(name)}"]`);
  if (!el) {
    el = document.getElementById("topology").content.firstElementChild.cloneNode(true);
    el.dataset.name = name;
    el.querySelector(".name").textContent = name;
    el.querySelector(".replay-all").addEventListener("click", () => replayAll(el));
    document.getElementById("topologies").appendChild(el);
  }
  return el;
}

function figures(s) {
  const held = Object.values(s.held || {}).reduce((n, h) => n + h.tuples, 0);
  let lag = null;
  for (const parts of Object.values(s.partitions || {}))
    for (const p of Object.values(parts)) lag = (lag || 0) + p.lag;
  return {
    acked: fmt(s.acked), failed: fmt(s.failed), timed_out: fmt(s.timed_out),
    replayed: fmt(s.replayed), rejected: fmt(s.rejected), dead_lettered: fmt(s.dead_lettered),
    pending: fmt(s.pending), held: s.held ? fmt(held) : "–", lag: fmt(lag),
    p99: s.latency_ms ? ms(s.latency_ms.p99) : "–",
  };
}

function drawStages(el, t) {
  const s = t.status, counts = s.stages || {};
  const failed = s.failed_by_stage || {}, rejected = s.rejected_by_stage || {};
  const body = el.querySelector("table.stages tbody");
  body.replaceChildren();
  const names = [...new Set([...Object.keys(counts), ...Object.keys(failed), ...Object.keys(rejected)])];
  for (const name of names) {
    const row = body.insertRow();
    row.dataset.stage = name;
    cell(row, name);
    cell(row, fmt(counts[name]?.in), "n in");
    cell(row, fmt(counts[name]?.out), "n out");
    cell(row, fmt(failed[name] || 0), "n failed");
    cell(row, fmt(rejected[name] || 0), "n rejected");
    cell(row, s.held && s.held[name] ? fmt(s.held[name].tuples) : "", "n held");
  }
  // the graph as a Sankey diagram: tuples flow along the edges, failures leave them
  const nodes = [...t.graph.nodes];
  const index = (n) => (nodes.includes(n) ? nodes.indexOf(n) : nodes.push(n) - 1);
  const link = { source: [], target: [], value: [], color: [] };
  const add = (a, b, v, color) => {
    if (!v) return;
    link.source.push(index(a)); link.target.push(index(b)); link.value.push(v); link.color.push(color);
  };
  for (const [a, b] of t.graph.edges)
    add(a, b, (a === "spout" ? counts[b]?.in : counts[a]?.out ?? counts[b]?.in) || 0, "#4c6ef544");
  // what a stage read and did not emit: filtered, failed or rejected tuples
  for (const [stage, c] of Object.entries(counts))
    if (c.out !== undefined && c.in > c.out) add(stage, "stopped here", c.in - c.out, "#c92a2a55");
  const plot = el.querySelector(".plot.graph");
  if (!link.value.length) {
    plot.textContent = "no stage counts: Topology(..., stage_counts=True) keeps them in its checkpoint";
    plot.style.height = "auto";
    return;
  }
  plot.style.height = "";
  if (plot.textContent && !plot.data) plot.textContent = "";
  Plotly.react(plot, [{ type: "sankey", arrangement: "snap", node: { label: nodes, pad: 14 }, link }],
    { margin: { l: 5, r: 5, t: 5, b: 5 } }, CONFIG);
}

function drawTimes(el, s) {
  const h = s.history || [];
  const x = h.map((b) => new Date(b.t_ms));
  const line = (key, name) => ({ x, y: h.map((b) => b[key]), name, mode: "lines", line: { color: COLORS[key] } });
  Plotly.react(el.querySelector(".plot.rates"),
    [line("acked", "acked"), line("failed", "failed"), line("replayed", "replayed"), line("dead_lettered", "dead-lettered")],
    { ...LAYOUT, yaxis: { title: { text: "roots/s" }, rangemode: "tozero" } }, CONFIG);
  const pct = (key) => ({ x, y: h.map((b) => b[key]), name: key, mode: "lines+markers", connectgaps: false });
  Plotly.react(el.querySelector(".plot.latency"), [pct("p50"), pct("p90"), pct("p99")],
    { ...LAYOUT, yaxis: { title: { text: "ms" }, rangemode: "tozero" } }, CONFIG);
}

function drawLag(el, s) {
  const names = [], lags = [], body = el.querySelector("table.partitions tbody");
  body.replaceChildren();
  for (const [topic, parts] of Object.entries(s.partitions || {}))
    for (const [p, m] of Object.entries(parts)) {
      const name = `${topic}[${p}]`;
      names.push(name); lags.push(m.lag);
      const row = body.insertRow();
      row.dataset.partition = name;
      cell(row, name); cell(row, fmt(m.end), "n end"); cell(row, fmt(m.committed), "n committed"); cell(row, fmt(m.lag), "n lag");
    }
  Plotly.react(el.querySelector(".plot.lag"), [{ type: "bar", x: names, y: lags, marker: { color: "#1971c2" } }],
    { ...LAYOUT, hovermode: "closest", yaxis: { title: { text: "offsets" }, rangemode: "tozero" } }, CONFIG);
}

function drawLetters(el, t) {
  const d = t.dead_letters;
  el.querySelector(".letters-count").textContent = d.count === null ? "" : `(${fmt(d.count)})`;
  el.querySelector(".letters-where").textContent = d.error ? `could not read them: ${d.error}` : `in ${d.where}`;
  const body = el.querySelector("table.dead-letters tbody");
  body.replaceChildren();
  for (const r of d.rows) {
    const row = body.insertRow();
    row.dataset.letter = r.letter;
    cell(row, `${r.topic}[${r.partition}]@${r.offset}`);
    cell(row, r.attempts, "n");
    cell(row, r.reason || "", "reason");
    cell(row, r.replayed_ms ? when(r.replayed_ms) : "", "replayed");
    const button = document.createElement("button");
    button.textContent = "Replay";
    button.className = "replay";
    button.disabled = !t.can_replay;
    button.addEventListener("click", () => replay(t.name, [r.letter]));
    row.insertCell().appendChild(button);
  }
  const waiting = d.rows.filter((r) => !r.replayed_ms).map((r) => r.letter);
  const all = el.querySelector(".replay-all");
  all.dataset.letters = JSON.stringify(waiting);
  all.disabled = !t.can_replay || !waiting.length;
}

async function replay(topology, letters) {
  const what = letters.length === 1 ? `the dead letter ${letters[0]}` : `${letters.length} dead letters`;
  if (!confirm(`Replay ${what} of ${topology}? Each record is sent again to its source topic.`)) return;
  const answer = await fetch("/api/replay", {
    method: "POST",
    headers: {
      "content-type": "application/json",
      // the server's token, written into the page: only the page itself may replay
      "x-ackstream-token": document.querySelector('meta[name="ackstream-token"]').content,
    },
    body: JSON.stringify({ topology, letters, confirmed: true }),
  });
  const said = await answer.json();
  document.getElementById("said").textContent = answer.ok
    ? `replayed ${said.replayed} of ${topology}` : `replay failed: ${said.error}`;
  load();
}

function replayAll(el) {
  replay(el.dataset.name, JSON.parse(el.querySelector(".replay-all").dataset.letters || "[]"));
}

async function load() {
  let data;
  try {
    data = await (await fetch("/api/topologies", { cache: "no-store" })).json();
  } catch (error) {
    document.getElementById("read").textContent = `could not read: ${error}`;
    return;
  }
  document.title = data.title;
  for (const t of data.topologies) {
    const el = section(t.name);
    const error = el.querySelector(".error");
    error.hidden = !t.error;
    error.textContent = t.error ? `last read failed: ${t.error}` : "";
    if (!t.status) continue;
    el.querySelector(".channel").textContent = t.status.channel;
    for (const [key, text] of Object.entries(figures(t.status)))
      el.querySelector(`[data-figure="${key}"]`).textContent = text;
    drawStages(el, t);
    drawTimes(el, t.status);
    drawLag(el, t.status);
    drawLetters(el, t);
  }
  document.getElementById("read").textContent = `read at ${when(data.read_ms)}, every ${EVERY_MS / 1000} s`;
  document.body.dataset.loaded = String(data.read_ms);
}

load();
setInterval(load, EVERY_MS);
